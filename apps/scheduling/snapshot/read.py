"""`snapshot_for_pool`: an immutable picture of one pool, read for one cycle.

It reads a pool in a fixed number of queries (nine, whatever the pool's size: pinned by a test) with
`.values()` rows, because a cycle over a thousand nodes and ten thousand pending tasks must not spend its
budget building model instances. It is a chain of small readers, one per step. What `decide` sees is a
`whalegen.scheduling.Snapshot` (unit-exact: every free unit by id); what the commit needs to
compare-and-set (row ids and versions) rides alongside it in `PoolSnapshot`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import repeat
from operator import itemgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import F, FilteredRelation, FloatField, Q, QuerySet
from django.db.models.fields import TextField
from django.db.models.functions import Cast, Coalesce, Extract

from apps.approvals.models import PriorityOverride
from apps.common import hooks
from apps.common.pipeline import pipelined
from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.holders import live_holders_sql
from apps.scheduling.models import Assignment, Repartition
from apps.scheduling.snapshot.pool import ClaimInfo, GpuInfo, PendingInfo, PoolSnapshot, RunningInfo
from apps.workloads.models import Quota, Task
from whalegen.placement.recarve import IdleMigGpu
from whalegen.placement.repartition import (
    ClaimAction,
    ClaimFacts,
    ClaimVerdict,
    GpuView,
    MigSlot,
    claim_verdict,
)
from whalegen.placement.types import (
    ClusterSnapshot,
    GpuState,
    Isolation,
    NodeState,
    PartitionMode,
    RunningTask,
    TaskPrediction,
    TaskRequest,
    task_request_whole,
)
from whalegen.placement.types import (
    Quota as QuotaState,
)
from whalegen.protocol import PartitionState
from whalegen.scheduling.snapshot import GpuFacts, GpuPicture, UnitFact, gpu_picture
from whalegen.scheduling.types import Claim, FreeUnit, Snapshot

_MODES = {
    Gpu.PartitionMode.WHOLE: PartitionMode.WHOLE,
    Gpu.PartitionMode.MIG: PartitionMode.MIG,
    Gpu.PartitionMode.MPS: PartitionMode.SHARED,
    Gpu.PartitionMode.TIME_SLICE: PartitionMode.SHARED,
}
_ISOLATIONS = {i.value: i for i in Isolation}


def node_name(cluster: str, node: str) -> str:
    """Engine node names: unique across the clusters of a pool and readable in reasons."""
    return f"{cluster}/{node}"


def _expected_runtime_s(
    p50_s: float | None, max_runtime_s: int | None, profile_p50_s: float | None
) -> float | None:
    """How long a task runs once started: its P50 prediction, else its max runtime, else its profile's."""
    if p50_s is not None:
        return p50_s
    if max_runtime_s is not None:
        return float(max_runtime_s)
    return profile_p50_s


def _epoch_s(expression: Any) -> Cast | Any:
    """A timestamp column as seconds since the epoch, computed by the database (see `_submitted_at_s`)."""
    if connection.vendor == "postgresql":
        return Cast(Extract(expression, "epoch"), FloatField())
    return expression


def _submitted_at_s() -> Cast | F:
    """The task's submission time in seconds since the epoch, as the database computes it.

    Django's own timestamptz loader for psycopg is Python (it converts each value to the connection's time
    zone): for the ten thousand pending rows of a large pool that was a fifth of the snapshot's CPU. The
    float the database sends is the same number `datetime.timestamp()` gives (microseconds are exact in
    both, and both round once to the nearest double). SQLite has no epoch extract: it reads the datetime.
    """
    return _epoch_s(F("created_at"))


def _seconds(value: float | datetime) -> float:
    return value.timestamp() if isinstance(value, datetime) else value


def _with_profile_p50(rows: QuerySet[Any], task: str = "") -> QuerySet[Any]:
    """`rows` with the P50 duration of the task's profile (tenant + profile key) as `profile_p50_s`; `task`
    is the path to the task (`"task__"` from an assignment). A LEFT JOIN on the profile's unique (tenant,
    key), so one row at most per task: as a subquery per row it was half the pending read's server time
    (about 17 of 36 ms for 10,000 tasks)."""
    profiles = f"{task}tenant__task_profiles"
    matching = Q(**{f"{profiles}__profile_key": F(f"{task}profile_key")})
    return rows.annotate(task_profile=FilteredRelation(profiles, condition=matching)).annotate(
        profile_p50_s=F("task_profile__duration_p50_s")
    )


