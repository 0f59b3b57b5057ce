"""Reads for the agent side of the plane: which node a token is, and what that node should be doing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import F, Max, Min, QuerySet, Value, prefetch_related_objects
from django.db.models.functions import Coalesce

from apps.fleet.models import GpuPartition, GpuSample, JoinToken, NodeJoin, TaskRun
from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool
from apps.scheduling.models import Assignment
from apps.tenants.models import run_uid_refusal
from apps.workloads.models import Queue, Task
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


_NODE_GPUS_SQL = f'SELECT * FROM {Gpu._meta.db_table} WHERE node_id = %s ORDER BY "index"'


def node_gpus(*, node: Node) -> list[Gpu]:
    """The node's GPUs in index order; the compute units of those in MIG and MPS mode prefetched (a MIG
    layout lists its instances, an MPS layout's daemon defaults are its share; whole GPUs and time
    slices need no unit), so a node of whole GPUs costs one query."""
    # Raw SQL: the query is fixed, and compiling it through the ORM cost more than running it (every
    # heartbeat and every long-poll check reads it).
    gpus = list(Gpu.objects.raw(_NODE_GPUS_SQL, [node.pk]))
    carved = (Gpu.PartitionMode.MIG, Gpu.PartitionMode.MPS)
    prefetch_related_objects([gpu for gpu in gpus if gpu.partition_mode in carved], "units")
    return gpus


def parse_run(task_id: str | None, attempt: int = 0) -> tuple[int, int] | None:
    """(task id, attempt) of a run an agent names: the task id and its `attempt` field (protocol 1.1),
    or a 1.0 agent's `<task>.<n>` id. None when it names no task of ours."""
    if not task_id:
        return None
    head, attempt = p.run_of(task_id, attempt)
    return (int(head), attempt) if head.isdigit() else None


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
        return p.GpuLayout(gpu_uuid=gpu.uuid, mode=mode, mps=_mps_defaults(gpu))
    return p.GpuLayout(gpu_uuid=gpu.uuid, mode=mode)


def _mps_defaults(gpu: Gpu) -> p.MpsSpec:
    """The MPS daemon's defaults on an MPS GPU: its largest share (shares are cut equal, so: the share).
    A client's environment can only lower what its server allows (reference §6.3), so with the server's
    default at the unit's share a task that drops its own limits from its environment still gets no
    more than its unit (docs/isolation.md)."""
    shares = [u for u in gpu.units.all() if u.kind == ComputeUnit.Kind.MPS]
    if not shares:
        return p.MpsSpec()
    pcts = [u.mps_thread_pct for u in shares if u.mps_thread_pct]
    mems = [u.mem_mib for u in shares if u.mem_mib]
    return p.MpsSpec(
        default_thread_pct=max(pcts) if pcts else 100, default_pinned_mem_mib=max(mems) if mems else None
    )


def _unit(unit: ComputeUnit) -> p.ComputeUnit:
    if unit.kind == ComputeUnit.Kind.MIG:
        return p.ComputeUnit(kind=p.UnitKind.MIG, mig_profile=unit.mig_profile, mig_start=unit.mig_start)
    if unit.kind == ComputeUnit.Kind.MPS:
        # The unit's memory share becomes the MPS pinned-memory limit: what the task may allocate.
        return p.ComputeUnit(kind=p.UnitKind.MPS, thread_pct=unit.mps_thread_pct, pinned_mem_mib=unit.mem_mib)
    if unit.kind == ComputeUnit.Kind.TIME_SLICE:
        return p.ComputeUnit(kind=p.UnitKind.TIMESLICE, mem_limit_mib=unit.mem_mib)
    return p.ComputeUnit(kind=p.UnitKind.WHOLE)


