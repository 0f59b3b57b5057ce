"""The reads behind a pool's history page: what happened over the last hours, in time buckets.

Three sources, each read once over the window and bucketed here (the window holds a few thousand cycle
rows at most, and only the few fields a chart needs are fetched, never a cycle's whole `stats`):
- scheduling cycles: capacity and what stayed idle after each cycle, fragmentation, tasks left pending by
  reason;
- GPU telemetry (`GpuSample`): the mean SM utilisation over the pool's GPUs (what NVML calls busy);
- tasks that started in the window: how long they waited, P50 and P95 per bucket;
- assignments that overlap the window: GPUs each tenant held, per bucket (time-weighted), beside its
  guarantee.
The same reads work on PostgreSQL and on the embedded SQLite (no percentile in SQL).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import quantiles
from typing import TYPE_CHECKING, Any

from django.db.models import Avg, F, FloatField, Func, Sum, Value
from django.db.models.functions import Coalesce, Floor, Greatest, Least, TruncMinute

from apps.fleet.models import GpuSample
from apps.inventory.models import Gpu, Pool
from apps.scheduling.holders import live_holders_sql
from apps.scheduling.models import Assignment, Cycle
from apps.workloads.models import Task

if TYPE_CHECKING:
    from apps.dashboard.whatif import CycleRef

BUCKETS = 48  # points per chart: one per 7.5 minutes over six hours
MAX_CYCLES = 20_000  # newest first; at one cycle every 2 s this is 11 hours
MAX_STARTS = 20_000
TOP_REASONS = 4  # reasons drawn as their own line; the rest are summed into "other"


@dataclass(frozen=True)
class Bucket:
    start: datetime
    allocated_pct: float | None = None
    busy_pct: float | None = None
    fragmented_pct: float | None = None
    pending: float | None = None
    pending_by_reason: tuple[tuple[str, float], ...] = ()
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    started: int = 0


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    guaranteed_milli: int
    held_milli: tuple[float | None, ...]  # per bucket: time-weighted mean milli held


@dataclass(frozen=True)
class PoolHistory:
    pool: Pool
    since: datetime
    until: datetime
    bucket_s: float
    buckets: tuple[Bucket, ...]
    reasons: tuple[str, ...]  # the reasons with a line of their own, largest first
    cycles: int
    tenants: tuple[TenantUsage, ...] = ()


def _index(at: datetime, since: datetime, bucket_s: float) -> int:
    return min(BUCKETS - 1, max(0, int((at - since).total_seconds() // bucket_s)))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pool_history(*, pool: Pool, now: datetime, hours: float) -> PoolHistory:
    since = now - timedelta(hours=hours)
    bucket_s = hours * 3600 / BUCKETS
    gpus_now = Gpu.objects.filter(node__pool=pool).count()

    # Cycles: allocation from what stayed idle after the cycle, against the capacity it saw (cycles
    # recorded before capacity was stored are measured against the pool's GPUs now).
    rows = (
        Cycle.objects.filter(pool=pool, started_at__gte=since, finished_at__isnull=False)
        .order_by("-started_at")
        .values_list(
            "started_at",
            "stats__fragmentation_after__capacity_milli",
            "stats__fragmentation_after__idle_milli",
            "stats__fragmentation_after__amount_pct",
            "stats__unplaced_by_reason",
        )[:MAX_CYCLES]
    )
    alloc: dict[int, list[float]] = defaultdict(list)
    frag: dict[int, list[float]] = defaultdict(list)
    pending: dict[int, list[float]] = defaultdict(list)
    by_reason: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    totals: dict[str, float] = defaultdict(float)
    cycles = 0
    for started_at, capacity, idle, amount, reasons in rows:
        cycles += 1
        i = _index(started_at, since, bucket_s)
        capacity = capacity or 1000 * gpus_now
        if idle is not None and capacity:
            alloc[i].append(100.0 * max(0.0, capacity - idle) / capacity)
        if amount is not None:
            frag[i].append(float(amount))
        reasons = reasons or {}
        pending[i].append(float(sum(reasons.values())))
        for code, n in reasons.items():
            by_reason[i][code].append(float(n))
            totals[code] += n
    top = tuple(code for code, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS])

    # Telemetry: mean SM utilisation of the pool's GPUs per minute, then per bucket.
    busy: dict[int, list[float]] = defaultdict(list)
    per_minute = (
        GpuSample.objects.filter(gpu__node__pool=pool, at__gte=since, util_gpu_pct__isnull=False)
        .annotate(minute=TruncMinute("at"))
        .values("minute")
        .annotate(util=Avg("util_gpu_pct"))
        .order_by()
    )
    for row in per_minute:
        busy[_index(row["minute"], since, bucket_s)].append(float(row["util"]))

    # Queue wait of the tasks that started in the window.
    waits: dict[int, list[float]] = defaultdict(list)
    starts = (
        Task.objects.filter(pool=pool, started_at__gte=since)
        .order_by("-started_at")
        .values_list("started_at", "created_at")[:MAX_STARTS]
    )
    for started_at, created_at in starts:
        waits[_index(started_at, since, bucket_s)].append(max(0.0, (started_at - created_at).total_seconds()))

    buckets = []
    for i in range(BUCKETS):
        w = sorted(waits.get(i, []))
        p50, p95 = _percentiles(w)
        counts = by_reason.get(i, {})
        cycles_here = len(pending.get(i, []))
        per_reason = []
        for code in top:
            per_reason.append((code, sum(counts.get(code, [])) / cycles_here if cycles_here else 0.0))
        buckets.append(
            Bucket(
                start=since + timedelta(seconds=i * bucket_s),
                allocated_pct=_mean(alloc.get(i, [])),
                busy_pct=_mean(busy.get(i, [])),
                fragmented_pct=_mean(frag.get(i, [])),
                pending=_mean(pending.get(i, [])),
                pending_by_reason=tuple(per_reason) if cycles_here else (),
                wait_p50_s=p50,
                wait_p95_s=p95,
                started=len(w),
            )
        )
    return PoolHistory(
        pool=pool,
        since=since,
        until=now,
        bucket_s=bucket_s,
        buckets=tuple(buckets),
        reasons=top,
        cycles=cycles,
        tenants=tenant_usage(pool=pool, since=since, until=now, bucket_s=bucket_s),
    )


class EpochS(Func):
    """A timestamp as seconds since the epoch (float), on PostgreSQL and on the embedded SQLite."""

    output_field = FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        template = "EXTRACT(EPOCH FROM %(expressions)s)::float8"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # julianday() counts days from noon, 24 November 4714 BC; the Unix epoch is day 2440587.5.
        return self.as_sql(
            compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)", **extra
        )


def tenant_usage(*, pool: Pool, since: datetime, until: datetime, bucket_s: float) -> tuple[TenantUsage, ...]:
    """GPUs held per tenant per bucket: each assignment counts its task's GPUs × milli for the part of
    the bucket it was held (released or not), so a bucket's figure is the mean held over the bucket.

    Read grouped, not row by row (10,000 assignments on a large pool were most of the page's CPU): with
    S and E an assignment's start and end in seconds from `since` (clamped to the window) and m its
    milli, it adds m·((first+1)·b − S)/b to its first bucket, m to each bucket between, and
    m·(E − last·b)/b to its last (m·(E − S)/b when that is one bucket). Each term is linear in m, m·S
    and m·E, so the database sums those per (tenant, first bucket, last bucket) and the figures stay
    exact; the rows returned are a few per tenant, however many assignments there are."""
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Quota

    window_s = (until - since).total_seconds()
    since_s = since.timestamp()

    def clamped(at: Any) -> Any:
        return Least(Greatest(EpochS(at) - since_s, Value(0.0)), Value(window_s))

    start, end = clamped("created_at"), clamped(Coalesce("released_at", Value(until)))
    milli = F("task__gpu_count") * F("task__gpu_milli")
    rows = (
        Assignment.objects.filter(node__pool=pool, created_at__lt=until)
        .exclude(released_at__lt=since)
        .annotate(s=start, e=end)
        .annotate(
            tenant=F("task__tenant__slug"),
            first=Floor(F("s") / bucket_s),
            last=Least(Floor(Greatest(F("s"), F("e") - 1e-6) / bucket_s), Value(float(BUCKETS - 1))),
        )
        .order_by()
        .values("tenant", "first", "last")
        .annotate(m=Sum(milli), ms=Sum(milli * F("s")), me=Sum(milli * F("e")))
        .values_list("tenant", "first", "last", "m", "ms", "me")
    )
    held: dict[str, list[float]] = defaultdict(lambda: [0.0] * BUCKETS)
    for slug, first_f, last_f, m, ms, me in rows:
        first, last, line = int(first_f), int(last_f), held[slug]
        if first == last:
            line[first] += (me - ms) / bucket_s
            continue
        line[first] += ((first + 1) * bucket_s * m - ms) / bucket_s
        for i in range(first + 1, last):
            line[i] += m
        line[last] += (me - last * bucket_s * m) / bucket_s
    guarantees = dict(Quota.objects.filter(pool=pool).values_list("tenant__slug", "guaranteed_milli"))
    ranked = sorted(held, key=lambda slug: (-sum(held[slug]), slug))[:TOP_REASONS]
    return tuple(
        TenantUsage(tenant=slug, guaranteed_milli=guarantees.get(slug, 0), held_milli=tuple(held[slug]))
        for slug in ranked
    )


def _percentiles(values: list[float]) -> tuple[float | None, float | None]:
    """P50 and P95 (inclusive method: a single value is both)."""
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], values[0]
    cuts = quantiles(values, n=20, method="inclusive")
    return cuts[9], cuts[18]


@dataclass(frozen=True)
class GpuTotals:
    gpus: int
    allocated_milli: int


def pool_gpu_totals(*, pool_id: int) -> GpuTotals:
    """GPUs and held milli of a whole pool in one query (the heat-map shows one page of nodes); held
    units are those the pool's live assignments list."""
    from django.db import connection

    from apps.inventory.models import ComputeUnit, Node

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT count(*) FROM {Gpu._meta.db_table} g JOIN {Node._meta.db_table} n"
            "   ON n.id = g.node_id WHERE n.pool_id = %(pool)s),"
            f" (SELECT coalesce(sum(u.gpu_milli), 0) FROM {ComputeUnit._meta.db_table} u"
            f"   JOIN ({live_holders_sql(of_pool=True)}) h ON h.unit_id = u.id)",
            {"pool": pool_id},
        )
        gpus, held = cursor.fetchone()
    return GpuTotals(gpus=gpus, allocated_milli=int(held))


