"""Reads for the forecasting plane: training rows from finished tasks, the registry, profiles."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from django.db.models import (
    Avg,
    Count,
    Exists,
    FloatField,
    IntegerField,
    Max,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, TruncMinute

from apps.fleet.models import GpuSample, TaskSample
from apps.forecasting.models import ForecastModel
from apps.inventory.models import Gpu, Pool
from apps.scheduling.models import Cycle
from apps.scheduling.snapshot.pool import PoolShapeMix
from apps.tenants.models import Tenant
from apps.tenants.selectors import Access
from apps.workloads.models import Task, TaskProfile
from whalegen.forecast.arrivals import OTHER, ArrivalModel, expected_shape_mix, forecast_arrivals
from whalegen.forecast.profiles import MIN_BUSY_SM_PCT
from whalegen.placement.types import Shape, ShapeMix
from whalegen.scheduling.precarve import ShapeForecast

logger = logging.getLogger(__name__)

# Columns of a duration row. `tenant` and `profile_key` form the history key (what "the same kind of
# task" means on this plane); the request columns are the features the pure model learns from.
DURATION_KEY_COLS = ("tenant", "profile_key")
DURATION_FEATURE_COLS = (
    "pool", "kind", "sla_class", "gpu_count", "gpu_milli", "gpu_mem_mib", "cpu_milli", "host_mem_mib",
)  # fmt: skip
_TEXT_COLS = ("tenant", "profile_key", "pool", "kind", "sla_class")


def _epoch_s(values: pd.Series) -> np.ndarray:
    # Through `timestamp()`: pandas' integer view of a datetime column is in its own unit (µs or ns
    # depending on how the column was built), which would silently rescale every duration.
    return np.asarray([np.nan if v is None or pd.isna(v) else v.timestamp() for v in values], np.float64)


def duration_frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    """Rows (dicts with the columns above, `start` and optionally `end` datetimes) as the pure API's
    frame: text columns as str, numbers as float (a missing memory request is NaN, not a category),
    and `start_s` / `end_s` in epoch seconds."""
    frame = pd.DataFrame(rows, columns=[*_TEXT_COLS, *DURATION_FEATURE_COLS[3:], "start", "end"])
    for col in _TEXT_COLS:
        frame[col] = frame[col].astype(str)
    for col in DURATION_FEATURE_COLS[3:]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(np.float64)
    frame["start_s"] = _epoch_s(frame["start"])
    frame["end_s"] = _epoch_s(frame["end"])
    return frame


def _row_values(queryset: QuerySet[Task]) -> list[dict[str, object]]:
    return [
        {
            "tenant": r["tenant_id"],
            "profile_key": r["profile_key"],
            "pool": r["pool__name"],
            "kind": r["kind"],
            "sla_class": r["sla_class"],
            "gpu_count": r["gpu_count"],
            "gpu_milli": r["gpu_milli"],
            "gpu_mem_mib": r["gpu_mem_mib"],
            "cpu_milli": r["cpu_milli"],
            "host_mem_mib": r["host_mem_mib"],
            "id": r["id"],
            "start": r["started_at"],
            "end": r["finished_at"],
        }
        for r in queryset.values(
            "id",
            "tenant_id",
            "profile_key",
            "pool__name",
            "kind",
            "sla_class",
            "gpu_count",
            "gpu_milli",
            "gpu_mem_mib",
            "cpu_milli",
            "host_mem_mib",
            "started_at",
            "finished_at",
        )
    ]


def finished_runs(
    *, until: datetime, since: datetime | None = None, pool: Pool | None = None, tenant: Tenant | None = None
) -> QuerySet[Task]:
    """Tasks that ran to success and finished by `until`: their run time (started → finished, both set
    by the state machine) is a duration the plane knows. Failed and cancelled runs are left out: their
    time says when they stopped, not how long the work takes."""
    queryset = Task.objects.filter(
        state=Task.State.SUCCEEDED,
        started_at__isnull=False,
        finished_at__isnull=False,
        finished_at__lte=until,
    )
    if since is not None:
        queryset = queryset.filter(started_at__gte=since)
    if pool is not None:
        queryset = queryset.filter(pool=pool)
    if tenant is not None:
        queryset = queryset.filter(tenant=tenant)
    return queryset.order_by("started_at", "id")


def training_rows_duration(
    *,
    until: datetime,
    since: datetime | None = None,
    pool: Pool | None = None,
    tenant: Tenant | None = None,
    limit: int | None = None,
) -> pd.DataFrame:
    """Finished runs as duration rows, time-ordered; `limit` keeps the latest ones."""
    queryset = finished_runs(until=until, since=since, pool=pool, tenant=tenant)
    if limit is not None:
        ids = list(queryset.order_by("-started_at", "-id").values_list("id", flat=True)[:limit])
        queryset = queryset.filter(id__in=ids)
    return duration_frame(_row_values(queryset))


def tasks_duration_rows(*, tasks: list[Task]) -> pd.DataFrame:
    """Rows of tasks being submitted (no start or end yet), in the order given."""
    rows = {r["id"]: r for r in _row_values(Task.objects.filter(pk__in=[t.pk for t in tasks]))}
    return duration_frame([rows[t.pk] for t in tasks])


def training_rows_arrivals(*, pool: Pool, until: datetime, since: datetime) -> tuple[np.ndarray, list[str]]:
    """Submission times (epoch s) and shape labels (`gpu_count=…|gpu_milli=…`) of a pool's tasks."""
    rows = list(
        Task.objects.filter(pool=pool, created_at__gte=since, created_at__lt=until)
        .order_by("created_at", "id")
        .values_list("created_at", "gpu_count", "gpu_milli")
    )
    times = np.asarray([r[0].timestamp() for r in rows], dtype=np.float64)
    return times, [f"gpu_count={r[1]}|gpu_milli={r[2]}" for r in rows]