def _spec(
    task: Task,
    attempt: int,
    units: list[ComputeUnit],
    desired: p.DesiredTaskState,
    *,
    legacy: bool,
    knows_working_dir: bool = True,
    knows_isolation: bool = True,
) -> p.TaskSpec:
    """One run of `task` on its units. `legacy`: the agent speaks protocol 1.0, which has no `attempt`
    field and learns the attempt from the task id (`<task>.<n>`); it also sees only the first GPU.
    `knows_isolation` (1.4): the run carries its runtime, image, tenant, uid/gid and host limits; the
    task's tenant and pool must be loaded with it (select_related), or each spec costs two queries."""
    units = sorted(units, key=lambda u: (u.gpu.index, u.pk))
    # Distinct GPUs in unit order: CUDA_VISIBLE_DEVICES on the agent, device 0 = the first unit's GPU.
    gpu_uuids = tuple(dict.fromkeys(u.gpu.uuid for u in units))
    env = {str(k): str(v) for k, v in (task.env or {}).items()}
    env["WHALEGEN_TASK_ID"] = str(task.pk)
    env["WHALEGEN_ATTEMPT"] = str(attempt)
    env["WHALEGEN_GPU_UUIDS"] = ",".join(gpu_uuids)
    command = tuple(str(a) for a in task.command)
    if task.working_dir and not knows_working_dir:
        command = p.in_directory(task.working_dir, command)
    isolation: dict[str, Any] = {}
    if knows_isolation:
        tenant = task.tenant
        # A uid outside the configured range is sent as none: the agent then refuses the run on a host
        # shared by tenants rather than run it as a uid that may be someone else's (submission refuses
        # such a tenant's tasks; this covers a range changed since).
        uid: int | None = tenant.run_uid_effective
        if run_uid_refusal(uid):
            uid = None
        container = task.runtime == Pool.Runtime.CONTAINER
        isolation = {
            "runtime": p.TaskRuntime(task.runtime),
            "image": task.image if container else "",
            "pull_policy": p.PullPolicy(task.pool.image_pull_policy),
            # The slug: unique and stable, where a display name is neither.
            "tenant": tenant.slug,
            "run_as_uid": uid,
            "run_as_gid": uid,
            "cpu_milli": task.cpu_milli,
            "host_mem_mib": task.host_mem_mib,
            "pids_max": int(settings.WHALEGEN_TASK_PIDS_MAX),
        }
    return p.TaskSpec(
        task_id=p.legacy_run_id(str(task.pk), attempt) if legacy else str(task.pk),
        command=command,
        gpu_uuid=gpu_uuids[0],
        unit=_unit(units[0]),
        env=env,
        max_runtime_s=float(task.max_runtime_s) if task.max_runtime_s else None,
        desired=desired,
        stop_grace_s=float(settings.WHALEGEN_AGENT_STOP_GRACE_S),
        attempt=0 if legacy else attempt,
        gpu_uuids=gpu_uuids,
        working_dir=task.working_dir if knows_working_dir else "",
        **isolation,
    )


def _units_of(assignments: Iterable[Assignment]) -> dict[int, list[ComputeUnit]]:
    """Assignment id → the units it holds that still exist, GPUs loaded, in the units' own order (GPU,
    id: the first unit's GPU is device 0); one query, none when no assignment holds a unit."""
    rows = list(assignments)
    wanted = {unit_id for a in rows for unit_id in a.unit_ids}
    if not wanted:
        return {}
    by_id = {u.pk: u for u in ComputeUnit.objects.select_related("gpu").filter(pk__in=wanted)}
    return {
        a.pk: sorted((by_id[u] for u in a.unit_ids if u in by_id), key=lambda u: (u.gpu_id, u.pk))
        for a in rows
    }


