"""Writes for the forecasting plane: train → validate → promote, predictions at submission, profiles.

The learning itself is the pure `whalegen.forecast` package; this module feeds it rows from the
database, keeps every model envelope with its metrics and windows, and applies `should_promote`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.forecasting import selectors
from apps.forecasting.models import ForecastModel, TaskForecast
from apps.inventory.models import Pool
from apps.tenants.models import Tenant
from apps.workloads.models import Task, TaskProfile
from whalegen.forecast import arrivals as pure_arrivals
from whalegen.forecast import durations as pure_durations
from whalegen.forecast import memory as pure_memory
from whalegen.forecast import series as pure_series
from whalegen.forecast.profiles import build_profile, classify_bound
from whalegen.forecast.store import PromotionDecision, dump_model, load_model, should_promote

logger = logging.getLogger(__name__)

DURATION_METRIC = "log_mae"  # what the duration model is promoted on (lower is better)
ARRIVALS_METRIC = "poisson_deviance"  # expected counts are means: deviance scores a mean
VALIDATION_SHARE = 0.2  # the latest 20 % of runs (by start) validate; earlier ones train
MIN_DURATION_ROWS = 80  # the pure trainer needs ≥ 50 rows before the split; 80 × 0.8 = 64
MIN_ARRIVALS = 100
IDLE_METRIC = "mae"  # idle GPUs at +10 / +60 minutes, against persistence, yesterday, window mean
IDLE_HORIZONS_S = (600, 3_600)
IDLE_BIN_S = 600
MIN_IDLE_DAYS = 3  # "same slot yesterday" needs a day before the first origin; then train and validate
MIN_MEMORY_SAMPLES = 500  # task × instant samples; the pure trainer needs ≥ 70 training origins
# The memory model is promoted on under-prediction at comparable memory saved against these rule
# baselines (both calibrated to the same target rate as the model): the request and the plane-wide P99
# are reported, not compared (one saves nothing, the other is not calibrated to the target).
MEMORY_BASELINES = ("peak_so_far", "window_max")
# Key history a baseline stands on: with fewer finished runs of the key the plane's median is used.
MIN_KEY_HISTORY = 3
_MODEL_CACHE: dict[int, object] = {}  # ForecastModel.pk → loaded model; envelopes never change


@dataclass(frozen=True)
class TrainingOutcome:
    kind: str
    model: ForecastModel | None  # None when there was nothing to train on
    promoted: bool
    reason: str


def _lookback() -> timedelta:
    return timedelta(days=settings.WHALEGEN_FORECAST_LOOKBACK_DAYS)


def _skip(kind: str, reason: str) -> TrainingOutcome:
    logger.info("forecasting: %s not trained: %s", kind, reason)
    return TrainingOutcome(kind, None, False, reason)


def _load(row: ForecastModel) -> object:
    model = _MODEL_CACHE.get(row.pk)
    if model is None:
        blob = bytes(row.blob)
        if row.kind == ForecastModel.Kind.DURATION:
            model = pure_durations.DurationModel.from_bytes(blob)
        elif row.kind == ForecastModel.Kind.ARRIVALS:
            model = pure_arrivals.ArrivalModel.from_bytes(blob)
        elif row.kind == ForecastModel.Kind.MEMORY_PEAK:
            model = pure_memory.MemoryModel.from_bytes(blob)
        elif row.kind == ForecastModel.Kind.IDLE_GPUS:
            model = idle_models_from_bytes(blob)
        else:
            raise ValueError(f"no loader for {row.kind}")
        if len(_MODEL_CACHE) > 16:
            _MODEL_CACHE.clear()
        _MODEL_CACHE[row.pk] = model
    return model


def _json_safe(value: object) -> object:
    """Metrics as PostgreSQL JSON accepts them: an undefined figure (NaN, e.g. a Spearman over constant
    predictions) becomes null, which `should_promote` already treats as "cannot promote on it"."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _as_dt(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(float(epoch_s), tz=UTC)


