"""Celery tasks for forecasting: thin, idempotent, taking ids and kinds."""

from __future__ import annotations

from celery import shared_task

from apps.forecasting import services
from apps.forecasting.models import ForecastModel
from apps.inventory.models import Pool


def _outcome(outcome: services.TrainingOutcome) -> dict[str, object]:
    return {
        "kind": outcome.kind,
        "model_id": outcome.model.pk if outcome.model else None,
        "version": outcome.model.version if outcome.model else None,
        "promoted": outcome.promoted,
        "reason": outcome.reason,
    }


@shared_task(name="apps.forecasting.tasks.forecasting_train")
def forecasting_train(kind: str, pool_id: int | None = None) -> dict[str, object]:
    """Train one candidate of `kind` (plane-wide, or for one pool). Running it twice stores two
    candidates; at most one is promoted, since the second must beat the first to replace it."""
    pool = Pool.objects.get(pk=pool_id) if pool_id is not None else None
    return _outcome(services.forecast_model_train(kind=kind, pool=pool))


@shared_task(name="apps.forecasting.tasks.forecasting_train_all")
def forecasting_train_all() -> list[dict[str, object]]:
    """Beat entry "forecasting-train": the plane-wide duration and memory-peak models, then arrivals
    and idle GPUs for every pool."""
    results = [
        _outcome(services.forecast_model_train(kind=ForecastModel.Kind.DURATION)),
        _outcome(services.forecast_model_train(kind=ForecastModel.Kind.MEMORY_PEAK)),
    ]
    for pool in Pool.objects.order_by("name"):
        for kind in (ForecastModel.Kind.ARRIVALS, ForecastModel.Kind.IDLE_GPUS):
            results.append(_outcome(services.forecast_model_train(kind=kind, pool=pool)))
    return results


@shared_task(name="apps.forecasting.tasks.task_forecast")
def task_forecast(task_id: int) -> int | None:
    """Attach a task's forecast if it has none yet; returns the forecast's id (None: no such task)."""
    forecast = services.task_forecast_attach(task_id=task_id)
    return forecast.pk if forecast else None


@shared_task(name="apps.forecasting.tasks.tasks_forecast")
def tasks_forecast(task_ids: list[int]) -> list[int]:
    """Attach forecasts to a submitted batch (one history read for all); returns the forecast ids."""
    return [f.pk for f in services.tasks_forecast_attach(task_ids=task_ids)]


@shared_task(name="apps.forecasting.tasks.profiles_refresh")
def profiles_refresh() -> int:
    """Beat entry "forecasting-profiles": refold every profile with recent finished runs."""
    return services.profiles_refresh()


@shared_task(name="apps.forecasting.tasks.memory_bounds_refresh")
def memory_bounds_refresh() -> int:
    """Beat entry "forecasting-memory-bounds": the next-hour memory bound of every running task."""
    return services.memory_bounds_refresh()