def desired_state_build(
    *,
    node: Node,
    now: datetime,
    agent_protocol: str = p.PROTOCOL_VERSION,
    gpus: list[Gpu] | None = None,
    alive_runs: list[tuple[int, int]] | None = None,
    live: list[Assignment] | None = None,
) -> p.DesiredState:
    """The node's desired state without its generation (0): GPU layouts, then tasks in id order.

    Tasks: every live assignment of a runnable task is `run`; a task whose assignment here was released
    (cancelled, preempted, requeued) while the agent last said it was alive is `stop`. A `run` whose
    units a still-stopping task holds is held back until that task has ended, so two processes never
    share a unit — unless the agent already reported that run started: then it is never taken back.
    Stops are listed for a bounded time; after it the agent still stops the process,
    because a task the desired state no longer lists is stopped. Runs are named for the agent's
    protocol (`agent_protocol`): a 1.0 agent gets the attempt folded into the task id.

    `gpus` (`node_gpus`) and `alive_runs` ((task id, attempt) of its
    starting/running TaskRuns) may be passed by a caller that has just read them (the heartbeat), and
    `live` ([]) by one that knows the node has no unreleased assignment.
    """
    legacy = not p.speaks_attempts(agent_protocol)
    knows_dir = p.speaks_working_dir(agent_protocol)
    knows_isolation = p.speaks_isolation(agent_protocol)
    # 1. Layouts from the GPUs and, for MIG GPUs, their units (one or two queries).
    if gpus is None:
        gpus = node_gpus(node=node)
    layouts = tuple(_layout(gpu) for gpu in gpus)
    # 2. Live assignments with their tasks and units (two queries).
    if live is None:
        live = list(
            Assignment.objects.filter(
                node=node, released_at__isnull=True, task__state__in=RUNNABLE
            ).select_related("task__tenant", "task__pool")
        )
    units_of = _units_of(live)
    # 3. Runs the agent last said are alive that are not the live attempt here: cancelled, preempted,
    # requeued (perhaps handed back to this very node as a new attempt). Their units come from the
    # task's latest released assignment here (two or three queries).
    live_runs = {(a.task_id, a.task.attempts) for a in live}
    if alive_runs is None:
        alive_runs = list(
            TaskRun.objects.filter(node=node, state__in=TaskRun.ALIVE).values_list("task_id", "attempt")
        )
    alive_runs = sorted(alive_runs)
    alive = [run for run in alive_runs if run not in live_runs]
    # Live runs the agent already said it started: never held back (below), whatever a late report says
    # about an older run on their units — leaving one out would make the agent stop it.
    started = live_runs.intersection(alive_runs)
    horizon = now - timedelta(seconds=settings.WHALEGEN_AGENT_STOP_LIST_S)
    released: dict[int, Assignment] = {}
    stopping_query = (
        Assignment.objects.filter(
            node=node, released_at__gte=horizon, task_id__in={task_id for task_id, _ in alive}
        )
        .select_related("task__tenant", "task__pool")
        .order_by("task_id", "-released_at")
    )
    for assignment in stopping_query if alive else ():  # none to stop: not even compiled
        released.setdefault(assignment.task_id, assignment)
    units_of.update(_units_of(released.values()))
    specs: dict[tuple[int, int], p.TaskSpec] = {}
    busy_unit_ids: set[int] = set()
    for task_id, attempt in alive:
        stopping = released.get(task_id)
        units = units_of.get(stopping.pk, []) if stopping is not None else []
        if stopping is None or not units:
            continue
        specs[(task_id, attempt)] = _spec(
            stopping.task,
            attempt,
            units,
            p.DesiredTaskState.STOP,
            legacy=legacy,
            knows_working_dir=knows_dir,
            knows_isolation=knows_isolation,
        )
        busy_unit_ids |= {u.pk for u in units}
    for assignment in live:
        units = units_of.get(assignment.pk, [])
        key = (assignment.task_id, assignment.task.attempts)
        if not units or (key not in started and busy_unit_ids & {u.pk for u in units}):
            continue
        # An agent before 1.4 would run an image's argv as a command of its host: a container run is
        # never sent to it (it stays assigned until the agent is upgraded or the task is cancelled).
        if not knows_isolation and assignment.task.runtime == Pool.Runtime.CONTAINER:
            continue
        specs[key] = _spec(
            assignment.task,
            assignment.task.attempts,
            units,
            p.DesiredTaskState.RUN,
            legacy=legacy,
            knows_working_dir=knows_dir,
            knows_isolation=knows_isolation,
        )
    tasks = tuple(specs[key] for key in sorted(specs))
    return p.DesiredState(generation=0, gpus=layouts, tasks=tasks)