def _store(
    *,
    kind: str,
    pool: Pool | None,
    tenant: Tenant | None,
    blob: bytes,
    metrics: dict[str, object],
    windows: tuple[datetime, datetime, datetime, datetime],
    promote: bool,
    reason: str,
    now: datetime,
) -> ForecastModel:
    """Store a candidate; on promotion retire the active model of the scope in the same transaction.
    The active row is locked first, so two trainings of one scope serialise; the partial unique
    constraint is the last guard against two actives."""
    with transaction.atomic():
        active = list(
            ForecastModel.objects.select_for_update().filter(
                kind=kind, pool=pool, tenant=tenant, state=ForecastModel.State.ACTIVE
            )
        )
        last = ForecastModel.objects.filter(kind=kind, pool=pool, tenant=tenant).aggregate(v=Max("version"))
        if promote:
            ForecastModel.objects.filter(pk__in=[a.pk for a in active]).update(
                state=ForecastModel.State.RETIRED, retired_at=now
            )
        row = ForecastModel.objects.create(
            kind=kind,
            pool=pool,
            tenant=tenant,
            scope=ForecastModel.scope_of(pool, tenant),
            version=(last["v"] or 0) + 1,
            state=ForecastModel.State.ACTIVE if promote else ForecastModel.State.CANDIDATE,
            blob=blob,
            metrics=_json_safe(metrics),
            train_start=windows[0],
            train_end=windows[1],
            validation_start=windows[2],
            validation_end=windows[3],
            trained_at=now,
            promoted_at=now if promote else None,
            decision_reason=reason[:500],
        )
    logger.info(
        "forecasting: %s v%d %s: %s", kind, row.version, "promoted" if promote else "a candidate", reason
    )
    return row


def _train_duration(
    *, pool: Pool | None, tenant: Tenant | None, now: datetime, params: pure_durations.DurationParams | None
) -> TrainingOutcome:
    kind = ForecastModel.Kind.DURATION
    # 1. Finished runs of the lookback window, time-ordered.
    frame = selectors.training_rows_duration(until=now, since=now - _lookback(), pool=pool, tenant=tenant)
    if len(frame) < MIN_DURATION_ROWS:
        return _skip(kind, f"{len(frame)} finished runs in the lookback window; need {MIN_DURATION_ROWS}")
    start_s, end_s = frame["start_s"].to_numpy(), frame["end_s"].to_numpy()
    cfg = pure_durations.DurationConfig(
        key_cols=selectors.DURATION_KEY_COLS, feature_cols=selectors.DURATION_FEATURE_COLS
    )
    # 2. Candidate and baselines on the same time split: earlier runs train, the latest validate.
    try:
        model, evaluation = pure_durations.evaluate_durations(
            frame, start_s, end_s, cfg, split_frac=1.0 - VALIDATION_SHARE, hp=params
        )
    except ValueError as exc:
        return _skip(kind, str(exc))
    scores = evaluation.models
    candidate = scores["xgboost_p50"]
    baselines = {name: s for name, s in scores.items() if name != "xgboost_p50"}
    decision = should_promote(candidate, None, baselines, metric=DURATION_METRIC)
    # 3. The active model on the same validation runs. History features need the same inputs for
    #    both, so both score here with the history frozen at the split (runs finished before it).
    active_row = selectors.forecast_model_active(kind=kind, pool=pool, tenant=tenant)
    same_inputs: dict[str, dict[str, float]] | None = None
    if active_row is not None:
        known = end_s <= evaluation.split_s
        test = start_s >= evaluation.split_s
        actual = np.maximum(end_s[test] - start_s[test], 1.0)

        def p50(m: pure_durations.DurationModel) -> np.ndarray:
            got = pure_durations.predict_durations(
                m, frame[test], start_s[test], frame[known], start_s[known], end_s[known]
            )
            return np.asarray(got[:, 0])

        active_model = _load(active_row)
        assert isinstance(active_model, pure_durations.DurationModel)
        same_inputs = {
            "candidate": pure_durations.duration_scores(actual, p50(model)),
            "active": pure_durations.duration_scores(actual, p50(active_model)),
        }
        if decision.promote:
            decision = should_promote(
                same_inputs["candidate"],
                same_inputs["active"],
                {},
                metric=DURATION_METRIC,
                min_gain=settings.WHALEGEN_FORECAST_MIN_GAIN,
            )
            decision = PromotionDecision(decision.promote, f"{decision.reason} (v{active_row.version})")
    elif decision.promote:
        decision = PromotionDecision(True, f"{decision.reason} (no model was active)")
    # 4. The model that serves is the one validated above, not a refit on every run: a refit is never
    #    scored, and comparing it later under history frozen at a split let a retrain on the very same
    #    runs "beat" it and replace it on noise. The next periodic training folds in the newer runs.
    blob = model.to_bytes()
    metrics = {
        "metric": DURATION_METRIC,
        "models": scores,
        "cold_start_keys": evaluation.cold_start,
        "same_inputs_vs_active": same_inputs,
        "n_train": evaluation.n_train,
        "n_validation": evaluation.n_test,
    }
    windows = (
        _as_dt(start_s.min()),
        _as_dt(evaluation.split_s),
        _as_dt(evaluation.split_s),
        _as_dt(end_s.max()),
    )
    row = _store(
        kind=kind, pool=pool, tenant=tenant, blob=blob, metrics=metrics, windows=windows,
        promote=decision.promote, reason=decision.reason, now=now,
    )  # fmt: skip
    return TrainingOutcome(kind, row, decision.promote, decision.reason)


