"""Reads for the scheduling loop: the immutable snapshot a cycle decides on, and cycle records.

`snapshot_for_pool` reads a pool in a fixed number of queries (nine, whatever the pool's size: pinned by
a test) with `.values()` rows, because a cycle over a thousand nodes and ten thousand pending tasks must
not spend its budget building model instances. What the engine sees is a `ClusterSnapshot`; what the
commit needs to compare-and-set (row ids and versions) rides alongside it in `PoolSnapshot`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.db.models import F, Q, QuerySet, Sum

from apps.approvals.models import PriorityOverride
from apps.fleet.models import TaskRun
from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.models import Assignment, Cycle, Repartition
from apps.workloads.models import Quota, Task
from whalegen.gpus.mig import MEMORY_SLICES, mig_profiles
from whalegen.placement.recarve import FreeInstance, IdleMigGpu
from whalegen.placement.repartition import (
    CarvedUnit,
    ClaimAction,
    ClaimFacts,
    ClaimVerdict,
    GpuView,
    MigSlot,
    claim_verdict,
)
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    Isolation,
    NodeState,
    PartitionMode,
    RunningTask,
    TaskPrediction,
    TaskRequest,
)
from whalegen.placement.types import (
    Quota as QuotaState,
)
from whalegen.protocol import PartitionState

ALL_SLICES = (1 << MEMORY_SLICES) - 1
LIVE_STATES = (Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING)

_MODES = {
    Gpu.PartitionMode.WHOLE: PartitionMode.WHOLE,
    Gpu.PartitionMode.MIG: PartitionMode.MIG,
    Gpu.PartitionMode.MPS: PartitionMode.SHARED,
    Gpu.PartitionMode.TIME_SLICE: PartitionMode.SHARED,
}


@dataclass(frozen=True)
class FreeUnit:
    """A compute unit nobody holds, as the snapshot saw it (the commit compares `version`)."""

    unit_id: int
    version: int
    kind: str
    gpu_milli: int
    mem_mib: int
    mig_profile: str
    mig_start: int | None


@dataclass(frozen=True)
class PendingInfo:
    pk: int
    version: int
    tenant_id: int
    charge_milli: int  # what the quota counts: gpu_count × gpu_milli, as asked
    base_priority: int  # Task.priority; the snapshot's TaskRequest carries the effective one
    priority_source: str  # "" or the override that set the effective priority, for the reason text


@dataclass(frozen=True)
class RunningInfo:
    pk: int
    version: int
    state: str
    tenant_id: int
    node_id: int
    charge_milli: int
    # Seconds since the epoch when it is expected to finish (start + P50, else + max runtime); None unknown.
    expected_end_s: float | None


def _empty() -> MappingProxyType[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class GpuInfo:
    """What a repartition needs to know about a GPU (the planner's `GpuView`) and the row to re-carve."""

    pk: int
    unit_count: int
    view: GpuView


@dataclass(frozen=True)
class ClaimInfo:
    """An open repartition claim (a GPU an earlier cycle re-carved for a pending task) and its verdict."""

    pk: int
    task_key: str
    node: str  # engine node name
    gpu_index: int
    unit_id: int | None
    slot: MigSlot | None  # the task's instance in the new layout
    verdict: ClaimVerdict


@dataclass(frozen=True)
class PoolSnapshot:
    pool_id: int
    now: datetime
    cluster: ClusterSnapshot
    node_ids: MappingProxyType[str, int]  # engine node name → Node.pk
    node_versions: MappingProxyType[int, int]
    node_models: MappingProxyType[str, str | None]
    # (Node.pk, GPU index) → units nobody holds there, in id order.
    free_units: MappingProxyType[tuple[int, int], tuple[FreeUnit, ...]]
    pending: MappingProxyType[str, PendingInfo]  # engine task id → row facts
    running: MappingProxyType[str, RunningInfo]
    tenant_ids: MappingProxyType[str, int]  # tenant slug (the engine's tenant name) → Tenant.pk
    excluded_nodes: MappingProxyType[str, str]  # engine node name → why it takes nothing new
    # (Node.pk, GPU index) → the GPU as a repartition sees it.
    gpus: MappingProxyType[tuple[int, int], GpuInfo] = field(default_factory=_empty)
    # Engine task id → its open repartition claim. Tasks with a claim to bind or wait on are not in
    # `cluster.pending` (the engine does not plan them again) and their GPU is full to the engine.
    claims: MappingProxyType[str, ClaimInfo] = field(default_factory=_empty)
    # The requests of the tasks those claims hold (bound or kept waiting outside the engine).
    claimed_requests: MappingProxyType[str, TaskRequest] = field(default_factory=_empty)
    # Engine task id (pending and running) → (Queue.pk, its weight): fair share within a tenant.
    queues: MappingProxyType[str, tuple[int, int]] = field(default_factory=_empty)
    # (engine node name, GPU index) → an idle MIG GPU the cycle may re-carve (as a last resort): the
    # engine first sees only its free carved instances.
    idle_mig: MappingProxyType[tuple[str, int], IdleMigGpu] = field(default_factory=_empty)


def node_name(cluster: str, node: str) -> str:
    """Engine node names: unique across the clusters of a pool and readable in reasons."""
    return f"{cluster}/{node}"


def _expected_end_s(start_s: float, p50_s: float | None, max_runtime_s: int | None) -> float | None:
    if p50_s is not None:
        return start_s + p50_s
    if max_runtime_s is not None:
        return start_s + max_runtime_s
    return None


def snapshot_for_pool(pool_id: int, now: datetime) -> PoolSnapshot:
    """An immutable picture of one pool for one cycle, in nine queries.

    Steps: 1. nodes (cordoned clusters, non-ready nodes and unhealthy GPUs take nothing new);
    2. GPUs and compute units: free milli/memory and MIG slices from units nobody holds; GPUs a stopped
    task's process may still use; open repartition claims and their verdicts; 3. live assignments →
    running tasks, node CPU/memory in use; 4. overrides in force → effective priority; 5. pending tasks;
    6. quotas.
    """
    # 1. Nodes, in the tie-break order the engine uses (cluster, then node name).
    node_rows = list(
        Node.objects.filter(pool_id=pool_id)
        .order_by("cluster__name", "name")
        .values(
            "id", "name", "cluster__name", "cluster__cordoned", "state", "cpu_milli", "mem_mib", "version"
        )
    )
    names = {row["id"]: node_name(row["cluster__name"], row["name"]) for row in node_rows}
    excluded: dict[str, str] = {}
    for row in node_rows:
        if row["cluster__cordoned"]:
            excluded[names[row["id"]]] = f"cluster {row['cluster__name']} is cordoned"
        elif row["state"] != Node.State.READY:
            excluded[names[row["id"]]] = f"node is {row['state']}"

    # 2. GPUs and their units.
    gpu_rows = list(
        Gpu.objects.filter(node__pool_id=pool_id)
        .order_by("node_id", "index")
        .values("id", "node_id", "index", "model", "mem_mib", "partition_mode", "health", "partition__state")
    )
    unit_rows = list(
        ComputeUnit.objects.filter(gpu__node__pool_id=pool_id)
        .order_by("id")
        .values(
            "id", "gpu_id", "kind", "mig_profile", "mig_start", "gpu_milli", "mem_mib", "task_id", "version"
        )
    )
    units_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for unit in unit_rows:
        units_of[unit["gpu_id"]].append(unit)
    gpu_of_unit: dict[int, dict[str, Any]] = {}
    gpus_of_node: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for gpu in gpu_rows:
        gpus_of_node[gpu["node_id"]].append(gpu)
        for unit in units_of[gpu["id"]]:
            gpu_of_unit[unit["id"]] = gpu

    # GPUs whose units a released task's process may still use (the agent was told to stop it and has not
    # said it ended): never re-carved under it.
    horizon = now - timedelta(seconds=settings.WHALEGEN_AGENT_STOP_LIST_S)
    stopping = set(
        ComputeUnit.objects.filter(
            gpu__node__pool_id=pool_id,
            assignments__released_at__gte=horizon,
            assignments__task__runs__state__in=TaskRun.ALIVE,
            assignments__task__runs__node_id=F("gpu__node_id"),
        )
        .values_list("gpu_id", flat=True)
        .distinct()
    )
    # Open repartition claims, with the GPU's last partition report.
    claim_rows = list(
        Repartition.objects.filter(pool_id=pool_id, state=Repartition.State.WAITING)
        .order_by("id")
        .values(
            "id",
            "task_id",
            "task__state",
            "gpu_id",
            "unit_id",
            "generation",
            "layout",
            "created_at",
            "gpu__partition__state",
            "gpu__partition__generation",
            "gpu__partition__instances",
            "gpu__partition__reason",
        )
    )

    # 3. Live assignments: what runs where, and what it holds.
    assignment_rows = list(
        Assignment.objects.filter(released_at__isnull=True, node__pool_id=pool_id).values(
            "task_id",
            "node_id",
            "borrowed",
            "created_at",
            "task__state",
            "task__version",
            "task__tenant_id",
            "task__tenant__slug",
            "task__queue_id",
            "task__queue__weight",
            "task__cpu_milli",
            "task__host_mem_mib",
            "task__gpu_mem_mib",
            "task__gpu_count",
            "task__gpu_milli",
            "task__priority",
            "task__preemptible",
            "task__started_at",
            "task__predicted_duration_p50_s",
            "task__max_runtime_s",
        )
    )
    held: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # task → GPU index → milli
    # task → (profile, start slice) of the MIG instance it holds, so a trial preemption frees the slices.
    held_mig: dict[int, tuple[str, int]] = {}
    for unit in unit_rows:
        if unit["task_id"] is not None:
            held[unit["task_id"]][gpu_of_unit[unit["id"]]["index"]] += unit["gpu_milli"]
            if unit["kind"] == ComputeUnit.Kind.MIG and unit["mig_start"] is not None:
                held_mig[unit["task_id"]] = (unit["mig_profile"], unit["mig_start"])

    # 4. Overrides: an approved queue override in force lifts its queue's tasks; an approved task override
    # whose term has ended counts as lapsed even before the expiry job has written it back.
    override_rows = list(
        PriorityOverride.objects.filter(state=PriorityOverride.State.APPROVED)
        .filter(Q(queue__pool_id=pool_id, expires_at__gt=now) | Q(task__pool_id=pool_id, expires_at__lte=now))
        .values("id", "queue_id", "task_id", "wanted_priority", "previous_priority")
    )
    queue_raise: dict[int, tuple[int, int]] = {}
    task_lapsed: dict[int, tuple[int, int]] = {}
    for row in override_rows:
        if row["queue_id"] is not None:
            best = queue_raise.get(row["queue_id"])
            if best is None or row["wanted_priority"] > best[0]:
                queue_raise[row["queue_id"]] = (row["wanted_priority"], row["id"])
        elif row["previous_priority"] is not None:
            task_lapsed[row["task_id"]] = (row["wanted_priority"], row["previous_priority"])

    def effective(task_id: int, queue_id: int, priority: int) -> tuple[int, str]:
        lapsed = task_lapsed.get(task_id)
        if lapsed is not None and priority == lapsed[0]:
            priority = lapsed[1]
        raised = queue_raise.get(queue_id)
        if raised is not None and raised[0] > priority:
            return raised[0], f"override {raised[1]} on its queue"
        return priority, ""

    cpu_used: dict[int, int] = defaultdict(int)
    mem_used: dict[int, int] = defaultdict(int)
    running: list[RunningTask] = []
    running_info: dict[str, RunningInfo] = {}
    tenant_ids: dict[str, int] = {}
    queues: dict[str, tuple[int, int]] = {}  # engine task id → (queue id, queue weight)
    for row in assignment_rows:
        cpu_used[row["node_id"]] += row["task__cpu_milli"]
        mem_used[row["node_id"]] += row["task__host_mem_mib"]
        by_gpu = held.get(row["task_id"], {})
        indexes = tuple(sorted(by_gpu))
        per_gpu = max(by_gpu.values()) if by_gpu else 0
        started = row["task__started_at"] or row["created_at"]
        priority, _ = effective(row["task_id"], row["task__queue_id"], row["task__priority"])
        slug = row["task__tenant__slug"]
        tenant_ids[slug] = row["task__tenant_id"]
        key = str(row["task_id"])
        queues[key] = (row["task__queue_id"], row["task__queue__weight"])
        running.append(
            RunningTask(
                task_id=key,
                node=names[row["node_id"]],
                gpu_indexes=indexes,
                gpu_milli=per_gpu,
                cpu_milli=row["task__cpu_milli"],
                mem_mib=row["task__host_mem_mib"],
                gpu_mem_mib=row["task__gpu_mem_mib"] or 0,
                priority=priority,
                tenant=slug,
                preemptible=row["task__preemptible"],
                started_at_s=started.timestamp(),
                borrowed=row["borrowed"],
                mig_profile=held_mig.get(row["task_id"], (None, None))[0],
                mig_start_slice=held_mig.get(row["task_id"], (None, None))[1],
            )
        )
        running_info[key] = RunningInfo(
            pk=row["task_id"],
            version=row["task__version"],
            state=row["task__state"],
            tenant_id=row["task__tenant_id"],
            node_id=row["node_id"],
            charge_milli=row["task__gpu_count"] * row["task__gpu_milli"],
            expected_end_s=_expected_end_s(
                started.timestamp(), row["task__predicted_duration_p50_s"], row["task__max_runtime_s"]
            ),
        )

    # Claims: a verdict for each (bind, wait, give up); the GPU of a live claim is nobody else's.
    gpu_by_pk = {gpu["id"]: gpu for gpu in gpu_rows}
    unit_by_pk = {unit["id"]: unit for unit in unit_rows}
    claims: dict[str, ClaimInfo] = {}
    claimed_gpus: dict[int, list[str]] = defaultdict(list)
    timeout_s = float(settings.WHALEGEN_REPARTITION_TIMEOUT_S)
    for row in claim_rows:
        gpu = gpu_by_pk.get(row["gpu_id"])
        if gpu is None:  # the GPU left the pool: only the closing write remains
            continue
        name = names[gpu["node_id"]]
        gpu_name = f"GPU {gpu['index']} on {name}"
        unit = unit_by_pk.get(row["unit_id"]) if row["unit_id"] is not None else None
        layout = tuple(MigSlot(profile, start) for profile, start in row["layout"])
        facts = ClaimFacts(
            task_pending=row["task__state"] == Task.State.PENDING,
            gpu_name=gpu_name,
            layout=layout,
            generation=row["generation"],
            age_s=(now - row["created_at"]).total_seconds(),
            node_schedulable=name not in excluded,
            gpu_healthy=gpu["health"] != Gpu.Health.UNHEALTHY,
            unit_free=unit is not None and unit["task_id"] is None,
            reported_state=row["gpu__partition__state"],
            reported_generation=row["gpu__partition__generation"],
            reported_slots=frozenset(
                (i.get("profile"), i.get("start")) for i in row["gpu__partition__instances"] or ()
            ),
            reported_reason=row["gpu__partition__reason"] or "",
        )
        verdict = claim_verdict(facts, timeout_s=timeout_s)
        key = str(row["task_id"])
        claims[key] = ClaimInfo(
            pk=row["id"],
            task_key=key,
            node=name,
            gpu_index=gpu["index"],
            unit_id=row["unit_id"],
            slot=MigSlot(unit["mig_profile"], unit["mig_start"]) if unit is not None else None,
            verdict=verdict,
        )
        if verdict.action is not ClaimAction.ABANDON:
            claimed_gpus[gpu["id"]].append(key)

    nodes: list[NodeState] = []
    free_units: dict[tuple[int, int], tuple[FreeUnit, ...]] = {}
    node_models: dict[str, str | None] = {}
    gpu_infos: dict[tuple[int, int], GpuInfo] = {}
    idle_mig: dict[tuple[str, int], IdleMigGpu] = {}
    for row in node_rows:
        name = names[row["id"]]
        gpus = gpus_of_node.get(row["id"], [])
        # The engine wants one model per node; a mixed host offers only its first model's GPUs.
        model = gpus[0]["model"] if gpus else None
        node_models[name] = model
        states: list[GpuState] = []
        for gpu in gpus:
            if gpu["model"] != model:
                excluded.setdefault(name, f"GPU {gpu['index']} is a {gpu['model']} on a {model} node")
                continue
            units = units_of[gpu["id"]]
            free = [u for u in units if u["task_id"] is None]
            usable = gpu["health"] != Gpu.Health.UNHEALTHY
            mode = _MODES[gpu["partition_mode"]]
            claimed_by = tuple(claimed_gpus.get(gpu["id"], ()))
            gpu_infos[(row["id"], gpu["index"])] = GpuInfo(
                pk=gpu["id"],
                unit_count=len(units),
                view=GpuView(
                    name=f"GPU {gpu['index']} on {name}",
                    model=gpu["model"],
                    mode=mode,
                    units=tuple(
                        CarvedUnit(u["mig_profile"], u["mig_start"], u["task_id"] is not None) for u in units
                    ),
                    healthy=usable,
                    stopping=gpu["id"] in stopping,
                    claimed_by=claimed_by,
                ),
            )
            if claimed_by:
                # Promised to the tasks of a repartition: full to the engine, so no one else plans it.
                usable = False
            if gpu["partition__state"] not in (None, PartitionState.OK):
                # The agent could not put the planned layout in place (blocked, needs a reset …): a task
                # bound to it now would be refused on the node. Its next "ok" report frees it.
                usable = False
            free_milli = sum(u["gpu_milli"] for u in free) if usable else 0
            free_mem = sum(u["mem_mib"] for u in free) if usable else 0
            used_slices = 0
            if mode is PartitionMode.MIG:
                # The engine sees the free carved instances only: slices outside them are unusable without
                # a new layout. An idle GPU may still be re-carved, but only for tasks no present unit
                # holds (`whalegen.placement.recarve`, the cycle's second pass).
                open_slices = 0
                if usable:
                    profiles = {p.name: p for p in mig_profiles(gpu["model"])}
                    for u in free:
                        profile = profiles.get(u["mig_profile"])
                        if profile is not None and u["mig_start"] is not None:
                            open_slices |= profile.slice_mask(u["mig_start"])
                used_slices = ALL_SLICES & ~open_slices
                if used_slices == 0:
                    # Carved instances need not add up to 1000 (two 3g on an H100 are 856 milli); a GPU
                    # with every slice free is a fresh GPU to the engine.
                    free_milli = WHOLE_GPU_MILLI
                if usable and len(free) == len(units) and gpu["id"] not in stopping:
                    idle_mig[(name, gpu["index"])] = IdleMigGpu(
                        name,
                        gpu["index"],
                        tuple(
                            FreeInstance(u["mig_profile"], u["mig_start"], u["gpu_milli"], u["mem_mib"])
                            for u in free
                        ),
                    )
            states.append(
                GpuState(
                    index=gpu["index"],
                    model=gpu["model"],
                    free_milli=min(free_milli, WHOLE_GPU_MILLI),
                    free_mem_mib=free_mem,
                    total_mem_mib=gpu["mem_mib"],
                    mode=mode,
                    mig_used_slices=used_slices,
                )
            )
            free_units[(row["id"], gpu["index"])] = tuple(
                FreeUnit(
                    u["id"],
                    u["version"],
                    u["kind"],
                    u["gpu_milli"],
                    u["mem_mib"],
                    u["mig_profile"],
                    u["mig_start"],
                )
                for u in free
            )
        nodes.append(
            NodeState(
                name=name,
                cpu_total_milli=row["cpu_milli"],
                cpu_free_milli=max(row["cpu_milli"] - cpu_used[row["id"]], 0),
                mem_total_mib=row["mem_mib"],
                mem_free_mib=max(row["mem_mib"] - mem_used[row["id"]], 0),
                gpus=tuple(states),
                schedulable=name not in excluded,
            )
        )

    # 5. Pending tasks.
    # A requeued task backing off (Task.not_before_at, set by workloads' requeue) is not placed before then.
    pending_rows = Task.objects.filter(
        Q(not_before_at__isnull=True) | Q(not_before_at__lte=now), pool_id=pool_id, state=Task.State.PENDING
    ).values(
        "id",
        "version",
        "tenant_id",
        "tenant__slug",
        "queue_id",
        "queue__weight",
        "cpu_milli",
        "host_mem_mib",
        "gpu_count",
        "gpu_milli",
        "gpu_mem_mib",
        "allowed_gpu_models",
        "gang_id",
        "gang_size",
        "priority",
        "preemptible",
        "isolation",
        "sla_class",
        "created_at",
        "predicted_duration_p50_s",
        "predicted_duration_p90_s",
        "predicted_gpu_mem_peak_mib",
    )
    pending: list[TaskRequest] = []
    requests_held: list[TaskRequest] = []  # tasks a repartition claim binds or keeps waiting
    pending_info: dict[str, PendingInfo] = {}
    for row in pending_rows:
        key = str(row["id"])
        slug = row["tenant__slug"]
        tenant_ids[slug] = row["tenant_id"]
        queues[key] = (row["queue_id"], row["queue__weight"])
        priority, source = effective(row["id"], row["queue_id"], row["priority"])
        has_prediction = row["predicted_duration_p50_s"] is not None or row["predicted_gpu_mem_peak_mib"]
        claim = claims.get(key)
        planned = claim is not None and claim.verdict.action is not ClaimAction.ABANDON
        (requests_held if planned else pending).append(
            TaskRequest(
                task_id=key,
                cpu_milli=row["cpu_milli"],
                mem_mib=row["host_mem_mib"],
                num_gpu=row["gpu_count"],
                gpu_milli=row["gpu_milli"],
                gpu_mem_mib=row["gpu_mem_mib"] or 0,
                allowed_models=frozenset(row["allowed_gpu_models"] or ()),
                # Gang ids are the tenant's own words: scope them so two tenants' "g1" stay apart.
                gang_id=f"{slug}:{row['gang_id']}" if row["gang_id"] else None,
                gang_size=row["gang_size"],
                priority=priority,
                tenant=slug,
                preemptible=row["preemptible"],
                isolation=Isolation(row["isolation"]),
                sla_online=row["sla_class"] == Task.SlaClass.ONLINE,
                submitted_at_s=row["created_at"].timestamp(),
                prediction=TaskPrediction(
                    row["predicted_duration_p50_s"],
                    row["predicted_duration_p90_s"],
                    row["predicted_gpu_mem_peak_mib"],
                )
                if has_prediction
                else None,
            )
        )
        pending_info[key] = PendingInfo(
            pk=row["id"],
            version=row["version"],
            tenant_id=row["tenant_id"],
            charge_milli=row["gpu_count"] * row["gpu_milli"],
            base_priority=row["priority"],
            priority_source=source,
        )

    # 6. Quotas.
    quotas = []
    for row in Quota.objects.filter(pool_id=pool_id).values(
        "tenant_id", "tenant__slug", "guaranteed_milli", "borrow_limit_milli"
    ):
        tenant_ids[row["tenant__slug"]] = row["tenant_id"]
        quotas.append(QuotaState(row["tenant__slug"], row["guaranteed_milli"], row["borrow_limit_milli"]))

    return PoolSnapshot(
        pool_id=pool_id,
        now=now,
        cluster=ClusterSnapshot(
            nodes=tuple(nodes), pending=tuple(pending), running=tuple(running), quotas=tuple(quotas)
        ),
        node_ids=MappingProxyType({names[row["id"]]: row["id"] for row in node_rows}),
        node_versions=MappingProxyType({row["id"]: row["version"] for row in node_rows}),
        node_models=MappingProxyType(node_models),
        free_units=MappingProxyType(free_units),
        pending=MappingProxyType(pending_info),
        running=MappingProxyType(running_info),
        tenant_ids=MappingProxyType(tenant_ids),
        excluded_nodes=MappingProxyType(excluded),
        gpus=MappingProxyType(gpu_infos),
        claims=MappingProxyType(claims),
        claimed_requests=MappingProxyType({t.task_id: t for t in requests_held}),
        queues=MappingProxyType(queues),
        idle_mig=MappingProxyType(idle_mig),
    )


def cycle_list(*, pool_id: int | None = None) -> QuerySet[Cycle]:
    queryset = Cycle.objects.select_related("pool")
    return queryset if pool_id is None else queryset.filter(pool_id=pool_id)


def live_usage_milli(*, pool_id: int, tenant_ids: list[int]) -> dict[int, int]:
    """What each tenant's live tasks in the pool hold against its quota, as asked (count × milli)."""
    usage: dict[int, int] = defaultdict(int)
    rows = Task.objects.filter(pool_id=pool_id, tenant_id__in=tenant_ids, state__in=LIVE_STATES).values(
        "tenant_id", "gpu_count", "gpu_milli"
    )
    for row in rows:
        usage[row["tenant_id"]] += row["gpu_count"] * row["gpu_milli"]
    return usage


@dataclass(frozen=True)
class QuotaUsage:
    """What a tenant's placed tasks hold in a pool: all of it, and the part held by tasks admitted above
    the guarantee (flagged `borrowed` at admission: the first capacity an owner reclaims). The flag stays
    with the task, so that part can exceed what is above the guarantee now, after earlier tasks ended."""

    in_use_milli: int = 0
    reclaimable_milli: int = 0


def quota_usage(*, tenant_ids: list[int]) -> dict[tuple[int, int], QuotaUsage]:
    """(tenant id, pool id) → usage of tasks admitted, assigned or running (count × milli)."""
    charge = Sum(F("gpu_count") * F("gpu_milli"))
    in_use = (
        Task.objects.filter(tenant_id__in=tenant_ids, state__in=LIVE_STATES)
        .values("tenant_id", "pool_id")
        .annotate(milli=charge)
    )
    reclaimable = (
        Task.objects.filter(
            tenant_id__in=tenant_ids,
            state__in=LIVE_STATES,
            assignments__released_at__isnull=True,
            assignments__borrowed=True,
        )
        .values("tenant_id", "pool_id")
        .annotate(milli=charge)
    )
    usage: dict[tuple[int, int], QuotaUsage] = {}
    for row in in_use:
        usage[(row["tenant_id"], row["pool_id"])] = QuotaUsage(in_use_milli=int(row["milli"] or 0))
    for row in reclaimable:
        key = (row["tenant_id"], row["pool_id"])
        usage[key] = QuotaUsage(
            in_use_milli=usage.get(key, QuotaUsage()).in_use_milli, reclaimable_milli=int(row["milli"] or 0)
        )
    return usage