# Digests of desired states without tasks (a node with nothing to run: layouts only), by content: the
# heartbeat of an idle node asks for the same one every time, and encoding it cost more than its queries.
_LAYOUT_DIGESTS: dict[tuple[p.GpuLayout, ...], str] = {}
_LAYOUT_DIGESTS_MAX = 4096


def desired_digest(desired: p.DesiredState) -> str:
    memo = not desired.tasks and not desired.allow_mig_mode_change
    if memo and (known := _LAYOUT_DIGESTS.get(desired.gpus)) is not None:
        return known
    body = desired.to_dict()
    body.pop("generation")
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    if memo:
        if len(_LAYOUT_DIGESTS) >= _LAYOUT_DIGESTS_MAX:
            _LAYOUT_DIGESTS.clear()
        _LAYOUT_DIGESTS[desired.gpus] = digest
    return digest


def gpu_partition_applied(*, gpu: Gpu, generation: int) -> bool:
    """True when the node's agent reported the GPU's layout in place for `generation` or later."""
    return GpuPartition.objects.filter(
        gpu=gpu, generation__gte=generation, state=p.PartitionState.OK
    ).exists()


def tasks_idle(*, pool_id: int, now: datetime, after_s: float, util_pct: int, sample_s: float) -> set[int]:
    """Ids of the pool's running tasks whose every GPU stayed below `util_pct` SM utilisation in every
    telemetry sample of the last `after_s` seconds (docs/idle-reclaim.md).

    One grouped query over the GPU samples of the GPUs the tasks' compute units sit on (the units their
    live assignments list), per GPU, then per task over its GPUs. A task counts
    only where the evidence covers the window: it has been running at least `after_s`, its GPUs' samples
    reach back to within two sample intervals of the window's start and forward to within three of now
    (a node whose telemetry stopped is the node-health check's business, not idleness), and no sample
    lacks the figure (NVML reports no utilisation in MIG mode: such a task is never judged idle). On a
    GPU shared by several tasks the figure is the GPU's, so a task idles only when all of them do.
    Queues whose `idle_reclaim` is `off` are not watched.
    """
    since = now - timedelta(seconds=after_s)
    slack = timedelta(seconds=2 * sample_s)
    watched = dict(
        Assignment.objects.filter(
            released_at__isnull=True,
            task__pool_id=pool_id,
            task__state=Task.State.RUNNING,
            task__started_at__lte=since,
        )
        .exclude(task__queue__idle_reclaim=Queue.IdleReclaim.OFF)
        .values_list("task_id", "unit_ids")
    )
    gpu_of = dict(
        ComputeUnit.objects.filter(pk__in={u for ids in watched.values() for u in ids}).values_list(
            "pk", "gpu_id"
        )
    )
    per_gpu = {
        row["gpu_id"]: (row["busiest"], row["first_at"], row["last_at"])
        for row in GpuSample.objects.filter(at__gte=since, gpu_id__in=set(gpu_of.values()))
        .values("gpu_id")
        .annotate(busiest=Max(Coalesce("util_gpu_pct", Value(100))), first_at=Min("at"), last_at=Max("at"))
        .order_by()
    }
    idle: set[int] = set()
    for task_id, unit_ids in watched.items():
        seen = [per_gpu[g] for g in {gpu_of[u] for u in unit_ids if u in gpu_of} if g in per_gpu]
        if not seen:
            continue
        busiest = max(s[0] for s in seen)
        first_at, last_at = min(s[1] for s in seen), max(s[2] for s in seen)
        if busiest < util_pct and first_at <= since + slack and last_at >= now - 1.5 * slack:
            idle.add(task_id)
    return idle


def tasks_busy(*, task_ids: set[int], since: datetime, util_pct: int) -> set[int]:
    """Of `task_ids`, those with a sample at or above `util_pct` SM utilisation on a GPU they hold, at or
    after `since`: the evidence that clears an idle flag. A task whose samples merely stopped (a node
    that went quiet, a demo restarted) has none and keeps its flag (docs/idle-reclaim.md)."""
    held = dict(
        Assignment.objects.filter(released_at__isnull=True, task_id__in=task_ids).values_list(
            "task_id", "unit_ids"
        )
    )
    gpu_of = dict(
        ComputeUnit.objects.filter(pk__in={u for ids in held.values() for u in ids}).values_list(
            "pk", "gpu_id"
        )
    )
    busy_gpus = set(
        GpuSample.objects.filter(at__gte=since, gpu_id__in=set(gpu_of.values()), util_gpu_pct__gte=util_pct)
        .values_list("gpu_id", flat=True)
        .distinct()
    )
    return {task_id for task_id, ids in held.items() if {gpu_of.get(u) for u in ids} & busy_gpus}


