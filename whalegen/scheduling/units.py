"""Which free compute units carry a placement: the rule the commit binds by, decided in the pure core.

The engine reasons about a GPU as free milli, free memory and (MIG) free slices; the fleet hands out
units. The two agree on whole GPUs, but not always on shares and MIG instances (the engine may put a
1g request on two slices of a free 3g instance, or a 2g over two adjacent free 1g instances). A
placement is therefore mapped here, GPU by GPU, onto the units the snapshot lists as free; a placement
with no such units is not a decision (`decide` takes it back and tries again elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping

from whalegen.placement.state import Request
from whalegen.placement.types import Placement, UnitKind
from whalegen.scheduling.types import FreeUnit, GpuKey

MIG_KIND = "mig"


def units_for_gpu(
    free: tuple[FreeUnit, ...],
    req: Request,
    placement: Placement,
    taken: set[int],
) -> tuple[FreeUnit, ...] | None:
    """The units that carry one GPU of `placement`, or None when the free ones cannot.

    MIG: the engine's own instance when it is carved and free, else the smallest free instance with the
    compute share and memory asked for (one instance per placement). Anything else: free units in the
    snapshot's order until the compute share and the memory bound are covered (MPS shares and time
    slices add up; a whole GPU is one unit).
    """
    available = [u for u in free if u.unit_id not in taken]
    if not available:
        return None
    if available[0].kind == MIG_KIND:
        unit = placement.unit
        if unit.kind is UnitKind.MIG and len(placement.gpu_indexes) == 1:
            for u in available:
                if u.mig_profile == unit.mig_profile and u.mig_start == unit.mig_start_slice:
                    return (u,)
        big = [u for u in available if u.gpu_milli >= req.gpu_milli and u.mem_mib >= req.gpu_mem_mib]
        return (min(big, key=lambda u: (u.gpu_milli, u.mem_mib, u.unit_id)),) if big else None
    chosen: list[FreeUnit] = []
    milli = mem = 0
    for u in available:
        if milli >= req.gpu_milli and mem >= req.gpu_mem_mib:
            break
        chosen.append(u)
        milli += u.gpu_milli
        mem += u.mem_mib
    return tuple(chosen) if milli >= req.gpu_milli and mem >= req.gpu_mem_mib else None


def map_placement(
    placement: Placement,
    req: Request,
    free_units: Mapping[GpuKey, tuple[FreeUnit, ...]],
    taken: set[int],
) -> tuple[tuple[int, ...], None] | tuple[None, GpuKey]:
    """Unit ids for every GPU of a placement (and `taken` grows by them), or the first GPU that fails."""
    ids: list[int] = []
    for index in placement.gpu_indexes:
        key = (placement.node, index)
        units = units_for_gpu(free_units.get(key, ()), req, placement, taken)
        if units is None:
            taken.difference_update(ids)
            return None, key
        ids += [u.unit_id for u in units]
        taken.update(u.unit_id for u in units)
    return tuple(ids), None