def _train_arrivals(*, pool: Pool | None, now: datetime) -> TrainingOutcome:
    kind = ForecastModel.Kind.ARRIVALS
    if pool is None:
        return _skip(kind, "arrivals are forecast per pool; name the pool")
    # 1. Submissions of the pool in the lookback window, labelled by shape.
    times, labels = selectors.training_rows_arrivals(pool=pool, until=now, since=now - _lookback())
    if len(times) < MIN_ARRIVALS:
        return _skip(kind, f"{len(times)} submissions to {pool.name} in the window; need {MIN_ARRIVALS}")
    cfg = pure_arrivals.ArrivalConfig()
    # 2. Candidate and baselines on the latest share of the window.
    try:
        model, evaluation = pure_arrivals.evaluate_arrivals(times, labels, cfg, 1.0 - VALIDATION_SHARE)
    except ValueError as exc:
        return _skip(kind, str(exc))
    scores = evaluation.models
    baselines = {name: s for name, s in scores.items() if name != "xgboost"}
    active_row = selectors.forecast_model_active(kind=kind, pool=pool)
    # 3. The active model's expected counts on the same test origins (its own shape classes).
    active_scores: dict[str, float] | None = None
    if active_row is not None:
        active_model = _load(active_row)
        assert isinstance(active_model, pure_arrivals.ArrivalModel)
        counts = pure_arrivals.arrival_counts(times, labels, active_model.shapes, cfg.bin_s)
        first = int(np.searchsorted(counts.index.to_numpy(), evaluation.split_s)) - 1
        origins = np.arange(max(first, 0), len(counts) - cfg.steps)
        rows = pure_arrivals.arrival_rows(counts, cfg, np.asarray(active_model.train_rate), origins)
        expected = active_model.predict_rows(rows)
        active_scores = {ARRIVALS_METRIC: pure_arrivals.poisson_deviance(rows["target"].to_numpy(), expected)}
    decision = should_promote(scores["xgboost"], None, baselines, metric=ARRIVALS_METRIC)
    if decision.promote and active_row is not None and active_scores is not None:
        decision = should_promote(
            scores["xgboost"],
            active_scores,
            {},
            metric=ARRIVALS_METRIC,
            min_gain=settings.WHALEGEN_FORECAST_MIN_GAIN,
        )
        decision = PromotionDecision(decision.promote, f"{decision.reason} (v{active_row.version})")
    elif decision.promote:
        decision = PromotionDecision(True, f"{decision.reason} (no model was active)")
    # 4. Refit on everything up to now when promoted.
    blob = model.to_bytes()
    if decision.promote:
        blob = pure_arrivals.train_arrivals(times, labels, cfg, float(times.max()) + 1.0).to_bytes()
    metrics = {"metric": ARRIVALS_METRIC, "active": active_scores, **evaluation.to_json()}
    split = _as_dt(evaluation.split_s)
    windows = (_as_dt(times.min()), split, split, _as_dt(times.max()))
    row = _store(
        kind=kind, pool=pool, tenant=None, blob=blob, metrics=metrics, windows=windows,
        promote=decision.promote, reason=decision.reason, now=now,
    )  # fmt: skip
    return TrainingOutcome(kind, row, decision.promote, decision.reason)


def idle_models_to_bytes(models: dict[int, pure_series.SeriesModel]) -> bytes:
    """One envelope per pool holding a series model per horizon (each as its own `to_bytes()` text)."""
    meta = {"horizons": {str(h): m.to_bytes().decode() for h, m in sorted(models.items())}}
    return dump_model("idle_gpus", meta, {})


def idle_models_from_bytes(blob: bytes) -> dict[int, pure_series.SeriesModel]:
    env = load_model(blob, "idle_gpus")
    return {
        int(h): pure_series.SeriesModel.from_bytes(text.encode()) for h, text in env.meta["horizons"].items()
    }


