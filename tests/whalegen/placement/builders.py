"""Small builders for solver tests: nodes, tasks and snapshots in a line each."""

from __future__ import annotations

from collections.abc import Sequence

from whalegen.placement.types import (
    ClusterSnapshot,
    GpuState,
    NodeState,
    PartitionMode,
    Quota,
    RunningTask,
    Shape,
    ShapeMix,
    TaskRequest,
)

GIB = 1024


def node(
    name: str,
    *,
    model: str = "T4",
    gpus: int = 2,
    cpu: float = 32,
    mem_gib: int = 128,
    free: Sequence[int] | None = None,
    cpu_free: float | None = None,
    mem_free_gib: int | None = None,
    gpu_mem_mib: int = 16 * GIB,
    mode: PartitionMode = PartitionMode.SHARED,
) -> NodeState:
    """A node; `cpu` in cores, `free` the free milli per GPU (all idle by default)."""
    frees = list(free) if free is not None else [1000] * gpus
    return NodeState(
        name,
        int(cpu * 1000),
        int((cpu if cpu_free is None else cpu_free) * 1000),
        mem_gib * GIB,
        (mem_gib if mem_free_gib is None else mem_free_gib) * GIB,
        tuple(GpuState(i, model, f, gpu_mem_mib, gpu_mem_mib, mode) for i, f in enumerate(frees)),
    )


def task(
    task_id: str,
    *,
    cpu: float = 1,
    mem_gib: float = 1,
    gpus: int = 0,
    milli: int = 1000,
    models: Sequence[str] = (),
    **extra: object,
) -> TaskRequest:
    """A task; `milli` is per GPU and ignored for CPU-only tasks (`gpus=0`)."""
    return TaskRequest(
        task_id=task_id,
        cpu_milli=int(cpu * 1000),
        mem_mib=int(mem_gib * GIB),
        num_gpu=gpus,
        gpu_milli=milli if gpus else 0,
        allowed_models=frozenset(models),
        **extra,  # type: ignore[arg-type]
    )


def mix(*weighted: tuple[Shape, float]) -> ShapeMix:
    return ShapeMix(tuple(s for s, _ in weighted), tuple(w for _, w in weighted))


def snapshot(
    nodes: Sequence[NodeState],
    pending: Sequence[TaskRequest] = (),
    *,
    running: Sequence[RunningTask] = (),
    quotas: Sequence[Quota] = (),
    shape_mix: ShapeMix | None = None,
) -> ClusterSnapshot:
    return ClusterSnapshot(tuple(nodes), tuple(pending), tuple(running), tuple(quotas), shape_mix)
