"""The Prometheus collector: one scrape reads the plane (`selectors.plane_readings`) and turns it into
metric families. Names, labels and meanings are listed in docs/metrics.md; a metric added here goes there.

Labels stay low-cardinality: pool, cluster, tenant, state, reason, kind, health, phase, scope, metric —
never a task, node or GPU id. Durations are in seconds (Prometheus' base unit), GPU compute in milli-GPUs
(the plane's unit) and in GPUs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from apps.inventory.models import Node
from apps.metrics.selectors import PlaneReadings, plane_readings
from apps.workloads.models import Task

MILLI_PER_GPU = 1000
# What the scrape shows for a pending task no cycle has looked at yet (its why_pending_code is blank).
NOT_CONSIDERED = "not_considered"
# The candidate entry of a forecast model's validation scores, by preference (durations train P50/P90
# quantile models and are promoted on the P50's score; the other kinds call theirs "xgboost").
CANDIDATE_NAMES = ("xgboost_p50", "xgboost")


def _age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max((now - then).total_seconds(), 0.0)


def _scope_label(row: dict[str, Any]) -> str:
    """`plane` for a plane-wide model, else the pool name and/or tenant slug (ids mean nothing on a graph)."""
    parts = [f"pool:{row['pool_name']}"] if row["pool_name"] else []
    parts += [f"tenant:{row['tenant_slug']}"] if row["tenant_slug"] else []
    return "/".join(parts) or "plane"


def forecast_headline(metrics: dict[str, Any]) -> list[tuple[str, float]]:
    """(metric name, value) of the model's own validation scores: the metric(s) it was promoted on, as
    named by `metrics["metric"]`, read from its candidate entry; per horizon for horizon models
    (`mae_600s`). A score stored as null (undefined, e.g. NaN) is left out."""
    names = [name.strip() for name in str(metrics.get("metric", "")).split(",") if name.strip()]
    found: list[tuple[str, float]] = []

    def take(models: object, suffix: str) -> None:
        if not isinstance(models, dict):
            return
        scores = next((models[c] for c in CANDIDATE_NAMES if isinstance(models.get(c), dict)), None)
        if scores is None:
            return
        for name in names:
            value = scores.get(name)
            if isinstance(value, (int, float)):
                found.append((f"{name}{suffix}", float(value)))

    take(metrics.get("models"), "")
    horizons = metrics.get("horizons")
    if isinstance(horizons, dict):
        for horizon, block in sorted(horizons.items(), key=lambda item: int(item[0])):
            if isinstance(block, dict):
                take(block.get("models"), f"_{horizon}s")
    return found


def families(readings: PlaneReadings) -> Iterator[Metric]:
    """Every metric family of one scrape, from what `plane_readings` returned, in a fixed order."""
    yield from _capacity_families(readings)
    yield from _task_families(readings)
    yield from _quota_families(readings)
    yield from _cycle_families(readings)
    yield from _node_families(readings)
    yield from _forecast_families(readings)


def _capacity_families(readings: PlaneReadings) -> Iterator[Metric]:
    """Capacity and allocation (GPUs and their compute units)."""
    pool = readings.pools
    gpus = GaugeMetricFamily(
        "whalegen_gpus", "GPUs by pool, cluster and health.", labels=["pool", "cluster", "health"]
    )
    capacity: dict[tuple[str, str], int] = defaultdict(int)
    for row in readings.gpus:
        key = (pool[row["pool_id"]], row["cluster"])
        gpus.add_metric([*key, row["health"]], row["gpus"])
        capacity[key] += row["gpus"]
    cap_milli = GaugeMetricFamily(
        "whalegen_gpu_capacity_milli",
        "GPU compute of every GPU, 1000 per GPU, any health.",
        labels=["pool", "cluster"],
    )
    cap_gpus = GaugeMetricFamily(
        "whalegen_gpu_capacity_gpus", "GPUs, any health.", labels=["pool", "cluster"]
    )
    for key, count in sorted(capacity.items()):
        cap_milli.add_metric(list(key), count * MILLI_PER_GPU)
        cap_gpus.add_metric(list(key), count)
    units = GaugeMetricFamily(
        "whalegen_compute_units", "Compute units carved.", labels=["pool", "cluster", "kind"]
    )
    units_held = GaugeMetricFamily(
        "whalegen_compute_units_held", "Compute units a task holds.", labels=["pool", "cluster", "kind"]
    )
    allocated: dict[tuple[str, str], int] = {key: 0 for key in capacity}
    for row in readings.units:
        key = (pool[row["pool_id"]], row["cluster"])
        units.add_metric([*key, row["kind"]], row["units"])
        units_held.add_metric([*key, row["kind"]], row["held"])
        allocated[key] = allocated.get(key, 0) + int(row["held_milli"])
    alloc_milli = GaugeMetricFamily(
        "whalegen_gpu_allocated_milli",
        "Milli-GPUs of the compute units tasks hold.",
        labels=["pool", "cluster"],
    )
    alloc_gpus = GaugeMetricFamily(
        "whalegen_gpu_allocated_gpus",
        "Allocated milli-GPUs / 1000 (GPU equivalents).",
        labels=["pool", "cluster"],
    )
    for key, milli in sorted(allocated.items()):
        alloc_milli.add_metric(list(key), milli)
        alloc_gpus.add_metric(list(key), milli / MILLI_PER_GPU)
    yield from (gpus, cap_milli, cap_gpus, alloc_milli, alloc_gpus, units, units_held)


def _task_families(readings: PlaneReadings) -> Iterator[Metric]:
    """Tasks: every state of every pool (0 included, so a rate or a ratio never meets a gap)."""
    pool = readings.pools
    now = readings.now
    tasks = GaugeMetricFamily("whalegen_tasks", "Tasks by pool and state.", labels=["pool", "state"])
    by_state = {(row["pool_id"], row["state"]): row["tasks"] for row in readings.tasks}
    for pool_id, name in sorted(pool.items(), key=lambda item: item[1]):
        for state in Task.State.values:
            tasks.add_metric([name, state], by_state.get((pool_id, state), 0))
    idle_tasks = GaugeMetricFamily(
        "whalegen_tasks_idle",
        "Running tasks flagged idle: GPUs below WHALEGEN_IDLE_UTIL_PCT for WHALEGEN_IDLE_AFTER_S.",
        labels=["pool"],
    )
    idle_by_pool = {
        row["pool_id"]: row["idle"] for row in readings.tasks if row["state"] == Task.State.RUNNING
    }
    for pool_id, name in sorted(pool.items(), key=lambda item: item[1]):
        idle_tasks.add_metric([name], idle_by_pool.get(pool_id, 0))
    pending = GaugeMetricFamily(
        "whalegen_tasks_pending",
        f"Pending tasks by pool and why-pending code ({NOT_CONSIDERED}: no cycle has looked at it yet).",
        labels=["pool", "reason"],
    )
    oldest: dict[int, datetime] = {}
    for row in readings.pending:
        pending.add_metric([pool[row["pool_id"]], row["why_pending_code"] or NOT_CONSIDERED], row["tasks"])
        if row["pool_id"] not in oldest or row["oldest"] < oldest[row["pool_id"]]:
            oldest[row["pool_id"]] = row["oldest"]
    oldest_age = GaugeMetricFamily(
        "whalegen_tasks_pending_oldest_age_seconds",
        "Age of the oldest pending task (since submission); 0 when none waits.",
        labels=["pool"],
    )
    for pool_id, name in sorted(pool.items(), key=lambda item: item[1]):
        oldest_age.add_metric([name], _age_s(now, oldest.get(pool_id)) or 0.0)
    yield from (tasks, idle_tasks, pending, oldest_age)


def _quota_families(readings: PlaneReadings) -> Iterator[Metric]:
    """Quotas per tenant × pool."""
    pool = readings.pools
    quota = {
        "guaranteed": GaugeMetricFamily(
            "whalegen_quota_guaranteed_milli", "Guaranteed milli-GPUs.", labels=["tenant", "pool"]
        ),
        "borrow": GaugeMetricFamily(
            "whalegen_quota_borrow_limit_milli", "Milli-GPUs the tenant may borrow above its guarantee.",
            labels=["tenant", "pool"],
        ),
        "waiting": GaugeMetricFamily(
            "whalegen_quota_waiting_milli",
            "Milli-GPUs the tenant's pending tasks ask; they hold no quota until a cycle admits them.",
            labels=["tenant", "pool"],
        ),
        "in_use": GaugeMetricFamily(
            "whalegen_quota_in_use_milli",
            "Milli-GPUs of the tenant's placed tasks (admitted, assigned, running).",
            labels=["tenant", "pool"],
        ),
        "borrowed": GaugeMetricFamily(
            "whalegen_quota_borrowed_milli",
            "Part of in-use admitted above the guarantee (the first capacity an owner reclaims).",
            labels=["tenant", "pool"],
        ),
        "budget": GaugeMetricFamily(
            "whalegen_budget_limit_gpu_hours",
            "GPU-hour budget per calendar month (UTC).",
            labels=["tenant", "pool"],
        ),
        "budget_used": GaugeMetricFamily(
            "whalegen_budget_used_gpu_hours",
            "GPU-hours used this month where there is a budget; new admissions stop at the limit.",
            labels=["tenant", "pool"],
        ),
    }  # fmt: skip
    for row in sorted(readings.quotas, key=lambda r: (r["tenant_slug"], pool[r["pool_id"]])):
        labels = [row["tenant_slug"], pool[row["pool_id"]]]
        use = readings.usage.get((row["tenant_id"], row["pool_id"]))
        quota["guaranteed"].add_metric(labels, row["guaranteed_milli"])
        quota["borrow"].add_metric(labels, row["borrow_limit_milli"])
        quota["waiting"].add_metric(labels, row["waiting_milli"])
        quota["in_use"].add_metric(labels, use.in_use_milli if use else 0)
        quota["borrowed"].add_metric(labels, use.reclaimable_milli if use else 0)
        if row["budget_gpu_hours"] is not None:
            quota["budget"].add_metric(labels, row["budget_gpu_hours"])
            quota["budget_used"].add_metric(labels, readings.budget_used.get((labels[0], labels[1]), 0.0))
    yield from quota.values()


def _cycle_families(readings: PlaneReadings) -> Iterator[Metric]:
    """Cycles: the newest one per pool, and totals over every cycle recorded."""
    pool = readings.pools
    now = readings.now
    idle = GaugeMetricFamily(
        "whalegen_pool_idle_milli", "Idle milli-GPUs after the pool's latest cycle.", labels=["pool"]
    )
    frag = GaugeMetricFamily(
        "whalegen_pool_fragmented_milli",
        "Idle milli-GPUs the pending and running task shapes cannot use (FGD), after the latest cycle.",
        labels=["pool"],
    )
    frag_pct = GaugeMetricFamily(
        "whalegen_pool_fragmentation_percent",
        "Fragmented milli-GPUs as a percentage of the pool's capacity, after the latest cycle.",
        labels=["pool"],
    )
    phase = GaugeMetricFamily(
        "whalegen_cycle_last_phase_seconds",
        "Duration of each phase of the pool's latest cycle (snapshot, solve, commit).",
        labels=["pool", "phase"],
    )
    age = GaugeMetricFamily(
        "whalegen_cycle_last_age_seconds", "Seconds since the pool's latest cycle finished.", labels=["pool"]
    )
    for row in sorted(readings.latest_cycles, key=lambda r: pool[r["pool_id"]]):
        name = pool[row["pool_id"]]
        after = (row["stats"] or {}).get("fragmentation_after") or {}
        if "idle_milli" in after:
            idle.add_metric([name], after["idle_milli"])
            frag.add_metric([name], after["frag_milli"])
            frag_pct.add_metric([name], after["amount_pct"])
        for label, field in (("snapshot", "snapshot_ms"), ("solve", "solve_ms"), ("commit", "commit_ms")):
            if row[field] is not None:
                phase.add_metric([name, label], row[field] / 1000.0)
        age.add_metric([name], _age_s(now, row["finished_at"] or row["started_at"]) or 0.0)
    yield from (idle, frag, frag_pct, phase, age)
    counters = {
        "cycles": CounterMetricFamily("whalegen_cycles", "Scheduling cycles recorded.", labels=["pool"]),
        "considered": CounterMetricFamily(
            "whalegen_cycle_tasks_considered", "Pending tasks the cycles looked at.", labels=["pool"]
        ),
        "placed": CounterMetricFamily(
            "whalegen_cycle_tasks_placed", "Tasks the cycles placed.", labels=["pool"]
        ),
        "preempted": CounterMetricFamily(
            "whalegen_cycle_tasks_preempted", "Tasks the cycles preempted.", labels=["pool"]
        ),
        "conflicts": CounterMetricFamily(
            "whalegen_cycle_conflicts",
            "Decisions that lost a compare-and-set race at commit.",
            labels=["pool"],
        ),
    }
    for row in sorted(readings.cycle_totals, key=lambda r: pool[r["pool_id"]]):
        for field, family in counters.items():
            family.add_metric([pool[row["pool_id"]]], row[field] or 0)
    yield from counters.values()


def _node_families(readings: PlaneReadings) -> Iterator[Metric]:
    """Nodes: every state for each pool × cluster that has nodes; heartbeat staleness per pool × state."""
    pool = readings.pools
    now = readings.now
    nodes = GaugeMetricFamily(
        "whalegen_nodes", "Nodes by pool, cluster and state.", labels=["pool", "cluster", "state"]
    )
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    stalest: dict[tuple[str, str], datetime] = {}
    cordoned: dict[str, bool] = {}
    for row in readings.nodes:
        key = (pool[row["pool_id"]], row["cluster_name"])
        counts[key][row["state"]] = row["nodes"]
        cordoned[row["cluster_name"]] = row["cordoned"]
        state_key = (pool[row["pool_id"]], row["state"])
        if state_key not in stalest or row["oldest_heartbeat"] < stalest[state_key]:
            stalest[state_key] = row["oldest_heartbeat"]
    for cell, here in sorted(counts.items()):
        for state in Node.State.values:
            nodes.add_metric([*cell, state], here.get(state, 0))
    heartbeat = GaugeMetricFamily(
        "whalegen_node_heartbeat_age_max_seconds",
        "Seconds since the stalest node's last heartbeat (since creation if it never sent one).",
        labels=["pool", "state"],
    )
    for (name, state), then in sorted(stalest.items()):
        heartbeat.add_metric([name, state], _age_s(now, then) or 0.0)
    cordon = GaugeMetricFamily(
        "whalegen_cluster_cordoned", "1 when the cluster is cordoned (takes nothing new).", labels=["cluster"]
    )
    for cluster, flag in sorted(cordoned.items()):
        cordon.add_metric([cluster], 1 if flag else 0)
    claims = GaugeMetricFamily(
        "whalegen_repartition_claims_open",
        "GPUs re-carved for a task and waiting for their agent to apply the layout.",
        labels=["pool"],
    )
    open_by_pool = {row["pool_id"]: row["claims"] for row in readings.open_claims}
    for pool_id, name in sorted(pool.items(), key=lambda item: item[1]):
        claims.add_metric([name], open_by_pool.get(pool_id, 0))
    yield from (nodes, heartbeat, cordon, claims)


def _forecast_families(readings: PlaneReadings) -> Iterator[Metric]:
    """Forecast models in service."""
    now = readings.now
    version = GaugeMetricFamily(
        "whalegen_forecast_model_active_version", "Version of the active model.", labels=["kind", "scope"]
    )
    score = GaugeMetricFamily(
        "whalegen_forecast_model_validation_score",
        "The active model's own score on its validation window, in the metric it was promoted on.",
        labels=["kind", "scope", "metric"],
    )
    trained = GaugeMetricFamily(
        "whalegen_forecast_model_age_seconds",
        "Seconds since the active model was trained.",
        labels=["kind", "scope"],
    )
    for row in sorted(readings.forecast_models, key=lambda r: (r["kind"], _scope_label(r))):
        labels = [row["kind"], _scope_label(row)]
        version.add_metric(labels, row["version"])
        trained.add_metric(labels, _age_s(now, row["trained_at"]) or 0.0)
        for metric, value in forecast_headline(row["metrics"] or {}):
            score.add_metric([*labels, metric], value)
    yield from (version, score, trained)


class PlaneCollector:
    """A custom collector: reads the database when scraped, never caches between scrapes."""

    def __init__(self, *, now: datetime) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        readings = plane_readings(now=self.now)
        yield from families(readings)
        read = GaugeMetricFamily(
            "whalegen_metrics_scrape_seconds",
            "Time this scrape spent reading the database and building metrics.",
        )
        read.add_metric([], time.perf_counter() - started)
        yield read


def registry_for(*, now: datetime) -> CollectorRegistry:
    """A registry of its own per scrape: the clock is an argument, and the process' default registry
    (Python GC and process metrics) is left out — gunicorn runs several workers, each would differ."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlaneCollector(now=now))
    return registry
