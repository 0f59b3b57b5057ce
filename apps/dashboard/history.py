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
from typing import Any

from django.db.models import Avg
from django.db.models.functions import TruncMinute

from apps.fleet.models import GpuSample
from apps.inventory.models import Gpu, Pool
from apps.scheduling.models import Cycle
from apps.workloads.models import Task

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


def tenant_usage(*, pool: Pool, since: datetime, until: datetime, bucket_s: float) -> tuple[TenantUsage, ...]:
    """GPUs held per tenant per bucket: each assignment counts its task's GPUs × milli for the part of
    the bucket it was held (released or not), so a bucket's figure is the mean held over the bucket."""
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Quota

    rows = (
        Assignment.objects.filter(node__pool=pool, created_at__lt=until)
        .exclude(released_at__lt=since)
        .order_by("-created_at")
        .values_list("task__tenant__slug", "created_at", "released_at", "task__gpu_count", "task__gpu_milli")[
            :MAX_STARTS
        ]
    )
    held: dict[str, list[float]] = defaultdict(lambda: [0.0] * BUCKETS)
    for slug, start, end, count, milli in rows:
        start_s = max(0.0, (start - since).total_seconds())
        end_s = ((end or until) - since).total_seconds()
        first = int(start_s // bucket_s)
        last = min(BUCKETS - 1, int(max(start_s, end_s - 1e-9) // bucket_s))
        for i in range(first, last + 1):
            overlap = min(end_s, (i + 1) * bucket_s) - max(start_s, i * bucket_s)
            if overlap > 0:
                held[slug][i] += count * milli * overlap / bucket_s
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
    """GPUs and held milli of a whole pool in one query (the heat-map shows one page of nodes)."""
    from django.db.models import Count, Q, Sum

    row = Gpu.objects.filter(node__pool_id=pool_id).aggregate(
        gpus=Count("id", distinct=True),
        held=Sum("units__gpu_milli", filter=Q(units__task__isnull=False)),
    )
    return GpuTotals(gpus=row["gpus"], allocated_milli=row["held"] or 0)


def latest_cycle_ref(*, pool_id: int) -> Any:
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


def heat_map_gpus(*, node_ids: list[int]) -> Any:
    """The GPUs of one heat-map page with their units and each unit's holder's tenant (two queries): only
    the columns the map draws, so a page of 800 GPUs and thousands of units builds light instances.
    The caller has checked the pool is visible; the nodes are that pool's."""
    from django.db.models import F, Prefetch

    from apps.inventory.models import ComputeUnit

    units = ComputeUnit.objects.only("gpu_id", "kind", "mig_profile", "mig_start", "gpu_milli", "task_id")
    return (
        Gpu.objects.filter(node_id__in=node_ids)
        .select_related("node__cluster")
        .only("node_id", "index", "model", "partition_mode", "health", "node__name", "node__state",
              "node__cluster__name")
        .prefetch_related(Prefetch("units", queryset=units.annotate(task_tenant_id=F("task__tenant_id"))))
    )  # fmt: skip