def forecast_model_active(
    *, kind: str, pool: Pool | None = None, tenant: Tenant | None = None
) -> ForecastModel | None:
    return ForecastModel.objects.filter(
        kind=kind, pool=pool, tenant=tenant, state=ForecastModel.State.ACTIVE
    ).first()


def _active_pool_model_row(kind: str, pool_id: int, *columns: str) -> tuple[object, ...] | None:
    """The named columns of the pool-wide (no tenant) active model of `kind`, or None: the charts and the
    shape mix read a version and the blob or id, never the whole row."""
    return (
        ForecastModel.objects.filter(
            kind=kind, pool_id=pool_id, tenant=None, state=ForecastModel.State.ACTIVE
        )
        .values_list(*columns)
        .first()
    )


def forecast_model_list() -> QuerySet[ForecastModel]:
    """The registry. Every signed-in caller may read it (kinds, versions, metrics); the envelope bytes
    are deferred here and only the admin serializer ever shows their size."""
    return ForecastModel.objects.select_related("pool", "tenant").defer("blob")


def profile_list(*, access: Access) -> QuerySet[TaskProfile]:
    queryset = TaskProfile.objects.select_related("tenant")
    if access.platform_admin:
        return queryset.all()
    return queryset.filter(tenant_id__in=access.tenant_ids)


def gpu_models_by_tenant(*, tenant_ids: list[int]) -> dict[int, list[str]]:
    """The GPU models of the pools each tenant holds a quota in (one query): what right-sizing advice
    is given for."""
    out: dict[int, set[str]] = {}
    for tenant_id, model in (
        Gpu.objects.filter(node__pool__quotas__tenant_id__in=tenant_ids)
        .values_list("node__pool__quotas__tenant_id", "model")
        .distinct()
    ):
        out.setdefault(tenant_id, set()).add(model)
    return {tenant_id: sorted(models) for tenant_id, models in out.items()}


# ---------------------------------------------------------------------------------------- telemetry


