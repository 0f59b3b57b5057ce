"""Reads for the agent side of the plane: which node a token is, and what that node should be doing."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Prefetch

from apps.fleet.models import GpuPartition, TaskRun
from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.models import Assignment
from apps.workloads.models import Task
from whalegen import protocol as p

# Task states in which a live assignment means "run it"; anything else with a live assignment is a
# row some other writer has not released yet, and the agent should not start it.
RUNNABLE = frozenset({Task.State.ASSIGNED, Task.State.RUNNING})

_MODES = {
    Gpu.PartitionMode.WHOLE: p.PartitionMode.WHOLE,
    Gpu.PartitionMode.MIG: p.PartitionMode.MIG,
    Gpu.PartitionMode.MPS: p.PartitionMode.MPS,
    Gpu.PartitionMode.TIME_SLICE: p.PartitionMode.TIMESLICE,
}


def credential_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def node_for_token(*, raw: str) -> Node | None:
    if not raw:
        return None
    return Node.objects.select_related("cluster").filter(agent_credential_hash=credential_hash(raw)).first()


def run_id(task_id: int, attempt: int) -> str:
    """The task id the agent sees: `42` for a first attempt, `42.1`, `42.2` … after requeues.

    The agent never restarts a task id it has seen end while the plane still lists it, so each attempt
    must be a new id to the agent."""
    return str(task_id) if attempt == 0 else f"{task_id}.{attempt}"


def parse_run_id(value: str) -> tuple[int, int] | None:
    """(task id, attempt) from a run id; None when it is not one."""
    head, dot, tail = value.partition(".")
    if not head.isdigit() or (dot and not tail.isdigit()):
        return None
    return int(head), int(tail or 0)


def _layout(gpu: Gpu) -> p.GpuLayout:
    mode = _MODES[Gpu.PartitionMode(gpu.partition_mode)]
    if mode is p.PartitionMode.MIG:
        instances = tuple(
            p.MigInstanceSpec(profile=unit.mig_profile, start=unit.mig_start)
            for unit in sorted(gpu.units.all(), key=lambda u: (u.mig_start or 0, u.mig_profile))
            if unit.kind == ComputeUnit.Kind.MIG
        )
        return p.GpuLayout(gpu_uuid=gpu.uuid, mode=mode, instances=instances)
    if mode is p.PartitionMode.MPS:
        return p.GpuLayout(gpu_uuid=gpu.uuid, mode=mode, mps=p.MpsSpec())
    return p.GpuLayout(gpu_uuid=gpu.uuid, mode=mode)


def _unit(unit: ComputeUnit) -> p.ComputeUnit:
    if unit.kind == ComputeUnit.Kind.MIG:
        return p.ComputeUnit(kind=p.UnitKind.MIG, mig_profile=unit.mig_profile, mig_start=unit.mig_start)
    if unit.kind == ComputeUnit.Kind.MPS:
        # The unit's memory share becomes the MPS pinned-memory limit: what the task may allocate.
        return p.ComputeUnit(kind=p.UnitKind.MPS, thread_pct=unit.mps_thread_pct, pinned_mem_mib=unit.mem_mib)
    if unit.kind == ComputeUnit.Kind.TIME_SLICE:
        return p.ComputeUnit(kind=p.UnitKind.TIMESLICE, mem_limit_mib=unit.mem_mib)
    return p.ComputeUnit(kind=p.UnitKind.WHOLE)


def _spec(task: Task, attempt: int, units: list[ComputeUnit], desired: p.DesiredTaskState) -> p.TaskSpec:
    units = sorted(units, key=lambda u: (u.gpu.index, u.pk))
    env = {str(k): str(v) for k, v in (task.env or {}).items()}
    # The protocol names one GPU per task; a multi-GPU task is told all of them in its environment.
    env["WHALEGEN_TASK_ID"] = str(task.pk)
    env["WHALEGEN_ATTEMPT"] = str(attempt)
    env["WHALEGEN_GPU_UUIDS"] = ",".join(u.gpu.uuid for u in units)
    return p.TaskSpec(
        task_id=run_id(task.pk, attempt),
        command=tuple(str(a) for a in task.command),
        gpu_uuid=units[0].gpu.uuid,
        unit=_unit(units[0]),
        env=env,
        max_runtime_s=float(task.max_runtime_s) if task.max_runtime_s else None,
        desired=desired,
        stop_grace_s=float(settings.WHALEGEN_AGENT_STOP_GRACE_S),
    )


def desired_state_build(*, node: Node, now: datetime) -> p.DesiredState:
    """The node's desired state without its generation (0): GPU layouts, then tasks in id order.

    Tasks: every live assignment of a runnable task is `run`; a task whose assignment here was released
    (cancelled, preempted, requeued) while the agent last said it was alive is `stop`. A `run` whose
    units a still-stopping task holds is held back until that task has ended, so two processes never
    share a unit. Stops are listed for a bounded time; after it the agent still stops the process,
    because a task the desired state no longer lists is stopped.
    """
    # 1. Layouts from the GPUs and their units (two queries).
    gpus = list(Gpu.objects.filter(node=node).prefetch_related("units").order_by("index"))
    layouts = tuple(_layout(gpu) for gpu in gpus)
    # 2. Live assignments with their tasks and units (two queries).
    unit_query = ComputeUnit.objects.select_related("gpu")
    live = list(
        Assignment.objects.filter(node=node, released_at__isnull=True, task__state__in=RUNNABLE)
        .select_related("task")
        .prefetch_related(Prefetch("units", queryset=unit_query))
    )
    # 3. Runs the agent last said are alive that are not the live attempt here: cancelled, preempted,
    # requeued (perhaps handed back to this very node as a new attempt). Their units come from the
    # task's latest released assignment here (two or three queries).
    live_runs = {(a.task_id, a.task.attempts) for a in live}
    alive = [
        (task_id, attempt)
        for task_id, attempt in TaskRun.objects.filter(node=node, state__in=TaskRun.ALIVE)
        .values_list("task_id", "attempt")
        .order_by("task_id", "attempt")
        if (task_id, attempt) not in live_runs
    ]
    horizon = now - timedelta(seconds=settings.WHALEGEN_AGENT_STOP_LIST_S)
    released: dict[int, Assignment] = {}
    for assignment in (
        Assignment.objects.filter(
            node=node, released_at__gte=horizon, task_id__in={task_id for task_id, _ in alive}
        )
        .select_related("task")
        .prefetch_related(Prefetch("units", queryset=unit_query))
        .order_by("task_id", "-released_at")
    ):
        released.setdefault(assignment.task_id, assignment)
    specs: dict[tuple[int, int], p.TaskSpec] = {}
    busy_unit_ids: set[int] = set()
    for task_id, attempt in alive:
        stopping = released.get(task_id)
        units = list(stopping.units.all()) if stopping is not None else []
        if stopping is None or not units:
            continue
        specs[(task_id, attempt)] = _spec(stopping.task, attempt, units, p.DesiredTaskState.STOP)
        busy_unit_ids |= {u.pk for u in units}
    for assignment in live:
        units = list(assignment.units.all())
        if not units or busy_unit_ids & {u.pk for u in units}:
            continue
        key = (assignment.task_id, assignment.task.attempts)
        specs[key] = _spec(assignment.task, assignment.task.attempts, units, p.DesiredTaskState.RUN)
    tasks = tuple(specs[key] for key in sorted(specs))
    return p.DesiredState(generation=0, gpus=layouts, tasks=tasks)


def desired_digest(desired: p.DesiredState) -> str:
    body = desired.to_dict()
    body.pop("generation")
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def gpu_partition_applied(*, gpu: Gpu, generation: int) -> bool:
    """True when the node's agent reported the GPU's layout in place for `generation` or later."""
    return GpuPartition.objects.filter(
        gpu=gpu, generation__gte=generation, state=p.PartitionState.OK
    ).exists()