# A compute unit's row is a plain tuple in this column order: a large pool has tens of thousands of units,
# and a dict per row was the largest part of reading them. The first six columns are a `FreeUnit`'s fields
# in its order (a free unit is the row's first six: `_FREE_END`); the next six after the id are what
# `gpu_picture` reads of a unit (its shape), so a GPU's shape key is a slice per unit.
_UNIT_COLUMNS = (
    "id",
    "kind",
    "gpu_milli",
    "mem_mib",
    "mig_profile",
    "mig_start",
    "free",
    "gpu_id",
    "task_id",  # the holder: the task whose live assignment lists the unit (`apps.scheduling.holders`)
)
ID, KIND, MILLI, MEM, PROFILE, START, FREE, GPU, TASK = range(len(_UNIT_COLUMNS))
_UnitRow = tuple[Any, ...]
_shape = itemgetter(slice(KIND, FREE + 1))
_unit_id = itemgetter(ID)
_FREE_END = START + 1  # a unit row's first columns are a `FreeUnit`'s fields
_new_tuple = tuple.__new__


@dataclass
class _Reading:
    """What the readers below hand each other while one snapshot is built."""

    pool_id: int
    now: datetime
    names: dict[int, str] = field(default_factory=dict)  # Node.pk → engine node name
    excluded: dict[str, str] = field(default_factory=dict)
    node_rows: list[dict[str, Any]] = field(default_factory=list)
    gpu_rows: list[dict[str, Any]] = field(default_factory=list)
    unit_rows: list[_UnitRow] = field(default_factory=list)
    units_of: dict[int, list[_UnitRow]] = field(default_factory=lambda: defaultdict(list))
    pictures: dict[tuple[object, ...], GpuPicture] = field(default_factory=dict)  # per GPU shape
    gpus_of_node: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    stopping: set[int] = field(default_factory=set)
    stopping_units: set[int] = field(default_factory=set)
    tenant_ids: dict[str, int] = field(default_factory=dict)
    queues: dict[str, tuple[int, int]] = field(default_factory=dict)
    claims: dict[str, list[ClaimInfo]] = field(default_factory=lambda: defaultdict(list))
    claimed_gpus: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    cpu_used: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    mem_used: dict[int, int] = field(default_factory=lambda: defaultdict(int))


