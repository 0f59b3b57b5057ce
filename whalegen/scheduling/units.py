"""Which free compute units carry a placement: the rule the commit binds by, decided in the pure core.

The engine reasons about a GPU as free milli, free memory and (MIG) free slices; the fleet hands out
units. The two agree on whole GPUs, but not always on shares and MIG instances (the engine may put a
1g request on two slices of a free 3g instance, or a 2g over two adjacent free 1g instances). A
placement is therefore mapped here, GPU by GPU, onto the units the snapshot lists as free; a placement
with no such units is not a decision (`decide` takes it back and tries again elsewhere).

A 10,000-task cycle maps about 7,000 placements onto about 70,000 units: a GPU's units are walked once,
up to the first that covers the ask, and what they hold is added up as they are taken (`decide`
compares it with what the engine took; it used to sum it again from a lookup built over every free unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import NamedTuple

from whalegen.placement.state import Request
from whalegen.placement.types import WHOLE_GPU_MILLI, Isolation, Placement, TaskRequest, UnitKind
from whalegen.scheduling.types import FreeUnit, GpuKey

MIG_KIND = "mig"
# Read in C over a GPU's chosen units (ten MPS shares for a whole GPU): 70,000 units a cycle.
_unit_id = attrgetter("unit_id")
_gpu_milli = attrgetter("gpu_milli")


class Need(NamedTuple):
    """What each GPU of a placement must get: the two fields of its `Request` that binding reads. Built
    per placement (7,000 a large cycle), at a fifth of a `Request`'s cost."""

    gpu_milli: int
    gpu_mem_mib: int

    @staticmethod
    def of(task: TaskRequest) -> Need:
        """As `Request.of(task)` says them (an exclusive task holds the whole card)."""
        if not task.num_gpu:
            return Need(0, 0)
        milli = WHOLE_GPU_MILLI if task.isolation is Isolation.EXCLUSIVE else task.gpu_milli
        return Need(milli, task.gpu_mem_mib)


class Mapped(NamedTuple):
    """The units that carry a placement, and the compute share they hold together."""

    unit_ids: tuple[int, ...]
    gpu_milli: int


def units_for_gpu(
    free: tuple[FreeUnit, ...],
    req: Request | Need,
    placement: Placement,
    taken: set[int],
) -> list[FreeUnit] | None:
    """The units that carry one GPU of `placement`, or None when the free ones cannot.

    MIG: the engine's own instance when it is carved and free, else the smallest free instance with the
    compute share and memory asked for (one instance per placement). Anything else: free units in the
    snapshot's order until the compute share and the memory bound are covered (MPS shares and time
    slices add up; a whole GPU is one unit). Which kind is read off the first unit not taken.
    """
    need_milli, need_mem = req.gpu_milli, req.gpu_mem_mib
    chosen: list[FreeUnit] = []
    any_free = False
    milli = mem = 0
    for u in free:
        if u.unit_id in taken:
            continue
        if not any_free:
            any_free = True
            if u.kind == MIG_KIND:
                return _mig_unit(free, req, placement, taken)
        if milli >= need_milli and mem >= need_mem:
            break
        chosen.append(u)
        milli += u.gpu_milli
        mem += u.mem_mib
    if not any_free:
        return None
    return chosen if milli >= need_milli and mem >= need_mem else None


def _mig_unit(
    free: tuple[FreeUnit, ...], req: Request | Need, placement: Placement, taken: set[int]
) -> list[FreeUnit] | None:
    """`units_for_gpu` on a GPU in MIG mode: one instance."""
    available = [u for u in free if u.unit_id not in taken]
    unit = placement.unit
    if unit.kind is UnitKind.MIG and len(placement.gpu_indexes) == 1:
        for u in available:
            if u.mig_profile == unit.mig_profile and u.mig_start == unit.mig_start_slice:
                return [u]
    big = [u for u in available if u.gpu_milli >= req.gpu_milli and u.mem_mib >= req.gpu_mem_mib]
    return [min(big, key=lambda u: (u.gpu_milli, u.mem_mib, u.unit_id))] if big else None


def map_placement(
    placement: Placement,
    req: Request | Need,
    free_units: Mapping[GpuKey, tuple[FreeUnit, ...]],
    taken: set[int],
) -> Mapped | GpuKey:
    """The units for every GPU of a placement (and `taken` grows by them), or the first GPU that fails."""
    ids: list[int] = []
    milli = 0
    for index in placement.gpu_indexes:
        key = (placement.node, index)
        units = units_for_gpu(free_units.get(key, ()), req, placement, taken)
        if units is None:
            taken.difference_update(ids)
            return key
        got = list(map(_unit_id, units))
        ids += got
        taken.update(got)
        milli += sum(map(_gpu_milli, units))
    return Mapped(tuple(ids), milli)
