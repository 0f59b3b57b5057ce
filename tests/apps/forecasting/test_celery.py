"""The forecasting tasks run through the real Redis broker with a real worker."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.utils import timezone

from apps.forecasting.models import ForecastModel, TaskForecast
from apps.workloads.models import TaskProfile
from tests.apps.forecasting.runs import make_runs


@pytest.mark.django_db(transaction=True)
def test_training_forecasting_and_profiles_run_on_a_worker_through_redis(world) -> None:
    from celery.contrib.testing.worker import start_worker

    from apps.forecasting import tasks
    from whalegen.config.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis://"), "run with REDIS_URL set: this test needs Redis"
    assert not app.conf.task_always_eager
    make_runs(world.queue_a, 200, now=timezone.now())
    TaskForecast.objects.filter(task=world.task_b).delete()  # made at submission (real commits here)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=60):
        trained = tasks.forecasting_train.delay("duration").get(timeout=120)
        forecast_id = tasks.task_forecast.delay(world.task_b.pk).get(timeout=60)
        again = tasks.task_forecast.delay(world.task_b.pk).get(timeout=60)
        refreshed = tasks.profiles_refresh.delay().get(timeout=60)
    assert trained["promoted"] and trained["version"] == 1, trained
    assert ForecastModel.objects.get(pk=trained["model_id"]).state == "active"
    assert forecast_id == again == TaskForecast.objects.get(task=world.task_b).pk
    assert TaskForecast.objects.get(task=world.task_b).source == "model"
    assert refreshed == 4 and TaskProfile.objects.filter(tenant=world.tenant_a).count() == 4