# ---------------------------------------------------------------------------------------------- joining


def join_token_list() -> QuerySet[JoinToken]:
    """Every join token, newest first (platform admins only: the caller checks)."""
    return JoinToken.objects.select_related("pool", "cluster").order_by("-created_at", "-id")


def join_token_find(*, ref: str) -> JoinToken | None:
    """A join token by its id, its name or the first characters of its secret (`wgj_…`, as listed)."""
    tokens = join_token_list()
    if ref.isdigit():
        return tokens.filter(pk=int(ref)).first()
    if ref.startswith("wgj_"):
        return tokens.filter(prefix=ref[:12]).first() if len(ref) >= 12 else None
    return tokens.filter(name=ref).first()


def node_join_get(*, node: Node) -> NodeJoin | None:
    return NodeJoin.objects.filter(node=node).select_related("join_token").first()


def join_token_target(*, pool_name: str, cluster_name: str | None) -> tuple[Pool, Cluster]:
    """The pool and cluster a new join token is for. The cluster may be left out when there is one only,
    or when every node of the pool is in one (the usual case: a pool per site)."""
    pool = Pool.objects.filter(name=pool_name).first()
    if pool is None:
        raise ValidationError({"pool": [f"there is no pool {pool_name!r}"]})
    if cluster_name:
        cluster = Cluster.objects.filter(name=cluster_name).first()
        if cluster is None:
            raise ValidationError({"cluster": [f"there is no cluster {cluster_name!r}"]})
        return pool, cluster
    spanned = sorted(Cluster.objects.filter(nodes__pool=pool).distinct().values_list("name", flat=True))
    if len(spanned) == 1:
        return pool, Cluster.objects.get(name=spanned[0])
    every = sorted(Cluster.objects.values_list("name", flat=True))
    if len(every) == 1 and not spanned:
        return pool, Cluster.objects.get(name=every[0])
    raise ValidationError({"cluster": [_which_cluster_text(pool_name, spanned, every)]})


def _which_cluster_text(pool_name: str, spanned: list[str], every: list[str]) -> str:
    """Why the cluster must be named, with the names to choose from (the demo's H100 pool spans two sites,
    and 'there is more than one (or none)' left an operator guessing)."""
    if not every:
        return "there is no cluster yet; make one first (whalegen apply -f with a Cluster document)"
    if spanned:
        return f"pool {pool_name!r} has nodes in {', '.join(spanned)}: name the one the new nodes join"
    return f"pool {pool_name!r} has no nodes yet: name the cluster the new nodes join ({', '.join(every)})"


def node_find(*, ref: str) -> Node | None:
    """A node named as people name it on the command line: CLUSTER/NODE, or its id."""
    nodes = Node.objects.select_related("cluster", "pool")
    if ref.isdigit():
        return nodes.filter(pk=int(ref)).first()
    cluster, slash, name = ref.partition("/")
    return nodes.filter(cluster__name=cluster, name=name).first() if slash else None


def stopping_unit_rows(*, pool_id: int, now: datetime) -> QuerySet[Any]:
    """The unit ids of the pool's assignments released lately whose task's process on that node may still
    run (the agent was told to stop it and has not said it ended): the scheduling snapshot's read, through
    apps.common.hooks.stopping_unit_rows."""
    horizon = now - timedelta(seconds=settings.WHALEGEN_AGENT_STOP_LIST_S)
    return Assignment.objects.filter(
        node__pool_id=pool_id,
        released_at__gte=horizon,
        task__runs__state__in=TaskRun.ALIVE,
        task__runs__node_id=F("node_id"),
    ).values_list("unit_ids")