def _train_idle_gpus(*, pool: Pool | None, now: datetime) -> TrainingOutcome:
    kind = ForecastModel.Kind.IDLE_GPUS
    if pool is None:
        return _skip(kind, "idle GPUs are forecast per pool; name the pool")
    # 1. The pool's idle-GPU series from its cycle records, on a 10-minute grid (bin mean).
    raw = selectors.pool_idle_series(pool=pool, since=now - _lookback(), until=now)
    if raw.notna().sum() == 0:
        return _skip(kind, f"no cycle of {pool.name} recorded idle GPUs in the window")
    y = pure_series.bin_series(
        pd.Series(raw.index), pd.Series(raw.to_numpy()), IDLE_BIN_S, pure_series.Aggregation.MEAN
    )
    span_days = (y.index[-1] - y.index[0]).total_seconds() / 86_400.0
    if span_days < MIN_IDLE_DAYS:
        return _skip(kind, f"{span_days:.1f} days of idle-GPU records for {pool.name}; need {MIN_IDLE_DAYS}")
    # 2. Time split: the latest 20 % of the span validates, per horizon.
    split_at = (y.index[0] + (y.index[-1] - y.index[0]) * (1.0 - VALIDATION_SHARE)).floor(f"{IDLE_BIN_S}s")
    active_row = selectors.forecast_model_active(kind=kind, pool=pool)
    active = idle_models_from_bytes(bytes(active_row.blob)) if active_row is not None else {}
    models: dict[int, pure_series.SeriesModel] = {}
    per_horizon: dict[str, dict[str, object]] = {}
    reasons, promote = [], True
    for horizon_s in IDLE_HORIZONS_S:
        cfg = pure_series.SeriesConfig(
            horizon_s=horizon_s, bin_s=IDLE_BIN_S, agg=pure_series.Aggregation.MEAN
        )
        try:
            model, evaluation = pure_series.evaluate_series({pool.name: y}, cfg, split_at)
        except ValueError as exc:
            return _skip(kind, f"+{horizon_s // 60} min: {exc}")
        scores = evaluation.models
        baselines = {name: scores[name] for name in pure_series.BASELINES}
        decision = should_promote(scores["xgboost"], None, baselines, metric=IDLE_METRIC)
        # The active model of this horizon on the same validation origins (its own pool scale).
        active_scores = None
        old = active.get(horizon_s)
        if old is not None:
            rows = pure_series.build_rows(y, old.config, old.scales.get(pool.name, float(np.nanmax(y))))
            test = rows[(rows["target_time"] >= split_at) & rows["target"].notna() & rows["last"].notna()]
            if not test.empty:
                predicted = pure_series.predict_rows(old, test)
                active_scores = {IDLE_METRIC: float(np.mean(np.abs(test["target"].to_numpy() - predicted)))}
                if decision.promote:
                    decision = should_promote(
                        scores["xgboost"], active_scores, {}, metric=IDLE_METRIC,
                        min_gain=settings.WHALEGEN_FORECAST_MIN_GAIN,
                    )  # fmt: skip
        models[horizon_s] = model
        per_horizon[str(horizon_s)] = {**evaluation.to_json(), "active": active_scores}
        promote = promote and decision.promote
        reasons.append(f"+{horizon_s // 60} min: {decision.reason}")
    reason = "; ".join(reasons)
    reason += f" (v{active_row.version})" if active_row is not None else " (no model was active)"
    metrics = {"metric": IDLE_METRIC, "unit": "GPUs", "source": "cycle stats", "horizons": per_horizon}
    first, split, last = (t.to_pydatetime().replace(tzinfo=UTC) for t in (y.index[0], split_at, y.index[-1]))
    windows = (first, split, split, last)
    row = _store(
        kind=kind, pool=pool, tenant=None, blob=idle_models_to_bytes(models), metrics=metrics,
        windows=windows, promote=promote, reason=reason, now=now,
    )  # fmt: skip
    return TrainingOutcome(kind, row, promote, reason)


