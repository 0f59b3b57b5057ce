"""Assignments with the start and release times a test names, on units of every kind.

Accounting reads only assignments, their units and the tasks behind them, so these build those rows
directly (no cycle): the times are then exactly the hand-computed ones.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.models import Assignment
from apps.workloads.models import Queue, Task
from tests.apps.factories import ClusterFactory, NodeFactory

_serial = iter(range(10**9))


def gpu(node: Node, model: str = "H100-80GB", mode: str = Gpu.PartitionMode.WHOLE) -> Gpu:
    n = next(_serial)
    return Gpu.objects.create(
        node=node,
        index=node.gpus.count(),
        uuid=f"GPU-acct-{n}",
        model=model,
        mem_mib=81_559,
        partition_mode=mode,
    )


def whole(g: Gpu) -> ComputeUnit:
    return ComputeUnit.objects.create(gpu=g, kind=ComputeUnit.Kind.WHOLE, gpu_milli=1000, mem_mib=g.mem_mib)


def mig(g: Gpu, profile: str = "3g.40gb", start: int = 0) -> ComputeUnit:
    # gpu_milli as the catalogue rounds it (428 for 3g); accounting must count 3/7, not 0.428.
    slices = int(profile.split("g", 1)[0])
    return ComputeUnit.objects.create(
        gpu=g, kind="mig", mig_profile=profile, mig_start=start, gpu_milli=slices * 1000 // 7, mem_mib=40_192
    )


def share(g: Gpu, milli: int, kind: str = ComputeUnit.Kind.MPS) -> ComputeUnit:
    return ComputeUnit.objects.create(gpu=g, kind=kind, gpu_milli=milli, mem_mib=8_192)


def node_in(pool: Any) -> Node:
    return NodeFactory(pool=pool, cluster=ClusterFactory())


def held(
    queue: Queue,
    units: list[ComputeUnit],
    start: datetime,
    end: datetime | None = None,
    *,
    task: Task | None = None,
    state: str = Task.State.RUNNING,
) -> Assignment:
    """An assignment of `task` (a new one in `queue` by default) holding `units` from `start` until `end`
    (None: still held)."""
    if task is None:
        task = Task.objects.create(
            tenant=queue.tenant,
            queue=queue,
            pool=queue.pool,
            priority=0,
            gpu_count=len(units) if all(u.gpu_milli == 1000 for u in units) else 1,
            gpu_milli=1000 if all(u.gpu_milli == 1000 for u in units) else min(u.gpu_milli for u in units),
            state=state,
        )
    assignment = Assignment.objects.create(task=task, node=units[0].gpu.node, unit_ids=[u.pk for u in units])
    # created_at is auto_now_add: the start is written after.
    Assignment.objects.filter(pk=assignment.pk).update(
        created_at=start, released_at=end, release_reason="finished" if end else ""
    )
    assignment.refresh_from_db()
    return assignment