def _gpu_util_at() -> Subquery:
    # The agent stamps a heartbeat's GPU and process samples with the same instant (`_store_telemetry`),
    # so the GPU's duty cycle at a task sample is the GpuSample of the same GPU and instant.
    return Subquery(
        GpuSample.objects.filter(gpu_id=OuterRef("gpu_id"), at=OuterRef("at"))
        .order_by()
        .values("util_gpu_pct")[:1],
        output_field=IntegerField(),
    )


def profile_telemetry(
    *, tenant: Tenant, profile_key: str, since: datetime, until: datetime, limit: int
) -> list[tuple[str, float, float | None, float | None]]:
    """The key's telemetry as `(series, time_s, gpu_util_pct, gpu_mem_mib)` for
    `whalegen.forecast.profiles.build_profile`, aggregated in SQL: one row per task, GPU and instant
    (the memory of all the task's processes on that GPU summed), the latest `limit` rows. The series id
    is `task:gpu`, so a peak is what one GPU had to hold and a pattern is one device's curve."""
    rows = (
        TaskSample.objects.filter(
            task__tenant=tenant, task__profile_key=profile_key, at__gte=since, at__lte=until
        )
        .values("task_id", "gpu_id", "at")
        .annotate(mem=Sum("used_mib"), util=_gpu_util_at())
        .order_by("-at", "task_id", "gpu_id")[:limit]
    )
    return [
        (
            f"{r['task_id']}:{r['gpu_id']}",
            r["at"].timestamp(),
            None if r["util"] is None else float(r["util"]),
            None if r["mem"] is None else float(r["mem"]),
        )
        for r in rows
    ]


def bound_telemetry(
    *, tenant: Tenant, profile_key: str, since: datetime, until: datetime
) -> tuple[int, float | None, float | None]:
    """`(samples, mean SM %, mean memory-controller %)` of the key's tasks while each ran alone on a busy
    GPU, for `whalegen.forecast.profiles.classify_bound`: one aggregate over the key's process samples of
    the GPU sample taken at the same instant on the same GPU (the agent stamps both with one instant).
    Instants at which the GPU also ran another task are left out: NVML reports the GPU's utilisation,
    not a process's, so a shared GPU's reading belongs to no one task (docs/notes/goodput-design.md §10)."""

    def at_instant(field: str) -> Subquery:
        return Subquery(
            GpuSample.objects.filter(gpu_id=OuterRef("gpu_id"), at=OuterRef("at"))
            .order_by()
            .values(field)[:1]
        )

    shared = TaskSample.objects.filter(gpu_id=OuterRef("gpu_id"), at=OuterRef("at")).exclude(
        task_id=OuterRef("task_id")
    )
    row = (
        TaskSample.objects.filter(
            task__tenant=tenant, task__profile_key=profile_key, at__gte=since, at__lte=until
        )
        .annotate(sm=at_instant("util_gpu_pct"), mc=at_instant("util_mem_pct"))
        .exclude(Exists(shared))
        .filter(sm__gte=MIN_BUSY_SM_PCT, mc__isnull=False)
        .aggregate(n=Count("id"), sm_mean=Avg("sm"), mc_mean=Avg("mc"))
    )
    return row["n"], row["sm_mean"], row["mc_mean"]


def profile_keys_with_telemetry(*, since: datetime, until: datetime) -> set[tuple[int, str]]:
    """(tenant id, profile key) of tasks with telemetry in the window: running tasks have a profile
    before any of them finishes."""
    return set(
        TaskSample.objects.filter(at__gte=since, at__lte=until)
        .exclude(task__profile_key="")
        .values_list("task__tenant_id", "task__profile_key")
        .distinct()
    )