def _dicts(columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """`values_list` rows as `values()` would give them: for the reads sent ahead in one pipeline
    (`_sent` gives tuples), whose rows are few and read by name."""
    return [dict(zip(columns, row, strict=True)) for row in rows]


_NODE_COLUMNS = (
    "id",
    "name",
    "cluster__name",
    "cluster__cordoned",
    "state",
    "cpu_milli",
    "mem_mib",
    "version",
)


def _node_rows(r: _Reading) -> QuerySet[Any]:
    """Step 1's read: the pool's nodes in the engine's tie-break order (cluster, then node name)."""
    return (
        Node.objects.filter(pool_id=r.pool_id).order_by("cluster__name", "name").values_list(*_NODE_COLUMNS)
    )


def _read_nodes(r: _Reading, rows: Iterable[tuple[Any, ...]]) -> None:
    """Step 1: nodes; cordoned clusters and nodes that are not ready take nothing new."""
    r.node_rows = _dicts(_NODE_COLUMNS, rows)
    r.names = {row["id"]: node_name(row["cluster__name"], row["name"]) for row in r.node_rows}
    for row in r.node_rows:
        if row["cluster__cordoned"]:
            r.excluded[r.names[row["id"]]] = f"cluster {row['cluster__name']} is cordoned"
        elif row["state"] != Node.State.READY:
            r.excluded[r.names[row["id"]]] = f"node is {row['state']}"


def _sent(rows: QuerySet[Any], *, convert: bool = True) -> Callable[[], Iterable[tuple[Any, ...]]]:
    """Send a `values_list` read now; returns what fetches its rows, as tuples through Django's converters
    (what iterating the queryset gives, without a round trip at the time it is sent), or as the driver
    gives them (`convert=False`: for reads whose columns the driver already gives as Python wants them)."""
    compiler = rows.query.get_compiler(using=rows.db)
    sql, params = compiler.as_sql()
    cursor = connection.cursor()
    cursor.execute(sql, params)

    def fetch() -> Iterable[tuple[Any, ...]]:
        with cursor:
            fetched = cursor.fetchall()
        return compiler.results_iter(results=[fetched], tuple_expected=True) if convert else fetched

    return fetch


def _send_unit_rows(pool_id: int) -> Callable[[], list[_UnitRow]]:
    """Send the read of the pool's units as `_UNIT_COLUMNS` tuples, each with its holder joined from the
    live assignments (one statement: the units hold no holder column of their own); returns what fetches
    the rows."""
    units, gpus, nodes = ComputeUnit._meta.db_table, Gpu._meta.db_table, Node._meta.db_table
    cursor = connection.cursor()
    cursor.execute(
        "SELECT u.id, u.kind, u.gpu_milli, u.mem_mib, u.mig_profile, u.mig_start, h.task_id IS NULL,"
        f" u.gpu_id, h.task_id FROM {units} u JOIN {gpus} g ON g.id = u.gpu_id"
        f" JOIN {nodes} n ON n.id = g.node_id"
        f" LEFT JOIN ({live_holders_sql(of_pool=True)}) h ON h.unit_id = u.id"
        " WHERE n.pool_id = %(pool)s",
        {"pool": pool_id},
    )

    def fetch() -> list[_UnitRow]:
        with cursor:
            rows = cursor.fetchall()
        # In id order, each GPU's units too. Sorted here, not by the server: the rows arrive almost in
        # that order (the units' table is read in its own order), which Python's sort takes in a
        # millisecond or two, where the server's sort of 62,120 joined rows took 25-40 ms of the read.
        rows.sort(key=_unit_id)
        return rows

    return fetch


_GPU_COLUMNS = ("id", "node_id", "index", "model", "mem_mib", "partition_mode", "health", "partition__state")


def _gpu_rows(r: _Reading) -> QuerySet[Any]:
    """Step 2's read: the pool's GPUs, node by node in index order."""
    return Gpu.objects.filter(node__pool_id=r.pool_id).order_by("node_id", "index").values_list(*_GPU_COLUMNS)


def _stopping_rows(r: _Reading) -> QuerySet[Any]:
    """Step 2's second read: the unit ids of assignments released lately whose task's process on that node
    may still run (the agent was told to stop it and has not said it ended)."""
    return hooks.stopping_unit_rows(pool_id=r.pool_id, now=r.now)  # fleet knows which runs may be alive


def _read_gpus(r: _Reading, rows: Iterable[tuple[Any, ...]], stopping: Iterable[tuple[Any, ...]]) -> None:
    """Step 2: GPUs; the units a released task's process may still use, whose GPUs are never re-carved
    under it."""
    r.gpu_rows = _dicts(_GPU_COLUMNS, rows)
    for gpu in r.gpu_rows:
        r.gpus_of_node[gpu["node_id"]].append(gpu)
    r.stopping_units = {u for (unit_ids,) in stopping for u in unit_ids}


def _read_units(r: _Reading, rows: list[_UnitRow]) -> None:
    """Step 2b: the units of each GPU, and the GPUs a stopping task's units are on."""
    r.unit_rows = rows
    for unit in rows:
        r.units_of[unit[GPU]].append(unit)
    # An id of a unit deleted since (re-carved) names no GPU: it was skipped when links were rows too.
    stopping = r.stopping_units
    r.stopping = {unit[GPU] for unit in rows if unit[ID] in stopping} if stopping else set()


_OVERRIDE_COLUMNS = ("id", "queue_id", "task_id", "wanted_priority", "previous_priority")


def _override_rows(r: _Reading) -> QuerySet[Any]:
    """Step 4's read: the approved overrides that matter to the pool now (see `_read_overrides`)."""
    return (
        PriorityOverride.objects.filter(state=PriorityOverride.State.APPROVED)
        .filter(
            Q(queue__pool_id=r.pool_id, expires_at__gt=r.now)
            | Q(task__pool_id=r.pool_id, expires_at__lte=r.now)
        )
        .values_list(*_OVERRIDE_COLUMNS)
    )


def _read_overrides(rows: Iterable[tuple[Any, ...]]) -> Callable[[int, int, int], tuple[int, str]]:
    """Step 4 (read before the tasks it lifts): an approved queue override in force lifts its queue's
    tasks; an approved task override whose term has ended counts as lapsed even before the expiry job has
    written it back. Returns task → (effective priority, the override that set it or "")."""
    override_rows = _dicts(_OVERRIDE_COLUMNS, rows)
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

    return effective


def _running_rows(r: _Reading) -> QuerySet[Any]:
    """Step 3's read: the pool's live assignments with their tasks, as tuples."""
    # Tuples with the start as epoch seconds, as the pending rows: a busy pool has thousands of running
    # tasks, and a dict per row plus Django's timestamptz loader were half of this step's CPU.
    return (
        _with_profile_p50(
            Assignment.objects.filter(released_at__isnull=True, node__pool_id=r.pool_id), "task__"
        )
        .annotate(
            started_s=_epoch_s(Coalesce("task__started_at", "created_at")),
        )
        .values_list(
            "task_id",
            "node_id",
            "borrowed",
            "started_s",
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
            "task__predicted_duration_p50_s",
            "task__max_runtime_s",
            "profile_p50_s",
        )
    )


class _Running(NamedTuple):
    """Step 3's first half: a live assignment's row as `RunningTask` wants it, before the units say what it
    holds."""

    task_pk: int
    node_id: int
    started_s: float
    priority: int
    slug: str
    cpu_milli: int
    host_mem_mib: int
    gpu_mem_mib: int
    preemptible: bool
    borrowed: bool
    charge_milli: int


def _read_running(
    r: _Reading,
    effective: Callable[[int, int, int], tuple[int, str]],
    assignment_rows: Iterable[tuple[Any, ...]],
) -> tuple[list[_Running], dict[str, RunningInfo]]:
    """Step 3: live assignments → node CPU/memory in use, expected ends, and the running tasks but for
    what they hold (`_held_by_running`, once the units are read: this half runs while the server reads
    them)."""
    runs: list[_Running] = []
    info: dict[str, RunningInfo] = {}
    for (
        task_pk,
        node_id,
        borrowed,
        started_s,
        state,
        version,
        tenant_id,
        slug,
        queue_id,
        queue_weight,
        cpu_milli,
        host_mem_mib,
        gpu_mem_mib,
        gpu_count,
        gpu_milli,
        base_priority,
        preemptible,
        p50_s,
        max_runtime_s,
        profile_p50_s,
    ) in assignment_rows:
        r.cpu_used[node_id] += cpu_milli
        r.mem_used[node_id] += host_mem_mib
        started_s = _seconds(started_s)  # SQLite reads the datetime itself (see `_epoch_s`)
        priority, _ = effective(task_pk, queue_id, base_priority)
        r.tenant_ids[slug] = tenant_id
        key = str(task_pk)
        r.queues[key] = (queue_id, queue_weight)
        charge_milli = gpu_count * gpu_milli  # Task.charge_milli
        runs.append(
            _Running(
                task_pk,
                node_id,
                started_s,
                priority,
                slug,
                cpu_milli,
                host_mem_mib,
                gpu_mem_mib or 0,
                preemptible,
                borrowed,
                charge_milli,
            )
        )
        runtime = _expected_runtime_s(p50_s, max_runtime_s, profile_p50_s)
        info[key] = RunningInfo(
            pk=task_pk,
            version=version,
            state=state,
            tenant_id=tenant_id,
            node_id=node_id,
            charge_milli=charge_milli,
            expected_end_s=started_s + runtime if runtime is not None else None,
        )
    return runs, info


def _held_by_running(r: _Reading, runs: list[_Running]) -> list[RunningTask]:
    """Step 3's second half: the running tasks with the GPUs and share each holds, from the units."""
    index_of_gpu = {g["id"]: g["index"] for g in r.gpu_rows}
    held: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # task → GPU index → milli
    # task → (profile, start slice) of the MIG instance it holds, so a trial preemption frees the slices.
    held_mig: dict[int, tuple[str, int]] = {}
    for unit in r.unit_rows:
        if unit[TASK] is not None:
            held[unit[TASK]][index_of_gpu[unit[GPU]]] += unit[MILLI]
            if unit[KIND] == ComputeUnit.Kind.MIG and unit[START] is not None:
                held_mig[unit[TASK]] = (unit[PROFILE], unit[START])
    running: list[RunningTask] = []
    no_mig = (None, None)
    for run in runs:
        by_gpu = held.get(run.task_pk, {})
        mig = held_mig.get(run.task_pk, no_mig)
        running.append(
            RunningTask(
                task_id=str(run.task_pk),
                node=r.names[run.node_id],
                gpu_indexes=tuple(sorted(by_gpu)),
                gpu_milli=max(by_gpu.values()) if by_gpu else 0,
                cpu_milli=run.cpu_milli,
                mem_mib=run.host_mem_mib,
                gpu_mem_mib=run.gpu_mem_mib,
                priority=run.priority,
                tenant=run.slug,
                preemptible=run.preemptible,
                started_at_s=run.started_s,
                borrowed=run.borrowed,
                mig_profile=mig[0],
                mig_start_slice=mig[1],
                charge_milli=run.charge_milli,
            )
        )
    return running


_CLAIM_COLUMNS = (
    "id",
    "task_id",
    "task__state",
    "task__tenant_id",
    "task__gang_id",
    "gpu_id",
    "unit_id",
    "generation",
    "layout",
    "created_at",
    "gpu__partition__state",
    "gpu__partition__generation",
    "gpu__partition__instances",
    "gpu__partition__reason",
    "gpu__partition__reported_at",
)


def _claim_rows(r: _Reading) -> QuerySet[Any]:
    """Step 2b's read: the pool's open repartition claims with their GPU's last partition report."""
    return (
        Repartition.objects.filter(pool_id=r.pool_id, state=Repartition.State.WAITING)
        .order_by("id")
        .values_list(*_CLAIM_COLUMNS)
    )


def _read_claims(r: _Reading, rows: Iterable[tuple[Any, ...]]) -> None:
    """Step 2b: open repartition claims, each with a verdict (bind, wait, give up); the GPU of a live claim
    is nobody else's."""
    claim_rows = _dicts(_CLAIM_COLUMNS, rows)
    if not claim_rows:
        return
    gpu_by_pk = {gpu["id"]: gpu for gpu in r.gpu_rows}
    unit_by_pk = {unit[ID]: unit for unit in r.unit_rows}
    timeout_s = float(settings.WHALEGEN_REPARTITION_TIMEOUT_S)
    other_layout_s = float(settings.WHALEGEN_REPARTITION_OTHER_LAYOUT_S)
    # A task on several GPUs, and a gang, binds whole: one claim given up gives up the others of the same
    # task or gang, so it goes back to pending together and is planned afresh, rather than holding its
    # other GPUs until their own claims time out. Group: the gang (tenant, gang id), else the task.
    group_of: dict[str, tuple[int, str]] = {}
    given_up: dict[tuple[int, str], str] = {}  # group → why one of its claims was given up
    for row in claim_rows:
        key = str(row["task_id"])
        group = (row["task__tenant_id"], row["task__gang_id"]) if row["task__gang_id"] else (0, key)
        group_of[key] = group
        gpu = gpu_by_pk.get(row["gpu_id"])
        if gpu is None:  # the GPU left the pool: only the closing write remains
            given_up.setdefault(group, "its GPU left the pool")
            continue
        name = r.names[gpu["node_id"]]
        unit = unit_by_pk.get(row["unit_id"]) if row["unit_id"] is not None else None
        facts = ClaimFacts(
            task_pending=row["task__state"] == Task.State.PENDING,
            gpu_name=f"GPU {gpu['index']} on {name}",
            layout=tuple(MigSlot(profile, start) for profile, start in row["layout"]),
            generation=row["generation"],
            age_s=(r.now - row["created_at"]).total_seconds(),
            node_schedulable=name not in r.excluded,
            gpu_healthy=gpu["health"] != Gpu.Health.UNHEALTHY,
            unit_free=unit is not None and unit[FREE],
            reported_state=row["gpu__partition__state"],
            reported_generation=row["gpu__partition__generation"],
            reported_slots=frozenset(
                (i.get("profile"), i.get("start")) for i in row["gpu__partition__instances"] or ()
            ),
            reported_reason=row["gpu__partition__reason"] or "",
            reported_age_s=(r.now - row["gpu__partition__reported_at"]).total_seconds()
            if row["gpu__partition__reported_at"] is not None
            else 0.0,
        )
        verdict = claim_verdict(facts, timeout_s=timeout_s, other_layout_s=other_layout_s)
        claim = ClaimInfo(
            pk=row["id"],
            task_key=key,
            node=name,
            gpu_index=gpu["index"],
            unit_id=row["unit_id"],
            slot=MigSlot(unit[PROFILE], unit[START]) if unit is not None else None,
            verdict=verdict,
            gpu_milli=unit[MILLI] if unit is not None else 0,
            gpu_pk=gpu["id"],
        )
        r.claims[key].append(claim)
        if _abandoned(claim):
            given_up.setdefault(group, verdict.reason)
    for key, claims in r.claims.items():
        group = group_of[key]
        if group not in given_up:
            for claim in claims:
                r.claimed_gpus[claim.gpu_pk].append(key)
            continue
        if group[0]:
            why = f"gang {group[1]}: another member's new layout was given up ({given_up[group]})"
        else:
            why = f"another of its new layouts was given up ({given_up[group]})"
        why = why[:500]
        r.claims[key] = [
            c if _abandoned(c) else replace(c, verdict=ClaimVerdict(ClaimAction.ABANDON, why)) for c in claims
        ]


def _abandoned(claim: ClaimInfo) -> bool:
    return claim.verdict.action is ClaimAction.ABANDON


@dataclass
class _Gpus:
    """Step 2c's output: the engine's nodes and the unit-exact facts beside them."""

    nodes: list[NodeState] = field(default_factory=list)
    free_units: dict[tuple[str, int], tuple[FreeUnit, ...]] = field(default_factory=dict)
    node_models: dict[str, str | None] = field(default_factory=dict)
    gpu_infos: dict[tuple[int, int], GpuInfo] = field(default_factory=dict)
    gpu_views: dict[tuple[str, int], GpuView] = field(default_factory=dict)
    idle_mig: dict[tuple[str, int], IdleMigGpu] = field(default_factory=dict)


def _gpu_state(r: _Reading, gpu: dict[str, Any], name: str, out: _Gpus) -> GpuState:
    """One GPU as the engine sees it, with its free units, its view and (if idle MIG) re-carve facts."""
    units = r.units_of[gpu["id"]]
    mode = _MODES[gpu["partition_mode"]]
    healthy = gpu["health"] != Gpu.Health.UNHEALTHY
    stopping = gpu["id"] in r.stopping
    claimed_by = tuple(r.claimed_gpus.get(gpu["id"], ()))
    layout_ok = gpu["partition__state"] in (None, PartitionState.OK)
    key = (name, gpu["index"])
    like: GpuPicture | None = None
    shape: tuple[object, ...] | None = None
    if mode is not PartitionMode.MIG:
        # A fleet is mostly GPUs alike down to their units (same model, same shares, the same ones held):
        # `gpu_picture` runs once per such shape and the others take its answer with their own unit ids
        # and name. MIG GPUs always go through it (their re-carve facts name the node).
        shape = (
            gpu["index"],
            gpu["model"],
            gpu["mem_mib"],
            mode,
            healthy,
            stopping,
            claimed_by,
            layout_ok,
            tuple(map(_shape, units)),
        )
        like = r.pictures.get(shape)
    if like is not None:
        # The alike GPU's answer with this GPU's units and name. Built field by field, not as a new
        # `GpuPicture`: most of a 6,212-GPU pool comes this way, and each frozen dataclass and named tuple
        # built through its constructor cost (tuple.__new__ takes the row's slice as it is).
        state = like.state
        free = (
            tuple([_new_tuple(FreeUnit, u[:_FREE_END]) for u in units if u[FREE]]) if like.free_units else ()
        )
        view = _renamed(like.view, f"GPU {gpu['index']} on {name}")
        idle_mig = None
    else:
        picture = gpu_picture(
            GpuFacts(
                node=name,
                index=gpu["index"],
                model=gpu["model"],
                mem_mib=gpu["mem_mib"],
                mode=mode,
                units=tuple(
                    UnitFact(u[ID], u[KIND], u[MILLI], u[MEM], not u[FREE], u[PROFILE], u[START])
                    for u in units
                ),
                healthy=healthy,
                stopping=stopping,
                claimed_by=claimed_by,
                layout_ok=layout_ok,
            )
        )
        if shape is not None:
            r.pictures[shape] = picture
        state, free, view, idle_mig = picture.state, picture.free_units, picture.view, picture.idle_mig
    out.gpu_infos[(gpu["node_id"], gpu["index"])] = GpuInfo(pk=gpu["id"], unit_count=len(units), view=view)
    out.gpu_views[key] = view
    if free:
        out.free_units[key] = free
    if idle_mig is not None:
        out.idle_mig[key] = idle_mig
    return state


def _renamed(view: GpuView, name: str) -> GpuView:
    """`replace(view, name=name)` without `__init__` (a frozen dataclass sets each field through
    `object.__setattr__`): the same view, still frozen, under another GPU's name."""
    fields = view.__dict__.copy()
    fields["name"] = name
    copy = object.__new__(GpuView)
    object.__setattr__(copy, "__dict__", fields)
    return copy


def _node_model(gpus: list[dict[str, Any]]) -> str | None:
    """The model a node offers: the one most of its GPUs are, the first GPU's on a tie."""
    counts = Counter(gpu["model"] for gpu in gpus)
    return max(counts, key=lambda model: counts[model]) if counts else None


def _read_nodes_state(r: _Reading) -> _Gpus:
    """Step 2c: every node's GPUs as the engine sees them, from units nobody holds."""
    out = _Gpus()
    for row in r.node_rows:
        name = r.names[row["id"]]
        gpus = r.gpus_of_node.get(row["id"], [])
        # The engine wants one model per node: a mixed host (2×H100 + an L40S) offers the GPUs of its most
        # common model (the first's on a tie) and takes work on them; the others wait for a node model
        # that can carry two (docs/scheduling.md, "Not done yet"). Before, the whole node was left out.
        model = _node_model(gpus)
        out.node_models[name] = model
        states = [_gpu_state(r, gpu, name, out) for gpu in gpus if gpu["model"] == model]
        out.nodes.append(
            NodeState(
                name=name,
                cpu_total_milli=row["cpu_milli"],
                cpu_free_milli=max(row["cpu_milli"] - r.cpu_used[row["id"]], 0),
                mem_total_mib=row["mem_mib"],
                mem_free_mib=max(row["mem_mib"] - r.mem_used[row["id"]], 0),
                gpus=tuple(states),
                schedulable=name not in r.excluded,
            )
        )
    return out


class _PendingRow(NamedTuple):
    """A pending task's row as step 5 reads it. The fields are the read's columns, in its order: the read
    selects `_PendingRow._fields` and `_read_pending` reads each row by field name, so a column is added,
    dropped or moved here alone."""

    id: int
    version: int
    tenant_id: int
    tenant__slug: str
    queue_id: int
    queue__weight: int
    cpu_milli: int
    host_mem_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_mem_mib: int | None
    allowed_text: str | None  # allowed_gpu_models as JSON text (see `_pending_rows`)
    gang_id: str
    gang_size: int
    priority: int  # as stored; overrides may lift it (`_read_overrides`)
    preemptible: bool
    isolation: str
    sla_class: str
    submitted: float | datetime  # epoch seconds; a datetime on SQLite (`_submitted_at_s`)
    predicted_duration_p50_s: float | None
    predicted_duration_p90_s: float | None
    predicted_gpu_mem_peak_mib: int | None
    max_runtime_s: int | None
    profile_p50_s: float | None


def _pending_rows(r: _Reading) -> QuerySet[Any]:
    """Step 5's read: the pool's pending tasks, as tuples of `_PendingRow`'s columns."""
    # A requeued task backing off (Task.not_before_at, set by workloads' requeue) is not placed before then.
    return (
        _with_profile_p50(
            Task.objects.filter(
                Q(not_before_at__isnull=True) | Q(not_before_at__lte=r.now),
                pool_id=r.pool_id,
                state=Task.State.PENDING,
            )
        )
        .annotate(
            submitted=_submitted_at_s(),
            # As text, parsed once per distinct list below: a pool's tasks name few model lists, and
            # Django's JSON loader parsed the same few lists ten thousand times.
            allowed_text=Cast("allowed_gpu_models", TextField()),
        )
        # Tuples, not dicts: ten thousand rows of 24 columns.
        .values_list(*_PendingRow._fields)
    )


@dataclass
class _Waiting:
    """Step 5's output: every pending task's request (claimed or not), row facts and expected runtime."""

    requests: list[TaskRequest] = field(default_factory=list)
    info: dict[str, PendingInfo] = field(default_factory=dict)
    runtimes: dict[str, float | None] = field(default_factory=dict)


def _read_pending(
    r: _Reading,
    effective: Callable[[int, int, int], tuple[int, str]],
    pending_rows: Iterable[tuple[Any, ...]],
) -> _Waiting:
    """Step 5: pending tasks. Read before the units and the claims (the server is still joining the units
    meanwhile); `_set_apart_claimed` sorts them by claim afterwards."""
    pending: list[TaskRequest] = []
    info: dict[str, PendingInfo] = {}
    runtimes: dict[str, float | None] = {}
    allowed_of: dict[str | None, frozenset[str]] = {None: frozenset()}
    online = Task.SlaClass.ONLINE
    # Each row becomes a `_PendingRow` as it is: `tuple.__new__` checks nothing, which `_make` would.
    for row in map(_new_tuple, repeat(_PendingRow), pending_rows):
        # The fields read more than once, read once.
        pk, tenant_id, slug = row.id, row.tenant_id, row.tenant__slug
        queue_id, base_priority = row.queue_id, row.priority
        key = str(pk)
        r.tenant_ids[slug] = tenant_id
        r.queues[key] = (queue_id, row.queue__weight)
        priority, source = effective(pk, queue_id, base_priority)
        allowed_text = row.allowed_text
        allowed = allowed_of.get(allowed_text)
        if allowed is None:
            allowed = allowed_of[allowed_text] = frozenset(json.loads(allowed_text) or ())
        gang_id, gpu_count, gpu_milli = row.gang_id, row.gpu_count, row.gpu_milli
        p50_s, mem_peak_mib = row.predicted_duration_p50_s, row.predicted_gpu_mem_peak_mib
        pending.append(
            task_request_whole(
                {
                    "task_id": key,
                    "cpu_milli": row.cpu_milli,
                    "mem_mib": row.host_mem_mib,
                    "num_gpu": gpu_count,
                    "gpu_milli": gpu_milli,
                    "gpu_mem_mib": row.gpu_mem_mib or 0,
                    "allowed_models": allowed,
                    # Gang ids are the tenant's own words: scope them so two tenants' "g1" stay apart.
                    "gang_id": f"{slug}:{gang_id}" if gang_id else None,
                    "gang_size": row.gang_size,
                    "priority": priority,
                    "tenant": slug,
                    "preemptible": row.preemptible,
                    "submitted_at_s": _seconds(row.submitted),
                    "prediction": TaskPrediction(p50_s, row.predicted_duration_p90_s, mem_peak_mib)
                    if p50_s is not None or mem_peak_mib
                    else None,
                    "isolation": _ISOLATIONS[row.isolation],
                    "sla_online": row.sla_class == online,
                    "order_key": None,
                    "profile": None,
                }
            )
        )
        # PendingInfo(pk, version, tenant_id, charge_milli, base_priority, priority_source), without its
        # `__new__`'s Python call: a third of a microsecond a row, what reading the row by name costs.
        info[key] = _new_tuple(
            PendingInfo, (pk, row.version, tenant_id, gpu_count * gpu_milli, base_priority, source)
        )
        runtimes[key] = _expected_runtime_s(p50_s, row.max_runtime_s, row.profile_p50_s)
    return _Waiting(pending, info, runtimes)


def _set_apart_claimed(
    r: _Reading, requests: list[TaskRequest]
) -> tuple[list[TaskRequest], list[TaskRequest]]:
    """The pending requests split in two, each in read order: those the engine plans, and those an open
    claim binds or keeps waiting (a claim given up leaves its task to the engine)."""
    if not r.claims:
        return requests, []
    pending: list[TaskRequest] = []
    held: list[TaskRequest] = []
    for request in requests:
        # A task's claims are given up together (`_read_claims`): the first says for all.
        claims = r.claims.get(request.task_id)
        planned = bool(claims) and not _abandoned(claims[0])
        (held if planned else pending).append(request)
    return pending, held


def _read_quotas(r: _Reading) -> list[QuotaState]:
    """Step 6: quotas of the pool, each with its GPU-hour budget when that is spent this month (one more
    query, only in a pool where some tenant has a budget)."""
    quotas = []
    rows = list(
        Quota.objects.filter(pool_id=r.pool_id).values(
            "tenant_id",
            "tenant__slug",
            "guaranteed_milli",
            "borrow_limit_milli",
            "gpu_mem_limit_mib",
            "budget__gpu_hours",
        )
    )
    limits = {
        row["tenant_id"]: row["budget__gpu_hours"] for row in rows if row["budget__gpu_hours"] is not None
    }
    spent = hooks.budgets_spent(pool_id=r.pool_id, limits=limits, now=r.now)
    for row in rows:
        r.tenant_ids[row["tenant__slug"]] = row["tenant_id"]
        quotas.append(
            QuotaState(
                row["tenant__slug"],
                row["guaranteed_milli"],
                row["borrow_limit_milli"],
                budget_spent=spent.get(row["tenant_id"]),
                gpu_mem_limit_mib=row["gpu_mem_limit_mib"],
            )
        )
    return quotas


def snapshot_for_pool(pool_id: int, now: datetime) -> PoolSnapshot:
    """An immutable picture of one pool for one cycle, in nine queries (see the readers for each step)."""
    r = _Reading(pool_id=pool_id, now=now)
    with pipelined():
        # Three rounds, each sent before the last one's rows are turned into requests and pictures, so the
        # server reads the next round meanwhile. Not all at once: psycopg's fetch in a pipeline waits for
        # every statement sent so far, so the first fetch would wait for the slowest read (the units:
        # 62,120 rows joined to their holders). Round 1 is the small reads the pending rows need (nodes,
        # GPUs, overrides); round 2 the pending rows and the running tasks (a busy pool's 6,780 live
        # assignments with their tasks); round 3 the units and claims, read by the server while this
        # process parses round 2's rows.
        # On PostgreSQL the pending rows' columns come from psycopg as `_read_pending` reads them (the two
        # float columns Django would pass through `float()` once more are double precision already): the
        # converters cost 10,000 calls for nothing.
        # Round 1.
        nodes_sent, gpus_sent = _sent(_node_rows(r)), _sent(_gpu_rows(r))
        stopping_sent, overrides_sent = _sent(_stopping_rows(r)), _sent(_override_rows(r))
        node_rows, gpu_rows = nodes_sent(), gpus_sent()
        stopping_rows, override_rows = stopping_sent(), overrides_sent()
        # Round 2.
        pending_sent = _sent(_pending_rows(r), convert=connection.vendor != "postgresql")
        running_sent = _sent(_running_rows(r))
        _read_nodes(r, node_rows)
        _read_gpus(r, gpu_rows, stopping_rows)
        effective = _read_overrides(override_rows)
        pending_rows, running_rows = pending_sent(), running_sent()
        # Round 3.
        units_sent, claims_sent = _send_unit_rows(pool_id), _sent(_claim_rows(r))
        waiting = _read_pending(r, effective, pending_rows)
        runs, running_info = _read_running(r, effective, running_rows)
        _read_units(r, units_sent())
        running = _held_by_running(r, runs)
        _read_claims(r, claims_sent())
        gpus = _read_nodes_state(r)
    pending, held = _set_apart_claimed(r, waiting.requests)
    quotas = _read_quotas(r)
    cluster = ClusterSnapshot(
        nodes=tuple(gpus.nodes), pending=tuple(pending), running=tuple(running), quotas=tuple(quotas)
    )
    claimed_requests = MappingProxyType({t.task_id: t for t in held})
    pure = Snapshot(
        cluster=cluster,
        free_units=MappingProxyType(gpus.free_units),
        gpu_views=MappingProxyType(gpus.gpu_views),
        idle_mig=MappingProxyType(gpus.idle_mig),
        claims=MappingProxyType(
            {
                key: tuple(
                    Claim(
                        task_id=key,
                        node=c.node,
                        gpu_index=c.gpu_index,
                        unit_id=c.unit_id,
                        slot=c.slot,
                        gpu_milli=c.gpu_milli,
                        action=c.verdict.action,
                        reason=c.verdict.reason,
                    )
                    for c in sorted(claims, key=lambda c: c.gpu_index)
                )
                for key, claims in r.claims.items()
            }
        ),
        claimed_requests=claimed_requests,
        queues=MappingProxyType(r.queues),
        expected_end_s=MappingProxyType({k: v.expected_end_s for k, v in running_info.items()}),
        expected_runtime_s=MappingProxyType(waiting.runtimes),
    )
    return PoolSnapshot(
        pool_id=pool_id,
        now=now,
        cluster=cluster,
        node_ids=MappingProxyType({r.names[row["id"]]: row["id"] for row in r.node_rows}),
        node_versions=MappingProxyType({row["id"]: row["version"] for row in r.node_rows}),
        node_models=MappingProxyType(gpus.node_models),
        pending=MappingProxyType(waiting.info),
        running=MappingProxyType(running_info),
        tenant_ids=MappingProxyType(r.tenant_ids),
        excluded_nodes=MappingProxyType(r.excluded),
        gpus=MappingProxyType(gpus.gpu_infos),
        claims=MappingProxyType({key: tuple(claims) for key, claims in r.claims.items()}),
        claimed_requests=claimed_requests,
        queues=MappingProxyType(r.queues),
        idle_mig=MappingProxyType(gpus.idle_mig),
        pure=pure,
    )
