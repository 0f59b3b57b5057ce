"""The reads behind one scrape of `/metrics`: a fixed number of grouped queries, whatever the fleet's size.

Every figure is an aggregate the database computes (`GROUP BY`); nothing here loops over rows issuing
further queries, so a scrape costs the same dozen round trips on ten nodes or ten thousand
(`tests/apps/metrics` pins the count). Rows are `.values()` dicts, never model instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, F, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from apps.accounting.selectors import month_usage
from apps.forecasting.models import ForecastModel
from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool
from apps.scheduling.holders import live_holders_sql
from apps.scheduling.models import Cycle, PoolCycleTotals, Repartition
from apps.scheduling.selectors import QuotaUsage, quota_usage
from apps.workloads.models import Quota, Task
from apps.workloads.selectors import quotas_with_waiting

Row = dict[str, Any]


@dataclass(frozen=True)
class PlaneReadings:
    """What one scrape read, grouped as the metrics need it. Pools are keyed by id; `pools` names them."""

    now: datetime
    pools: dict[int, str]
    gpus: list[Row]  # pool_id, cluster, health, gpus
    units: list[Row]  # pool_id, cluster, kind, units, held, milli, held_milli
    tasks: list[Row]  # pool_id, state, tasks, idle (flagged by the idle check)
    pending: list[Row]  # pool_id, why_pending_code, tasks, oldest
    quotas: list[Row]  # tenant_id, tenant_slug, pool_id, guaranteed_milli, borrow_limit_milli, waiting_milli
    usage: dict[tuple[int, int], QuotaUsage]  # (tenant id, pool id) → placed usage
    budget_used: dict[tuple[str, str], float]  # (tenant slug, pool name) → GPU-hours this month, budgeted
    latest_cycles: list[Row]  # one Cycle row per pool that has one
    cycle_totals: list[Row]  # pool_id, cycles, considered, placed, preempted, conflicts
    nodes: list[Row]  # pool_id, cluster_name, cordoned, state, nodes, oldest_heartbeat
    open_claims: list[Row]  # pool_id, claims
    forecast_models: list[Row]  # the active models with their metrics


@dataclass(frozen=True)
class FleetReadings:
    """The part of `PlaneReadings` the dashboard's fleet overview draws: six grouped queries."""

    pools: dict[int, str]
    gpus: list[Row]
    units: list[Row]
    pending: list[Row]
    latest_cycles: list[Row]
    nodes: list[Row]


def _units() -> list[Row]:
    """Units and their milli per pool, cluster and kind, and how many of them tasks hold: those a live
    assignment lists (a unit stores no holder; `apps.scheduling.holders`). One query."""
    units, gpus = ComputeUnit._meta.db_table, Gpu._meta.db_table
    nodes, clusters = Node._meta.db_table, Cluster._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.pool_id, c.name, u.kind, count(*), sum(u.gpu_milli), count(h.unit_id),"
            " sum(CASE WHEN h.unit_id IS NULL THEN 0 ELSE u.gpu_milli END)"
            f" FROM {units} u JOIN {gpus} g ON g.id = u.gpu_id JOIN {nodes} n ON n.id = g.node_id"
            f" JOIN {clusters} c ON c.id = n.cluster_id"
            f" LEFT JOIN ({live_holders_sql()}) h ON h.unit_id = u.id"
            " GROUP BY n.pool_id, c.name, u.kind"
        )
        keys = ("pool_id", "cluster", "kind", "units", "milli", "held", "held_milli")
        return [dict(zip(keys, (*row[:4], int(row[4]), row[5], int(row[6])), strict=True)) for row in cursor]


def fleet_readings() -> FleetReadings:
    """Pools, GPUs, held units, pending tasks by reason, the newest cycle and nodes by state, per pool and
    cluster: the fleet overview without the rest of a scrape (quotas, usage, budgets, models)."""
    pools = dict(Pool.objects.values_list("id", "name"))
    gpus = list(
        Gpu.objects.values("health", pool_id=F("node__pool_id"), cluster=F("node__cluster__name"))
        .annotate(gpus=Count("id"))
        .order_by()
    )
    units = _units()
    pending = list(
        Task.objects.filter(state=Task.State.PENDING)
        .values("pool_id", why_pending_code=F("wait__code"))
        .annotate(tasks=Count("id"), oldest=Min("created_at"))
        .order_by()
    )
    # The newest cycle of each pool: one correlated subquery per pool (the pool table is small), each
    # answered from the (pool, started_at) end of the cycle history, never a scan of all cycles.
    newest = Cycle.objects.filter(pool_id=OuterRef("pk")).order_by("-started_at", "-id").values("id")[:1]
    latest_cycles = list(
        Cycle.objects.filter(
            pk__in=Pool.objects.annotate(cycle_id=Subquery(newest)).values("cycle_id")
        ).values(
            "pool_id", "policy", "started_at", "finished_at", "snapshot_ms", "solve_ms", "commit_ms", "stats"
        )
    )
    # A node that never heartbeated counts from its creation, as the lost-node check does.
    nodes = list(
        Node.objects.values(
            "pool_id", "state", cluster_name=F("cluster__name"), cordoned=F("cluster__cordoned")
        )
        .annotate(nodes=Count("id"), oldest_heartbeat=Min(Coalesce("last_heartbeat_at", "created_at")))
        .order_by()
    )
    return FleetReadings(pools, gpus, units, pending, latest_cycles, nodes)