def task_memory_series(
    *, since: datetime, until: datetime, task_ids: list[int] | None = None, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-task GPU memory series for the memory-peak model: at each instant, the most any one GPU of
    the task held (its processes on that GPU summed), aggregated in SQL; the latest `limit` rows,
    returned in time order as (task ids, epoch seconds, MiB)."""
    queryset = TaskSample.objects.filter(at__gte=since, at__lte=until, used_mib__isnull=False)
    if task_ids is not None:
        queryset = queryset.filter(task_id__in=task_ids)
    per_gpu = list(
        queryset.values("task_id", "gpu_id", "at")
        .annotate(mem=Sum("used_mib"))
        .order_by("-at", "task_id", "gpu_id")[:limit]
        .values_list("task_id", "at", "mem")
    )
    top: dict[tuple[int, float], float] = {}
    for task_id, at, mem in per_gpu:
        key = (task_id, at.timestamp())
        top[key] = max(top.get(key, 0.0), float(mem))
    ordered = sorted(top.items(), key=lambda item: (item[0][1], item[0][0]))
    return (
        np.asarray([k[0] for k, _ in ordered], dtype=np.int64),
        np.asarray([k[1] for k, _ in ordered], dtype=np.float64),
        np.asarray([v for _, v in ordered], dtype=np.float64),
    )


def largest_gpu_mem_mib() -> int | None:
    return Gpu.objects.aggregate(mib=Max("mem_mib"))["mib"]


def pool_idle_series(*, pool: Pool, since: datetime, until: datetime) -> pd.Series:
    """Idle GPUs of a pool over time, from its scheduling cycles: each cycle records the idle GPU
    (milli) of the pool's schedulable nodes before it placed anything (`stats.fragmentation_before`).
    Averaged per minute in SQL (cycles run every few seconds: at most 1 440 rows a day are read), in
    whole GPUs, indexed by the minute (UTC, tz-naive as the pure series code expects)."""
    rows = list(
        Cycle.objects.filter(pool=pool, started_at__gte=since, started_at__lt=until)
        .annotate(minute=TruncMinute("started_at"))
        .values("minute")
        .annotate(idle=Avg(Cast(KT("stats__fragmentation_before__idle_milli"), FloatField())))
        .order_by("minute")
        .values_list("minute", "idle")
    )
    index = pd.DatetimeIndex([r[0] for r in rows]).tz_convert(None) if rows else pd.DatetimeIndex([])
    return pd.Series([np.nan if r[1] is None else r[1] / 1000.0 for r in rows], index=index, dtype=np.float64)


# ------------------------------------------------------------------------------ forecast shape mix

_LABEL = re.compile(r"^gpu_count=(\d+)\|gpu_milli=(\d+)$")
# Arrivals features look back a week and a day (same slot last week), so that much is read.
_MIX_HISTORY = timedelta(days=8)
# (pool, model, 10-minute bin) → mix: the forecast changes once per bin, cycles run every few seconds.
_MIX_CACHE: dict[tuple[int, int, float], tuple[ShapeMix | None, str]] = {}


def _forecast_mix(pool_id: int, model: ArrivalModel, now: datetime) -> tuple[ShapeMix | None, str]:
    rows = list(
        Task.objects.filter(pool_id=pool_id, created_at__gte=now - _MIX_HISTORY, created_at__lt=now)
        .order_by("created_at", "id")
        .values_list("created_at", "gpu_count", "gpu_milli", "cpu_milli")
    )
    if not rows:
        return None, "no submissions to the pool in the last 8 days to forecast from"
    times = np.asarray([r[0].timestamp() for r in rows], dtype=np.float64)
    labels = [f"gpu_count={r[1]}|gpu_milli={r[2]}" for r in rows]
    shares = expected_shape_mix(forecast_arrivals(model, times, labels, now.timestamp()))
    # The arrivals labels carry GPUs only; a shape's CPU is the median its recent tasks asked for.
    cpu: dict[str, list[int]] = {}
    for label, row in zip(labels, rows, strict=True):
        cpu.setdefault(label, []).append(row[3])
    shapes, weights = [], []
    for label, share in sorted(shares.items(), key=lambda item: (-item[1], item[0])):
        match = _LABEL.match(label)
        if label == OTHER or match is None or share <= 0:
            continue  # the pooled rare shapes have no single shape to weigh
        num_gpu, milli = int(match.group(1)), int(match.group(2))
        cpu_milli = int(np.median(cpu[label])) if label in cpu else 0
        shapes.append(Shape(cpu_milli=cpu_milli, num_gpu=num_gpu, gpu_milli=milli if num_gpu else 0))
        weights.append(share)
    if not shapes:
        return None, "the forecast expects no arrivals of a named shape in the next hour"
    total = sum(weights)
    return ShapeMix(tuple(shapes), tuple(w / total for w in weights)), ""


def pool_shape_mix(*, pool_id: int, now: datetime) -> PoolShapeMix:
    """The pool's expected shape mix over the next hour from its active arrivals model, as a
    `ShapeMix` for placement; without a usable forecast, `mix` is None and the reason is given (the
    cycle then uses the mix of the tasks it knows). Cached per model and 10-minute bin."""
    row = _active_pool_model_row(ForecastModel.Kind.ARRIVALS, pool_id, "id", "version")
    if row is None:
        return PoolShapeMix(None, "history", "no active arrivals model for the pool")
    model_id, version = row
    key = (pool_id, model_id, float(int(now.timestamp()) // 600))
    cached = _MIX_CACHE.get(key)
    if cached is None:  # the envelope is read only when the bin's forecast is not cached yet
        try:
            blob = ForecastModel.objects.filter(pk=model_id).values_list("blob", flat=True).get()
            model = ArrivalModel.from_bytes(bytes(blob))
            cached = _forecast_mix(pool_id, model, now)
        except Exception as exc:  # a forecast must never fail a scheduling cycle: fall back, say why
            logger.exception("forecasting: arrivals v%d cannot forecast the shape mix", version)
            cached = (None, f"arrivals model v{version} failed: {exc}"[:300])
        if len(_MIX_CACHE) > 64:
            _MIX_CACHE.clear()
        _MIX_CACHE[key] = cached
    mix, reason = cached
    if mix is None:
        return PoolShapeMix(None, "history", reason, version)
    return PoolShapeMix(mix, "forecast", f"arrivals model v{version}", version)


# (pool, model, 10-minute bin) → the expected arrivals by shape, for pre-carving (its own cache: the cycle
# asks for it only when pre-carving is on).
_COUNTS_CACHE: dict[tuple[int, int, float], ShapeForecast | None] = {}


def pool_shape_forecast(*, pool_id: int, now: datetime) -> ShapeForecast | None:
    """Expected arrivals per task shape over the next hour from the pool's active arrivals model, with the
    model's held-out confidence in the mix (1 − its mean total-variation distance between the forecast and
    the actual shape mix of an hour); None without a model, a forecast or that figure. Pre-carving idle MIG
    GPUs (whalegen.scheduling.precarve) reads it; like the mix, it never fails a cycle."""
    row = _active_pool_model_row(ForecastModel.Kind.ARRIVALS, pool_id, "id", "version", "metrics")
    if row is None:
        return None
    model_id, version, stored = row
    key = (pool_id, int(model_id), float(int(now.timestamp()) // 600))  # type: ignore[call-overload]
    if key in _COUNTS_CACHE:
        return _COUNTS_CACHE[key]
    forecast: ShapeForecast | None = None
    try:
        tv = (stored or {}).get("models", {}).get("xgboost", {}).get("mix_tv_distance")  # type: ignore[attr-defined]
        blob = ForecastModel.objects.filter(pk=model_id).values_list("blob", flat=True).get()
        model = ArrivalModel.from_bytes(bytes(blob))
        rows = list(
            Task.objects.filter(pool_id=pool_id, created_at__gte=now - _MIX_HISTORY, created_at__lt=now)
            .order_by("created_at", "id")
            .values_list("created_at", "gpu_count", "gpu_milli")
        )
        if rows:
            times = np.asarray([r[0].timestamp() for r in rows], dtype=np.float64)
            labels = [f"gpu_count={r[1]}|gpu_milli={r[2]}" for r in rows]
            ahead = forecast_arrivals(model, times, labels, now.timestamp())
            expected = []
            for label, count in ahead.sum(axis=0).items():
                match = _LABEL.match(str(label))
                if match is not None and count > 0:
                    expected.append((int(match.group(1)), int(match.group(2)), float(count)))
            forecast = ShapeForecast(
                expected=tuple(sorted(expected)),
                horizon_s=float(len(ahead) * model.config.bin_s),
                confidence=None if tv is None or not math.isfinite(tv) else 1.0 - float(tv),
                source=f"arrivals model v{version}",
            )
    except Exception:  # a forecast must never fail a scheduling cycle: no pre-carve this bin
        logger.exception("forecasting: arrivals v%s cannot forecast the pool's arrivals by shape", version)
    if len(_COUNTS_CACHE) > 64:
        _COUNTS_CACHE.clear()
    _COUNTS_CACHE[key] = forecast
    return forecast


def profile_sla_class(*, tenant: Tenant, profile_key: str, since: datetime) -> str:
    """The SLA class most of the key's tasks submitted since `since` asked for ("" when none)."""
    top = (
        Task.objects.filter(tenant=tenant, profile_key=profile_key, created_at__gte=since)
        .values("sla_class")
        .annotate(n=Count("id"))
        .order_by("-n", "sla_class")
        .first()
    )
    return "" if top is None else str(top["sla_class"])


