"""The memory-peak model through the plane: telemetry series → time split → promotion rule → bounds
on running tasks, shown on the task."""

from __future__ import annotations

from datetime import timedelta

from apps.fleet.models import TaskSample
from apps.forecasting.models import ForecastModel, TaskForecast
from apps.forecasting.services import forecast_model_train, memory_bounds_refresh
from apps.forecasting.tasks import forecasting_train
from apps.inventory.models import Gpu
from apps.workloads.models import Task
from tests.apps.forecasting.telemetry import make_telemetry
from tests.apps.scheduling.conftest import NOW
from whalegen.forecast.memory import memory_promotion


def _gpu(world) -> Gpu:
    return Gpu.objects.get(node=world.node, index=1)


def test_the_memory_model_trains_through_celery_and_is_promoted_by_the_rule(world, monkeypatch) -> None:
    make_telemetry(world.queue_a, _gpu(world), now=NOW)
    monkeypatch.setattr("django.utils.timezone.now", lambda: NOW)
    result = forecasting_train.apply(args=("memory_peak",)).get()  # the task body, run in-process
    assert result["promoted"], result["reason"]
    row = ForecastModel.objects.get(pk=result["model_id"])
    assert (row.kind, row.state, row.version, row.scope) == ("memory_peak", "active", 1, "")
    scores = row.metrics["models"]
    assert set(scores) == {"xgboost", "peak_so_far", "window_max", "global_p99", "request"}
    # The decision is the rule applied to the stored figures, and the figures meet the target.
    expected = memory_promotion(
        scores["xgboost"], {k: scores[k] for k in ("peak_so_far", "window_max")}, None, max_under=0.01
    )
    assert expected[0] and row.decision_reason.startswith(expected[1])
    assert scores["xgboost"]["under_rate"] <= 0.01
    assert scores["xgboost"]["saved_vs_request"] >= scores["peak_so_far"]["saved_vs_request"]
    assert scores["request"]["saved_vs_request"] == 0.0 and row.metrics["request_mib"] == _gpu(world).mem_mib
    assert row.train_start < row.train_end == row.validation_start < row.validation_end <= NOW
    assert row.metrics["n_train"] >= 70 and row.metrics["n_test"] >= 50


def test_a_retrain_of_equal_skill_does_not_replace_the_active_memory_model(world) -> None:
    make_telemetry(world.queue_a, _gpu(world), now=NOW)
    assert forecast_model_train(kind="memory_peak", now=NOW).promoted
    again = forecast_model_train(kind="memory_peak", now=NOW)
    assert not again.promoted and "does not beat the active model" in again.reason
    assert (
        again.model.metrics["active"]["under_rate"] == again.model.metrics["models"]["xgboost"]["under_rate"]
    )
    assert ForecastModel.objects.get(kind="memory_peak", state="active").version == 1


def test_running_tasks_get_a_next_hour_bound_shown_on_the_task(world, api) -> None:
    tasks = make_telemetry(world.queue_a, _gpu(world), now=NOW)
    assert memory_bounds_refresh(now=NOW) == 0  # no active model: nothing is made up
    assert forecast_model_train(kind="memory_peak", now=NOW).promoted
    running = [t for t in tasks if t.state == Task.State.RUNNING]
    assert len(running) == 3
    # One of them has its forecast from submission: it keeps it and gains the bound.
    TaskForecast.objects.create(task=running[0], source="baseline", duration_p50_s=60.0)
    assert memory_bounds_refresh(now=NOW) == 3
    kept = TaskForecast.objects.get(task=running[0])
    assert (kept.source, kept.duration_p50_s) == ("baseline", 60.0)
    for task in running:
        forecast = TaskForecast.objects.get(task=task)
        peak = max(TaskSample.objects.filter(task=task).values_list("used_mib", flat=True))
        # Never below what the task already held, and far below the whole 80 GB device.
        assert peak <= forecast.mem_bound_mib < 0.9 * _gpu(world).mem_mib
        assert (forecast.mem_bound_at, forecast.mem_bound_model_version) == (NOW, 1)
    shown = api(world.alice).get(f"/api/v1/tasks/{running[0].pk}/").json()["forecast"]
    assert shown["mem_bound_mib"] == TaskForecast.objects.get(task=running[0]).mem_bound_mib
    assert shown["mem_bound_model_version"] == 1
    # Finished tasks get none.
    assert not TaskForecast.objects.filter(task__state=Task.State.SUCCEEDED, mem_bound_mib__isnull=False)


def test_too_little_telemetry_trains_nothing_and_says_why(world) -> None:
    make_telemetry(world.queue_a, _gpu(world), now=NOW, n_tasks=2)
    TaskSample.objects.filter(at__lt=NOW - timedelta(hours=1)).delete()
    outcome = forecast_model_train(kind="memory_peak", now=NOW)
    assert outcome.model is None and "task memory samples in the window; need 500" in outcome.reason
    assert not ForecastModel.objects.exists()


def test_the_memory_series_sums_a_tasks_processes_per_gpu_and_keeps_its_largest_gpu(world) -> None:
    from apps.forecasting.selectors import task_memory_series
    from tests.apps.factories import TaskSampleFactory

    gpu0, gpu1 = Gpu.objects.get(node=world.node, index=0), _gpu(world)
    at = NOW - timedelta(minutes=5)
    for gpu, mib in ((gpu0, 1_000), (gpu0, 2_000), (gpu1, 2_500)):
        TaskSampleFactory(task=world.task_a, gpu=gpu, at=at, used_mib=mib)
    TaskSampleFactory(task=world.task_a, gpu=gpu1, at=at + timedelta(minutes=1), used_mib=None)
    ids, times, values = task_memory_series(since=NOW - timedelta(hours=1), until=NOW, limit=100)
    assert ids.tolist() == [world.task_a.pk] and times.tolist() == [at.timestamp()]
    assert values.tolist() == [3_000.0]  # 1000 + 2000 on GPU 0 beats 2500 on GPU 1; a null is no sample