def _train_memory_peak(*, now: datetime) -> TrainingOutcome:
    kind = ForecastModel.Kind.MEMORY_PEAK
    # 1. Per-task GPU memory series from agent telemetry (the latest WHALEGEN_MEMORY_SAMPLE_ROWS).
    ids, times, values = selectors.task_memory_series(
        since=now - _lookback(), until=now, limit=settings.WHALEGEN_MEMORY_SAMPLE_ROWS
    )
    if len(times) < MIN_MEMORY_SAMPLES:
        return _skip(kind, f"{len(times)} task memory samples in the window; need {MIN_MEMORY_SAMPLES}")
    # The reservation without a forecast is the whole device: memory saved is measured against the
    # largest GPU memory of the plane (a bound is never above it either).
    request = selectors.largest_gpu_mem_mib()
    if request is None:
        return _skip(kind, "the plane has no GPU with a known memory size")
    cfg = pure_memory.MemoryConfig()
    # 2. Time split: origins whose next hour ends before the split train (the latest quarter of them
    #    calibrates the margins), origins after it validate.
    try:
        model, evaluation = pure_memory.evaluate_memory(
            ids, times, values, cfg, 1.0 - VALIDATION_SHARE, request=float(request)
        )
    except ValueError as exc:
        return _skip(kind, str(exc))
    scores = evaluation.models
    # 3. The active model on the same validation origins.
    active_row = selectors.forecast_model_active(kind=kind)
    active_scores: dict[str, float] | None = None
    if active_row is not None:
        active_model = _load(active_row)
        assert isinstance(active_model, pure_memory.MemoryModel)
        rows = pure_memory.memory_rows(ids, times, values, active_model.config)
        test = rows[rows["t"] >= evaluation.split_s]
        if not test.empty:
            active_scores = pure_memory.memory_scores(
                test["target"].to_numpy(np.float64), active_model.predict_peak(test), float(request),
                active_model.config.quantile,
            )  # fmt: skip
    promote, reason = pure_memory.memory_promotion(
        scores["xgboost"],
        {name: scores[name] for name in MEMORY_BASELINES},
        active_scores,
        max_under=cfg.target_under,
    )
    if active_row is not None:
        reason = f"{reason} (v{active_row.version})"
    elif promote:
        reason = f"{reason} (no model was active)"
    # 4. The validated model serves (no refit), as for durations.
    metrics = {
        "metric": "under_rate, saved_vs_request",
        "active": active_scores,
        "request_mib": request,
        "n_samples": len(times),
        "n_tasks": len(np.unique(ids)),
        **evaluation.to_json(),
    }
    split = _as_dt(evaluation.split_s)
    windows = (_as_dt(times.min()), split, split, _as_dt(times.max()))
    row = _store(
        kind=kind, pool=None, tenant=None, blob=model.to_bytes(), metrics=metrics, windows=windows,
        promote=promote, reason=reason, now=now,
    )  # fmt: skip
    return TrainingOutcome(kind, row, promote, reason)


def forecast_model_train(
    *,
    kind: str,
    pool: Pool | None = None,
    tenant: Tenant | None = None,
    now: datetime | None = None,
    params: pure_durations.DurationParams | None = None,
) -> TrainingOutcome:
    """Train a candidate of `kind` for a scope, validate it on the latest runs against the baselines and
    the active model, store it, and promote it only when `should_promote` says so (the active model
    is then retired). Every decision is stored on the row and logged with its reason."""
    now = now or timezone.now()
    if kind == ForecastModel.Kind.DURATION:
        return _train_duration(pool=pool, tenant=tenant, now=now, params=params)
    if kind == ForecastModel.Kind.ARRIVALS:
        return _train_arrivals(pool=pool, now=now)
    if kind == ForecastModel.Kind.MEMORY_PEAK:
        return _train_memory_peak(now=now)
    if kind == ForecastModel.Kind.IDLE_GPUS:
        return _train_idle_gpus(pool=pool, now=now)
    raise ValueError(f"unknown forecast kind {kind!r}")


# ------------------------------------------------------------------------------------ task forecasts


