"""The forecasting tasks run through the real Redis broker with a real worker."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.utils import timezone

from apps.forecasting.models import ForecastModel, TaskForecast
from apps.workloads.models import Task, TaskProfile
from apps.workloads.services import TaskSubmission, task_submit
from tests.apps.forecasting.runs import make_runs


@pytest.mark.django_db(transaction=True)
def test_training_forecasting_and_profiles_run_on_a_worker_through_redis(world) -> None:
    from celery.contrib.testing.worker import start_worker

    from apps.forecasting import tasks
    from whalegen.config.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis://"), "run with REDIS_URL set: this test needs Redis"
    assert not app.conf.task_always_eager
    assert not settings.WHALEGEN_FORECAST_INLINE
    # Messages left by earlier runs name tasks of a test database that no longer exists.
    app.control.purge()
    make_runs(world.queue_a, 200, now=timezone.now())
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=60):
        trained = tasks.forecasting_train.delay("duration").get(timeout=120)
        # A submission commits, and its forecast is made on the worker (the message goes via Redis).
        task, _ = task_submit(
            tenant=world.tenant_a,
            request=TaskSubmission(queue="train", profile_key="bert"),
            submitted_by=world.alice,
        )
        for _ in range(300):
            if TaskForecast.objects.filter(task=task).exists():
                break
            time.sleep(0.1)
        forecast_id = tasks.task_forecast.delay(task.pk).get(timeout=60)
        refreshed = tasks.profiles_refresh.delay().get(timeout=60)
        bounded = tasks.memory_bounds_refresh.delay().get(timeout=60)
    assert trained["promoted"] and trained["version"] == 1, trained
    assert ForecastModel.objects.get(pk=trained["model_id"]).state == "active"
    forecast = TaskForecast.objects.get(task=task)
    assert forecast.pk == forecast_id and (forecast.source, forecast.model_version) == ("model", 1)
    assert 2_400 < Task.objects.get(pk=task.pk).predicted_duration_p50_s < 5_400
    assert refreshed == 4 and TaskProfile.objects.filter(tenant=world.tenant_a).count() == 4
    assert bounded == 0  # no memory-peak model is active: no bound is made up