def plane_readings(*, now: datetime) -> PlaneReadings:
    """Everything `/metrics` shows, in 13 queries (one per field below except `now`; usage takes two), 14
    when some tenant has a GPU-hour budget (its month's usage)."""
    fleet = fleet_readings()
    tasks = list(
        Task.objects.values("pool_id", "state")
        .annotate(tasks=Count("id"), idle=Count("id", filter=Q(idle_flagged_at__isnull=False)))
        .order_by()
    )
    # What each tenant's pending tasks ask in the pool, in the same read, as the quota list counts it.
    quotas = list(
        quotas_with_waiting(Quota.objects.all()).values(
            "tenant_id",
            "pool_id",
            "guaranteed_milli",
            "borrow_limit_milli",
            "waiting_milli",
            tenant_slug=F("tenant__slug"),
            budget_gpu_hours=F("budget__gpu_hours"),
        )
    )
    usage = quota_usage(tenant_ids=sorted({q["tenant_id"] for q in quotas})) if quotas else {}
    # This month's GPU-hours of the tenants with a budget: one more query, only when there are budgets.
    budgeted = sorted({q["tenant_id"] for q in quotas if q["budget_gpu_hours"] is not None})
    budget_used = month_usage(tenant_ids=budgeted, now=now) if budgeted else {}
    # Running totals kept by the cycles themselves: one row per pool, not a sum over the cycle history.
    cycle_totals = list(
        PoolCycleTotals.objects.values(
            "pool_id",
            "cycles",
            "conflicts",
            considered=F("tasks_considered"),
            placed=F("tasks_placed"),
            preempted=F("tasks_preempted"),
        )
    )
    open_claims = list(
        Repartition.objects.filter(state=Repartition.State.WAITING)
        .values("pool_id")
        .annotate(claims=Count("id"))
        .order_by()
    )
    forecast_models = list(
        ForecastModel.objects.filter(state=ForecastModel.State.ACTIVE).values(
            "kind",
            "scope",
            "version",
            "metrics",
            "trained_at",
            pool_name=F("pool__name"),
            tenant_slug=F("tenant__slug"),
        )
    )
    return PlaneReadings(
        now=now,
        pools=fleet.pools,
        gpus=fleet.gpus,
        units=fleet.units,
        tasks=tasks,
        pending=fleet.pending,
        quotas=quotas,
        usage=usage,
        budget_used=budget_used,
        latest_cycles=fleet.latest_cycles,
        cycle_totals=cycle_totals,
        nodes=fleet.nodes,
        open_claims=open_claims,
        forecast_models=forecast_models,
    )


# ---------------------------------------------------------------------------------------------- readiness


@dataclass(frozen=True)
class Check:
    """One readiness check: its name, whether it passed, and a line a person can act on."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Readiness:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failing(self) -> list[str]:
        return [check.name for check in self.checks if not check.ok]


# Set once this process saw every migration applied. Migrations only move forward while a process runs
# (an upgrade migrates, then restarts the processes), so a positive answer stays true; a negative one is
# asked again on every call, since the one-shot `migrate` may be running right now.
_migrations_applied = False


def _check_database() -> Check:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return Check("database", True, f"{connection.vendor} answers")


def _check_migrations() -> Check:
    global _migrations_applied
    if _migrations_applied:
        return Check("migrations", True, "all applied")
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        more = f" and {len(plan) - 5} more" if len(plan) > 5 else ""
        return Check("migrations", False, f"{len(plan)} not applied: {names}{more} (run manage.py migrate)")
    _migrations_applied = True
    return Check("migrations", True, "all applied")


def _check_broker() -> Check:
    from django.conf import settings

    url = str(settings.CELERY_BROKER_URL)
    if settings.CELERY_TASK_ALWAYS_EAGER or url.startswith("memory://"):
        return Check("broker", True, "embedded default: in-memory broker, tasks run in-process")
    timeout_s = settings.WHALEGEN_READY_BROKER_TIMEOUT_S
    if url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            client.ping()
        finally:
            client.close()
        return Check("broker", True, "redis answers PING")
    from kombu import Connection

    with Connection(url, connect_timeout=timeout_s) as broker:
        broker.ensure_connection(max_retries=1)
    return Check("broker", True, f"{broker.transport_cls} connects")


def _check_beat(now: datetime) -> Check:
    from django.conf import settings

    from apps.metrics.models import PlaneTick

    max_age_s = settings.WHALEGEN_READY_BEAT_MAX_AGE_S
    ticked_at = PlaneTick.objects.filter(pk=1).values_list("ticked_at", flat=True).first()
    if ticked_at is None:
        return Check("beat", False, "no plane-tick ran yet: is celery beat running, and a worker?")
    age_s = max((now - ticked_at).total_seconds(), 0.0)
    if age_s > max_age_s:
        return Check(
            "beat", False, f"last plane-tick {age_s:.0f} s ago (> {max_age_s:.0f} s): beat or workers down"
        )
    return Check("beat", True, f"last plane-tick {age_s:.0f} s ago")


def _guarded(name: str, check: Any) -> Check:
    """A check that raises is a failing check, never a 500."""
    try:
        result: Check = check()
    except Exception as error:
        return Check(name, False, f"{type(error).__name__}: {error}"[:300])
    return result


def readiness(*, now: datetime) -> Readiness:
    """The readiness checks in order: database, migrations, broker, beat. Without a database the two that
    read it are reported failing without being tried (each would wait out its own connection attempt)."""
    database = _guarded("database", _check_database)
    if database.ok:
        migrations = _guarded("migrations", _check_migrations)
        beat = _guarded("beat", lambda: _check_beat(now))
    else:
        migrations = Check("migrations", False, "not checked: the database is unreachable")
        beat = Check("beat", False, "not checked: the database is unreachable")
    return Readiness((database, migrations, _guarded("broker", _check_broker), beat))