def _model_predictions(tasks: list[Task], now: datetime) -> dict[int, dict[str, object]]:
    """P50/P90 of every task that an active duration model serves (pool-scoped first, then
    plane-wide). One history read and one `predict_durations` call per model, whatever the batch size:
    the key-history pass costs ~0.14 ms per history row on the shared host (2.7 s for 20 000 rows)."""
    by_model: dict[int, tuple[ForecastModel, list[Task]]] = {}
    plane_wide = selectors.forecast_model_active(kind=ForecastModel.Kind.DURATION)
    for pool_id in sorted({t.pool_id for t in tasks}):
        row = (
            ForecastModel.objects.filter(
                kind=ForecastModel.Kind.DURATION,
                pool_id=pool_id,
                tenant=None,
                state=ForecastModel.State.ACTIVE,
            ).first()
            or plane_wide
        )
        if row is not None:
            by_model.setdefault(row.pk, (row, []))[1].extend(t for t in tasks if t.pool_id == pool_id)
    out: dict[int, dict[str, object]] = {}
    for row, served in by_model.values():
        try:
            model = _load(row)
        except (ValueError, KeyError) as exc:
            # An envelope this code cannot read (a newer format, a damaged row) must not leave tasks
            # without a forecast: they fall back to the baselines, and the operator is told.
            logger.error("forecasting: duration v%d cannot be loaded (%s); using baselines", row.version, exc)
            continue
        assert isinstance(model, pure_durations.DurationModel)
        history = selectors.training_rows_duration(
            until=now,
            since=now - _lookback(),
            pool=row.pool,
            tenant=row.tenant,
            limit=settings.WHALEGEN_FORECAST_HISTORY_ROWS,
        )
        new = selectors.tasks_duration_rows(tasks=served)
        # Every task of the batch is "submitted now": a burst of identical tasks is a known feature.
        p = pure_durations.predict_durations(
            model, new, np.full(len(served), now.timestamp()), history, history["start_s"].to_numpy(),
            history["end_s"].to_numpy(),
        )  # fmt: skip
        for i, task in enumerate(served):
            out[task.pk] = {
                "duration_p50_s": float(p[i, 0]), "duration_p90_s": float(p[i, 1]),
                "source": TaskForecast.Source.MODEL, "model": row, "model_version": row.version,
            }  # fmt: skip
    return out


def _baseline_prediction(task: Task, now: datetime) -> dict[str, object]:
    """No active model: the key's own history (same tenant and profile key), else the plane's median,
    else nothing; never an invented default."""
    runs = selectors.finished_runs(until=now, since=now - _lookback())
    key_runs = None
    if task.profile_key:
        key_runs = runs.filter(tenant_id=task.tenant_id, profile_key=task.profile_key)
    for baseline, queryset in (("key_history", key_runs), ("global_median", runs)):
        if queryset is None:
            continue
        latest = queryset.order_by("-finished_at")[: settings.WHALEGEN_FORECAST_HISTORY_ROWS]
        spans = [
            (end - start).total_seconds() for start, end in latest.values_list("started_at", "finished_at")
        ]
        if len(spans) >= (MIN_KEY_HISTORY if baseline == "key_history" else 1):
            d = np.maximum(np.asarray(spans, dtype=np.float64), 1.0)
            return {
                "duration_p50_s": float(np.quantile(d, 0.5)), "duration_p90_s": float(np.quantile(d, 0.9)),
                "source": TaskForecast.Source.BASELINE, "baseline": baseline, "history_count": len(d),
            }  # fmt: skip
    return {"source": TaskForecast.Source.NONE}


def tasks_forecast_attach(*, task_ids: list[int], now: datetime | None = None) -> list[TaskForecast]:
    """Attach P50/P90 duration and a memory peak to newly submitted tasks, once each (idempotent: a
    task that already has a forecast keeps it; unknown ids are skipped). The numbers are also copied
    onto the task's `predicted_*` fields, which the scheduling snapshot reads."""
    now = now or timezone.now()
    # 1. The tasks still without a forecast.
    done = {f.task_id: f for f in TaskForecast.objects.filter(task_id__in=task_ids)}
    tasks = list(Task.objects.select_related("pool").filter(pk__in=task_ids).exclude(pk__in=list(done)))
    # 2. Durations: the active model where there is one, the baselines for the rest.
    predicted = _model_predictions(tasks, now)
    # 3. Memory: the profile's observed peak (from telemetry) is what history says; no model serves a
    #    task that has not run yet (the memory model bounds a *running* task's next hour).
    peaks = {
        (tenant_id, key): peak
        for tenant_id, key, peak in TaskProfile.objects.filter(
            tenant_id__in={t.tenant_id for t in tasks},
            profile_key__in={t.profile_key for t in tasks if t.profile_key},
            gpu_mem_peak_mib__isnull=False,
        ).values_list("tenant_id", "profile_key", "gpu_mem_peak_mib")
    }
    # 4. Store each forecast and its copy on the task.
    for task in tasks:
        values = predicted.get(task.pk) or _baseline_prediction(task, now)
        peak = peaks.get((task.tenant_id, task.profile_key))
        if peak is not None:
            values.update(gpu_mem_peak_mib=peak, mem_source="profile_peak")
        with transaction.atomic():
            forecast, created = TaskForecast.objects.get_or_create(task=task, defaults=values)
            if created:
                Task.objects.filter(pk=task.pk).update(
                    predicted_duration_p50_s=forecast.duration_p50_s,
                    predicted_duration_p90_s=forecast.duration_p90_s,
                    predicted_gpu_mem_peak_mib=forecast.gpu_mem_peak_mib,
                )
        done[task.pk] = forecast
    return [done[i] for i in task_ids if i in done]