@dataclass(frozen=True)
class ArrivalsBeside:
    """Submissions per bin of the active arrivals model, beside what that model forecast one hour ahead:
    each whole hour's bins as forecast at the start of that hour, and the next hour as forecast now."""

    bin_s: int
    starts: tuple[datetime, ...]
    actual: tuple[float | None, ...]  # None for bins still to come
    forecast: tuple[float | None, ...]  # None where no forecast was made (before the window's first hour)
    reason: str  # why there is no forecast line, when there is none
    model_version: int | None = None


ARRIVALS_BESIDE_HOURS = 6  # a forecast per hour is made here on request: six of them at most


def pool_arrivals_beside(*, pool_id: int, now: datetime) -> ArrivalsBeside:
    """The last ARRIVALS_BESIDE_HOURS of submissions to the pool and the next hour, with the active
    arrivals model's one-hour-ahead forecast of each hour (summed over task shapes)."""
    bin_s = 600
    row = _active_pool_model_row(ForecastModel.Kind.ARRIVALS, pool_id, "blob", "version")
    model = ArrivalModel.from_bytes(bytes(row[0])) if row is not None else None
    if model is not None:
        bin_s = model.config.bin_s
    hour_s = 3600
    end_s = math.floor(now.timestamp() / bin_s) * bin_s + hour_s
    start_s = math.floor((now.timestamp() - ARRIVALS_BESIDE_HOURS * hour_s) / hour_s) * hour_s
    n = int((end_s - start_s) // bin_s)
    now_s = now.timestamp()
    actual: list[float | None] = [0.0] * n
    rows: list[tuple[datetime, int, int]] = []
    if model is None:
        # Only the window's counts are drawn: counted per minute in the database (a 10,000-task pool
        # would otherwise send every row to be counted here). Every time zone's offset is whole
        # minutes, so a minute never straddles two bins.
        since = datetime.fromtimestamp(start_s, tz=now.tzinfo)
        window = Task.objects.filter(pool_id=pool_id, created_at__gte=since, created_at__lt=now)
        per_minute = window.annotate(minute=TruncMinute("created_at")).values("minute").order_by()
        for r in per_minute.annotate(n=Count("id")):
            actual[int((r["minute"].timestamp() - start_s) // bin_s)] += r["n"]
        times = np.zeros(0, dtype=np.float64)
    else:
        # The model's features look back 8 days and need every submission's time and shape.
        history_from = datetime.fromtimestamp(start_s, tz=now.tzinfo) - _MIX_HISTORY
        rows = list(
            Task.objects.filter(pool_id=pool_id, created_at__gte=history_from, created_at__lt=now)
            .order_by("created_at", "id")
            .values_list("created_at", "gpu_count", "gpu_milli")
        )
        times = np.asarray([r[0].timestamp() for r in rows], dtype=np.float64)
        for t in times[times >= start_s]:
            actual[int((t - start_s) // bin_s)] += 1
    for i in range(n):
        if start_s + i * bin_s >= now_s:
            actual[i] = None
    forecast: list[float | None] = [None] * n
    reason = ""
    if model is None:
        reason = "no active arrivals model for this pool yet (one is trained once it has enough history)"
    elif not len(times):
        reason = "no submissions to forecast from"
    else:
        labels = [f"gpu_count={r[1]}|gpu_milli={r[2]}" for r in rows]
        origins = [
            start_s + h * hour_s for h in range(ARRIVALS_BESIDE_HOURS + 1) if start_s + h * hour_s < now_s
        ]
        origins.append(math.floor(now_s / bin_s) * bin_s)
        for origin in sorted(set(origins)):
            try:
                ahead = forecast_arrivals(model, times, labels, origin)
            except Exception as exc:  # a chart must not fail the page
                logger.exception("forecasting: arrivals v%s cannot forecast for the dashboard", row[1])
                reason = f"arrivals model v{row[1]} failed: {exc}"[:300]
                break
            for bin_start, expected in zip(ahead.index, ahead.sum(axis=1), strict=True):
                i = int((bin_start - start_s) // bin_s)
                if 0 <= i < n:
                    forecast[i] = float(expected)
    return ArrivalsBeside(
        bin_s=bin_s,
        starts=tuple(datetime.fromtimestamp(start_s + i * bin_s, tz=now.tzinfo) for i in range(n)),
        actual=tuple(actual),
        forecast=tuple(forecast),
        reason=reason,
        model_version=row[1] if row is not None else None,
    )


# ------------------------------------------------------------------------- idle GPUs beside the actuals


@dataclass(frozen=True)
class IdleBeside:
    """Idle GPUs of a pool per bin (the mean of what its cycles recorded before placing), beside what the
    active idle-GPU model forecast one hour ahead: each bin as forecast an hour before it, from the bins
    up to then, and the next hour as forecast now."""

    bin_s: int
    starts: tuple[datetime, ...]
    actual: tuple[float | None, ...]  # None for bins without a cycle and for bins still to come
    forecast: tuple[float | None, ...]  # None where the model had no history to forecast from
    reason: str  # why there is no forecast line, when there is none
    model_version: int | None = None
    horizon_s: int = 3_600


IDLE_BESIDE_HOURS = 6
IDLE_BESIDE_HORIZON_S = 3_600  # the envelope holds +10 and +60 minutes; the chart draws the hour ahead
# The model's features look back a week at the target slot plus a day's window: that much is read, once
# per (pool, model, bin) — the forecasts of a bin never change once it has started.
_IDLE_FEATURE_HISTORY = timedelta(days=8)
_IDLE_CACHE: dict[tuple[int, int, int], dict[float, float]] = {}


def _idle_grid(pool: Pool, since: datetime, until: datetime, bin_s: int) -> pd.Series:
    """The pool's idle GPUs on a regular grid of `bin_s` (tz-naive UTC), NaN where no cycle ran."""
    raw = pool_idle_series(pool=pool, since=since, until=until)
    first = pd.Timestamp(math.floor(since.timestamp() / bin_s) * bin_s, unit="s")
    last = pd.Timestamp(math.floor(until.timestamp() / bin_s) * bin_s, unit="s")
    grid = pd.date_range(first, last, freq=f"{bin_s}s")
    if raw.empty:
        return pd.Series(np.nan, index=grid, dtype=np.float64)
    return raw.resample(f"{bin_s}s").mean().reindex(grid).astype(np.float64)


def _idle_forecasts(pool: Pool, blob: bytes, since: datetime, now: datetime) -> dict[float, float]:
    """Target bin start (epoch s) → the idle GPUs the model forecast for it an hour before, for the
    targets from `since` on."""
    from whalegen.forecast.series import SeriesModel, build_rows, predict_rows
    from whalegen.forecast.store import load_model

    horizons = load_model(blob, "idle_gpus").meta["horizons"]
    model = SeriesModel.from_bytes(horizons[str(IDLE_BESIDE_HORIZON_S)].encode())
    window_from = since - timedelta(seconds=model.config.horizon_s)  # the first target's origin
    y = _idle_grid(pool, window_from - _IDLE_FEATURE_HISTORY, now, model.config.bin_s)
    if y.notna().sum() == 0:
        return {}
    scale = model.scales.get(pool.name, float(np.nanmax(y.to_numpy())) or 1.0)
    rows = build_rows(y, model.config, scale)
    rows = rows[(rows["origin"] >= pd.Timestamp(window_from.timestamp(), unit="s")) & rows["last"].notna()]
    if rows.empty:
        return {}
    predicted = predict_rows(model, rows)
    return {
        float(t.timestamp()): max(0.0, float(v))
        for t, v in zip(rows["target_time"].dt.tz_localize("UTC"), predicted, strict=True)
    }


def pool_idle_beside(*, pool: Pool, now: datetime) -> IdleBeside:
    """The last IDLE_BESIDE_HOURS of the pool's idle GPUs and the next hour, beside the active idle-GPU
    model's one-hour-ahead forecast of each bin (two queries; four when the bin's forecast is not cached)."""
    bin_s = 600
    row = _active_pool_model_row(ForecastModel.Kind.IDLE_GPUS, pool.pk, "id", "version")
    hour_s = 3_600
    now_s = now.timestamp()
    end_s = math.floor(now_s / bin_s) * bin_s + IDLE_BESIDE_HORIZON_S
    start_s = math.floor((now_s - IDLE_BESIDE_HOURS * hour_s) / hour_s) * hour_s
    n = int((end_s - start_s) // bin_s)
    since = datetime.fromtimestamp(start_s, tz=now.tzinfo)
    seen = _idle_grid(pool, since, now, bin_s)
    by_start = {float(t.timestamp()): v for t, v in zip(seen.index.tz_localize("UTC"), seen, strict=True)}
    starts = [start_s + i * bin_s for i in range(n)]
    actual = [None if s >= now_s or np.isnan(by_start.get(s, np.nan)) else float(by_start[s]) for s in starts]
    forecasts: dict[float, float] = {}
    reason = ""
    if row is None:
        reason = "no active idle-GPU model for this pool yet (one is trained once it has 3 days of cycles)"
    else:
        model_id, version = row
        key = (pool.pk, model_id, int(now_s // bin_s))
        cached = _IDLE_CACHE.get(key)
        if cached is None:
            try:
                blob = ForecastModel.objects.filter(pk=model_id).values_list("blob", flat=True).get()
                cached = _idle_forecasts(pool, bytes(blob), since, now)
            except Exception as exc:  # a chart must not fail the page
                logger.exception("forecasting: idle GPUs v%s cannot forecast for the dashboard", version)
                cached = {}
                reason = f"idle-GPU model v{version} failed: {exc}"[:300]
            if len(_IDLE_CACHE) > 64:
                _IDLE_CACHE.clear()
            if not reason:
                _IDLE_CACHE[key] = cached
        forecasts = cached
        if not forecasts and not reason:
            reason = "no cycle recorded idle GPUs in the hours the forecasts start from"
    return IdleBeside(
        bin_s=bin_s,
        starts=tuple(datetime.fromtimestamp(s, tz=now.tzinfo) for s in starts),
        actual=tuple(actual),
        forecast=tuple(forecasts.get(float(s)) for s in starts),
        reason=reason,
        model_version=row[1] if row is not None else None,
    )