def _span(delta: timedelta) -> str:
    """A duration as an operator says it, rounded down: "12 minutes", "5 hours", "2 days 23 hours"."""
    minutes = max(1, int(delta.total_seconds() // 60))
    if minutes < 60:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} hour{'s' if hours != 1 else ''}"
    days, hours = divmod(hours, 24)
    return f"{days} days" + (f" {hours} hour{'s' if hours != 1 else ''}" if hours else "")


def idle_forecast_note(*, pool_id: int, now: datetime) -> str:
    """Why the idle-GPU chart has no forecast line yet, and when it can have one, in the operator's
    terms: the model learns from the pool's own cycle records (`fragmentation_before.idle_milli`),
    needs `MIN_IDLE_DAYS` of them in the training window, and is trained by the beat every
    `WHALEGEN_FORECAST_TRAIN_INTERVAL_S` (one query: the oldest cycle in that window)."""
    from django.conf import settings

    from apps.forecasting.services import MIN_IDLE_DAYS

    lookback = timedelta(days=settings.WHALEGEN_FORECAST_LOOKBACK_DAYS)
    first = (
        Cycle.objects.filter(pool_id=pool_id, started_at__gte=now - lookback)
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    need = timedelta(days=MIN_IDLE_DAYS)
    every = _span(timedelta(seconds=float(settings.CELERY_BEAT_SCHEDULE["forecasting-train"]["schedule"])))
    if first is None:
        return (
            f"No forecast yet: the idle-GPU model learns from this pool's scheduling cycles and needs "
            f"{MIN_IDLE_DAYS} days of them; no cycle has run yet."
        )
    have = now - first
    if have < need:
        return (
            f"No forecast yet: the idle-GPU model needs {MIN_IDLE_DAYS} days of this pool's cycle history "
            f"and has {_span(have)} (since {first:%Y-%m-%d %H:%M} UTC), {_span(need - have)} more. Forecasts "
            f"can start after {first + need:%Y-%m-%d %H:%M} UTC, with the first training after that "
            f"(every {every})."
        )
    return (
        f"No forecast yet: the pool has {_span(have)} of cycle history, enough to train on; the model is "
        f"trained every {every} and drawn here once one beats persistence, the same slot yesterday and the "
        "window mean."
    )


def latest_cycle_ref(*, pool_id: int) -> CycleRef | None:
    """The pool's newest cycle as a `CycleRef` (id and start, from the (pool, started_at) index), or None:
    what per-cycle figures are keyed on."""
    from apps.dashboard.whatif import CycleRef

    row = (
        Cycle.objects.filter(pool_id=pool_id)
        .order_by("-started_at", "-id")
        .values_list("id", "started_at")
        .first()
    )
    return None if row is None else CycleRef(*row)


def latest_cycle_rows(*, pool_ids: list[int]) -> dict[int, dict]:
    """The newest cycle of each pool in one query (a correlated subquery per pool, each answered from
    the newest end of the cycle history), with only the figures the pool list shows — never the whole
    `stats` of a cycle, which on a large pool holds thousands of entries."""
    from django.db.models import OuterRef, Subquery

    newest = Cycle.objects.filter(pool_id=OuterRef("pk")).order_by("-started_at", "-id").values("id")[:1]
    rows = Cycle.objects.filter(
        pk__in=Pool.objects.filter(pk__in=pool_ids).annotate(cycle_id=Subquery(newest)).values("cycle_id")
    ).values_list(
        "pool_id",
        "started_at",
        "policy",
        "tasks_placed",
        "stats__unplaced_by_reason",
        "stats__fragmentation_after__amount_pct",
    )
    return {
        pool_id: {
            "started_at": started_at,
            "policy": policy,
            "tasks_placed": placed,
            "left_pending": sum((reasons or {}).values()),
            "frag_after_pct": frag,
        }
        for pool_id, started_at, policy, placed, reasons, frag in rows
    }


@dataclass(frozen=True)
class MapUnit:
    kind: str
    mig_profile: str
    mig_start: int | None
    gpu_milli: int
    task_id: int | None
    tenant_id: int | None  # the holder's tenant: whether the viewer may see the task's id


@dataclass(frozen=True)
class MapGpu:
    node_id: int
    index: int
    model: str
    partition_mode: str
    health: str
    node: str  # "cluster/node"
    node_state: str
    units: tuple[MapUnit, ...]


def heat_map_gpus(*, node_ids: list[int]) -> list[MapGpu]:
    """The GPUs of one heat-map page with their units and each unit's holder and its tenant, as plain
    rows (three queries): only the columns the map draws, and no model instances — a page of 800 GPUs and
    3,200 units built as Django models took most of the page's CPU. The caller has checked the pool
    is visible; the nodes are that pool's. Units come in the order they were carved (their ids)."""
    from apps.inventory.models import ComputeUnit

    holders = {
        unit_id: (task_id, tenant_id)
        for task_id, tenant_id, unit_ids in Assignment.objects.filter(
            released_at__isnull=True, node_id__in=node_ids
        ).values_list("task_id", "task__tenant_id", "unit_ids")
        for unit_id in unit_ids
    }
    units: dict[int, list[MapUnit]] = defaultdict(list)
    for pk, gpu_id, kind, profile, start, milli in (
        ComputeUnit.objects.filter(gpu__node_id__in=node_ids)
        .order_by("gpu_id", "id")
        .values_list("pk", "gpu_id", "kind", "mig_profile", "mig_start", "gpu_milli")
    ):
        task_id, tenant_id = holders.get(pk, (None, None))
        units[gpu_id].append(MapUnit(kind, profile or "", start, milli, task_id, tenant_id))
    return [
        MapGpu(node_id, index, model, mode, health, f"{cluster}/{node}", state, tuple(units.get(pk, ())))
        for pk, node_id, index, model, mode, health, node, state, cluster in Gpu.objects.filter(
            node_id__in=node_ids
        )
        .order_by("node__cluster__name", "node__name", "index")
        .values_list(
            "pk", "node_id", "index", "model", "partition_mode", "health", "node__name", "node__state",
            "node__cluster__name",
        )
    ]  # fmt: skip