def task_forecast_attach(*, task_id: int, now: datetime | None = None) -> TaskForecast | None:
    attached = tasks_forecast_attach(task_ids=[task_id], now=now)
    return attached[0] if attached else None


def tasks_forecast_attach_on_commit(*, task_ids: list[int]) -> None:
    """Called by submission, once per submitted batch: forecast the tasks after they are committed (a
    rolled-back batch gets nothing). With a broker the work goes to a worker, so a submission never
    waits for it; without one (embedded default), or with WHALEGEN_FORECAST_INLINE, it runs here. A
    failing forecast never fails or undoes a submission: it is logged and the tasks have none."""
    ids = list(task_ids)

    def attach() -> None:
        try:
            if settings.WHALEGEN_FORECAST_INLINE:
                tasks_forecast_attach(task_ids=ids)
            else:
                from apps.forecasting.tasks import tasks_forecast  # the tasks module imports this one

                # Nobody waits for this result: without ignore_result the Redis backend subscribes to
                # its channel on every submission (a round trip and a tenth of a submission's CPU).
                tasks_forecast.apply_async((ids,), ignore_result=True)
        except Exception:
            logger.exception("forecasting: could not attach forecasts to tasks %s", ids)

    if ids:
        transaction.on_commit(attach)


# ------------------------------------------------------------------------------- memory bounds (running)


