"""The reads behind one scrape of `/metrics`: a fixed number of grouped queries, whatever the fleet's size.

Every figure is an aggregate the database computes (`GROUP BY`); nothing here loops over rows issuing
further queries, so a scrape costs the same dozen round trips on ten nodes or ten thousand
(`tests/apps/metrics` pins the count). Rows are `.values()` dicts, never model instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from apps.forecasting.models import ForecastModel
from apps.inventory.models import ComputeUnit, Gpu, Node, Pool
from apps.scheduling.models import Cycle, PoolCycleTotals, Repartition
from apps.scheduling.selectors import QuotaUsage, quota_usage
from apps.workloads.models import Quota, Task

Row = dict[str, Any]


@dataclass(frozen=True)
class PlaneReadings:
    """What one scrape read, grouped as the metrics need it. Pools are keyed by id; `pools` names them."""

    now: datetime
    pools: dict[int, str]
    gpus: list[Row]  # pool_id, cluster, health, gpus
    units: list[Row]  # pool_id, cluster, kind, units, held, milli, held_milli
    tasks: list[Row]  # pool_id, state, tasks
    pending: list[Row]  # pool_id, why_pending_code, tasks, oldest
    quotas: list[Row]  # tenant_id, tenant_slug, pool_id, guaranteed_milli, borrow_limit_milli, charged_milli
    usage: dict[tuple[int, int], QuotaUsage]  # (tenant id, pool id) → placed usage
    latest_cycles: list[Row]  # one Cycle row per pool that has one
    cycle_totals: list[Row]  # pool_id, cycles, considered, placed, preempted, conflicts
    nodes: list[Row]  # pool_id, cluster_name, cordoned, state, nodes, oldest_heartbeat
    open_claims: list[Row]  # pool_id, claims
    forecast_models: list[Row]  # the active models with their metrics


def plane_readings(*, now: datetime) -> PlaneReadings:
    """Everything `/metrics` shows, in 13 queries (one per field below except `now`; usage takes two)."""
    pools = dict(Pool.objects.values_list("id", "name"))
    gpus = list(
        Gpu.objects.values("health", pool_id=F("node__pool_id"), cluster=F("node__cluster__name"))
        .annotate(gpus=Count("id"))
        .order_by()
    )
    held = Q(task__isnull=False)
    units = list(
        ComputeUnit.objects.values(
            "kind", pool_id=F("gpu__node__pool_id"), cluster=F("gpu__node__cluster__name")
        )
        .annotate(
            units=Count("id"),
            held=Count("id", filter=held),
            milli=Sum("gpu_milli"),
            held_milli=Coalesce(Sum("gpu_milli", filter=held), 0),
        )
        .order_by()
    )
    tasks = list(Task.objects.values("pool_id", "state").annotate(tasks=Count("id")).order_by())
    pending = list(
        Task.objects.filter(state=Task.State.PENDING)
        .values("pool_id", "why_pending_code")
        .annotate(tasks=Count("id"), oldest=Min("created_at"))
        .order_by()
    )
    quotas = list(
        Quota.objects.values(
            "tenant_id",
            "pool_id",
            "guaranteed_milli",
            "borrow_limit_milli",
            "charged_milli",
            tenant_slug=F("tenant__slug"),
        )
    )
    usage = quota_usage(tenant_ids=sorted({q["tenant_id"] for q in quotas})) if quotas else {}
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
    # A node that never heartbeated counts from its creation, as the lost-node check does.
    nodes = list(
        Node.objects.values(
            "pool_id", "state", cluster_name=F("cluster__name"), cordoned=F("cluster__cordoned")
        )
        .annotate(nodes=Count("id"), oldest_heartbeat=Min(Coalesce("last_heartbeat_at", "created_at")))
        .order_by()
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
        pools=pools,
        gpus=gpus,
        units=units,
        tasks=tasks,
        pending=pending,
        quotas=quotas,
        usage=usage,
        latest_cycles=latest_cycles,
        cycle_totals=cycle_totals,
        nodes=nodes,
        open_claims=open_claims,
        forecast_models=forecast_models,
    )
