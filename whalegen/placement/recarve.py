"""Pieces of re-carving as a last resort, used by `whalegen.scheduling.decide` (its steps 4 and 5).

A re-carve costs minutes of agent work and destroys the GPU's present layout, so a task that a whole GPU,
an MPS share or a free MIG instance can hold this cycle never waits for one: `decide` places on present
units first and opens idle MIG GPUs (the `IdleMigGpu`s of the snapshot) as fresh GPUs only for the tasks
left for capacity (`CAPACITY_OUTCOMES`) that a MIG instance could serve (`can_use_mig`). A task on
several GPUs, and a gang, is re-carved for only when a layout is planned for every GPU it needs.
`with_gpus` opens, closes or restores GPUs in the engine's picture of the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from whalegen.gpus.mig import MEMORY_SLICES
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    GpuState,
    Isolation,
    NodeState,
    Outcome,
    TaskRequest,
)

ALL_SLICES = (1 << MEMORY_SLICES) - 1
GpuKey = tuple[str, int]  # (engine node name, GPU index)
# Outcomes that say "no room now": a re-carve may make room.
CAPACITY_OUTCOMES = frozenset({Outcome.NO_CAPACITY, Outcome.WAITING_FOR_PREEMPTION, Outcome.GANG_UNPLACEABLE})


@dataclass(frozen=True)
class FreeInstance:
    """A carved MIG instance nobody holds."""

    mig_profile: str
    mig_start: int | None
    gpu_milli: int
    mem_mib: int


@dataclass(frozen=True)
class IdleMigGpu:
    """A MIG GPU the cycle may re-carve: healthy, nothing held, no process stopping, not promised."""

    node: str  # engine node name
    index: int
    instances: tuple[FreeInstance, ...]  # its present layout, every instance free


def can_use_mig(task: TaskRequest) -> bool:
    return task.num_gpu > 0 and task.isolation in (Isolation.ANY, Isolation.MIG)


def with_gpus(nodes: Sequence[NodeState], change: Mapping[GpuKey, GpuState | str]) -> tuple[NodeState, ...]:
    """Nodes with some GPUs opened ("open": a fresh GPU, every slice free), closed ("close": full) or put
    back as they were (a `GpuState`)."""
    if not change:
        return tuple(nodes)
    out: list[NodeState] = []
    for node in nodes:
        gpus: list[GpuState] = []
        for gpu in node.gpus:
            how = change.get((node.name, gpu.index))
            if isinstance(how, GpuState):
                gpu = how
            elif how == "open":
                # Any layout may be carved on it: no list of carved instances binds the engine there.
                gpu = replace(
                    gpu,
                    free_milli=WHOLE_GPU_MILLI,
                    free_mem_mib=gpu.total_mem_mib,
                    mig_used_slices=0,
                    mig_free_instances=None,
                )
            elif how == "close":
                closed = () if gpu.mig_free_instances is not None else None
                gpu = replace(
                    gpu, free_milli=0, free_mem_mib=0, mig_used_slices=ALL_SLICES, mig_free_instances=closed
                )
            gpus.append(gpu)
        out.append(replace(node, gpus=tuple(gpus)))
    return tuple(out)