def _latest_origin_samples(
    ids: np.ndarray, times: np.ndarray, values: np.ndarray, window_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per task only what the features of its latest origin read: the first sample (age), the first
    sample at the peak so far (peak, time since the peak) and the samples of the last window. One pass
    over the samples sorted by task, then time."""
    order = np.lexsort((times, ids))
    ids, times, values = ids[order], times[order], values[order]
    keep = np.zeros(len(ids), dtype=bool)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    for start, end in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        keep[start] = True
        keep[start + int(np.argmax(values[start:end]))] = True
        keep[start:end] |= times[start:end] > times[end - 1] - window_s
    return ids[keep], times[keep], values[keep]


def memory_bounds_refresh(*, now: datetime | None = None) -> int:
    """Attach the active memory-peak model's bound on the next hour to every running task with enough
    recent telemetry (`min_samples` in the model's window); returns how many tasks got one. Without
    an active model nothing is attached and the reason is logged."""
    now = now or timezone.now()
    row = selectors.forecast_model_active(kind=ForecastModel.Kind.MEMORY_PEAK)
    if row is None:
        logger.info("forecasting: no memory bounds: no memory-peak model is active")
        return 0
    model = _load(row)
    assert isinstance(model, pure_memory.MemoryModel)
    running = list(Task.objects.filter(state=Task.State.RUNNING).values_list("id", flat=True))
    if not running:
        return 0
    ids, times, values = selectors.task_memory_series(
        since=now - _lookback(), until=now, task_ids=running, limit=settings.WHALEGEN_MEMORY_SAMPLE_ROWS
    )
    if not len(ids):
        return 0
    ids, times, values = _latest_origin_samples(ids, times, values, model.config.window_s)
    # Every sample is an origin here, and only each task's last one is kept: the bound from now on.
    rows = pure_memory.memory_rows(
        ids, times, values, replace(model.config, origin_every_s=0), with_target=False
    )
    if rows.empty:
        return 0
    rows = rows.groupby("task", sort=False).tail(1)
    bounds = model.predict_peak(rows)
    request = selectors.largest_gpu_mem_mib()
    bound_of = {
        int(task_id): math.ceil(float(b)) if request is None else min(math.ceil(float(b)), request)
        for task_id, b in zip(rows["task"].to_numpy(), bounds, strict=True)
    }
    # Two writes for the whole batch: the tasks' forecasts updated, the missing ones created (a task
    # whose forecast at submission failed still gets its bound, with source "none" for the rest).
    existing = list(TaskForecast.objects.filter(task_id__in=list(bound_of)))
    for forecast in existing:
        forecast.mem_bound_mib = bound_of[forecast.task_id]
        forecast.mem_bound_at = now
        forecast.mem_bound_model_version = row.version
    fields = ["mem_bound_mib", "mem_bound_at", "mem_bound_model_version"]
    TaskForecast.objects.bulk_update(existing, fields, batch_size=500)
    have = {f.task_id for f in existing}
    TaskForecast.objects.bulk_create(
        [
            TaskForecast(
                task_id=task_id,
                source=TaskForecast.Source.NONE,
                mem_bound_mib=mib,
                mem_bound_at=now,
                mem_bound_model_version=row.version,
            )
            for task_id, mib in bound_of.items()
            if task_id not in have
        ],
        ignore_conflicts=True,  # a submission's forecast made meanwhile wins; the next refresh bounds it
    )
    return len(bound_of)


# ----------------------------------------------------------------------------------------- profiles


def _mib(value: float | None) -> int | None:
    return None if value is None else round(value)


def _share(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


def task_profiles_refresh(*, tenant: Tenant, profile_key: str, now: datetime | None = None) -> TaskProfile:
    """Fold the key's finished runs (duration quantiles) and its agent telemetry (GPU memory peak,
    typical and P95, memory pattern, GPU duty cycle mean / P95 / burstiness) into its TaskProfile.

    Bounded: telemetry is aggregated in SQL to one row per task, GPU and instant, and only the latest
    `WHALEGEN_PROFILE_SAMPLE_ROWS` of those are read. `sample_count` counts finished runs,
    `telemetry_samples` the telemetry rows folded. A key without telemetry keeps empty memory fields
    (never a made-up number), so it gets no right-sizing advice.
    """
    now = now or timezone.now()
    since = now - _lookback()
    runs = selectors.finished_runs(until=now, since=since, tenant=tenant).filter(profile_key=profile_key)
    spans = [max((e - s).total_seconds(), 1.0) for s, e in runs.values_list("started_at", "finished_at")]
    samples = selectors.profile_telemetry(
        tenant=tenant, profile_key=profile_key, since=since, until=now,
        limit=settings.WHALEGEN_PROFILE_SAMPLE_ROWS,
    )  # fmt: skip
    profile = build_profile(samples, spans)
    # Compute- or bandwidth-bound, stored here so that a profile-aware cycle reads it in its snapshot
    # (apps.scheduling.profiles) instead of aggregating the telemetry every cycle.
    bound = classify_bound(
        *selectors.bound_telemetry(tenant=tenant, profile_key=profile_key, since=since, until=now)
    )
    obj, _ = TaskProfile.objects.update_or_create(
        tenant=tenant,
        profile_key=profile_key,
        defaults={
            "sample_count": len(spans),
            "duration_p50_s": profile.duration_p50_s,
            "duration_p90_s": profile.duration_p90_s,
            "gpu_mem_peak_mib": _mib(profile.mem_peak_mib),
            "gpu_mem_typical_mib": _mib(profile.mem_typical_mib),
            "gpu_mem_p95_mib": _mib(profile.mem_p95_mib),
            "gpu_util_mean": _share(profile.util_mean_pct),
            "gpu_util_p95": _share(profile.util_p95_pct),
            "gpu_util_burstiness": profile.util_burstiness,
            "mem_growth": profile.mem_pattern.value if samples else "",
            "sla_class": selectors.profile_sla_class(tenant=tenant, profile_key=profile_key, since=since),
            "telemetry_samples": profile.sample_count,
            "telemetry_tasks": len({series.split(":")[0] for series, *_ in samples}),
            "last_sample_at": None if profile.last_sample_s is None else _as_dt(profile.last_sample_s),
            "bound_class": bound.bound.value,
            "compute_exponent": bound.compute_exponent,
            "bound_sm_util_pct": bound.sm_util_pct,
            "bound_samples": bound.samples,
            "interference_sensitivity": bound.sensitivity,
        },
    )
    return obj


def profiles_refresh(*, now: datetime | None = None) -> int:
    """Refresh every (tenant, profile key) with a finished run or telemetry in the lookback window."""
    now = now or timezone.now()
    keys = set(
        selectors.finished_runs(until=now, since=now - _lookback())
        .exclude(profile_key="")
        .values_list("tenant_id", "profile_key")
        .distinct()
    ) | selectors.profile_keys_with_telemetry(since=now - _lookback(), until=now)
    tenants = {t.pk: t for t in Tenant.objects.filter(pk__in={k[0] for k in keys})}
    count = 0
    for tenant_id, key in sorted(set(keys)):
        task_profiles_refresh(tenant=tenants[tenant_id], profile_key=key, now=now)
        count += 1
    return count
