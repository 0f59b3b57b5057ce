"""Predictions at submission: from the active model when there is one, else an honest baseline that
says what it is, else nothing; visible on the task in the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.forecasting.models import TaskForecast
from apps.forecasting.services import forecast_model_train, task_forecast_attach
from apps.inventory.services import gpu_add
from apps.workloads.models import Task
from tests.apps.forecasting.runs import make_runs, true_duration_s


@pytest.fixture(autouse=True)
def _inline(settings) -> None:
    # Forecast in the submitting process: these tests look at what is attached, not at the broker
    # (test_celery covers the worker path through Redis).
    settings.WHALEGEN_FORECAST_INLINE = True


def _submit(api, user, captured, **body):
    with captured(execute=True):
        response = api(user).post(
            "/api/v1/tasks/",
            {"tenant": "vision", "queue": "train", "command": ["true"], **body},
            format="json",
        )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _finished(queue, durations_s, *, key):
    now = timezone.now()
    for i, dur in enumerate(durations_s):
        started = now - timedelta(hours=10 + i)
        Task.objects.create(
            tenant=queue.tenant, queue=queue, pool=queue.pool, priority=0, state=Task.State.SUCCEEDED,
            profile_key=key, started_at=started, finished_at=started + timedelta(seconds=dur),
        )  # fmt: skip


@pytest.mark.parametrize(("key", "gpus"), [("bert", 1), ("bert", 4), ("llama", 2)], ids=str)
def test_a_submission_gets_the_active_models_prediction_in_the_api(
    world, api, django_capture_on_commit_callbacks, key, gpus
) -> None:
    for index in range(2, gpus):  # the pool's one node has two GPUs: a larger request needs a larger node
        gpu_add(node=world.node, index=index, model="H100-80GB")
    make_runs(world.queue_a, 300, now=timezone.now())
    assert forecast_model_train(kind="duration").promoted
    task_id = _submit(api, world.alice, django_capture_on_commit_callbacks, profile_key=key, gpu_count=gpus)
    body = api(world.alice).get(f"/api/v1/tasks/{task_id}/").json()
    forecast = body["forecast"]
    assert (forecast["source"], forecast["model_version"], forecast["baseline"]) == ("model", 1, "")
    truth = true_duration_s(key, gpus)
    assert truth / 1.5 < forecast["duration_p50_s"] < truth * 1.5
    assert forecast["duration_p50_s"] <= forecast["duration_p90_s"]
    # The scheduler reads the copy on the task itself.
    assert body["predicted_duration_p50_s"] == forecast["duration_p50_s"]


def test_without_a_model_a_task_gets_its_key_history_and_says_so(
    world, api, django_capture_on_commit_callbacks
) -> None:
    _finished(world.queue_a, [100, 200, 300, 400, 500], key="bert")
    task_id = _submit(api, world.alice, django_capture_on_commit_callbacks, profile_key="bert")
    forecast = api(world.alice).get(f"/api/v1/tasks/{task_id}/").json()["forecast"]
    assert forecast["source"] == "baseline" and forecast["baseline"] == "key_history"
    assert forecast["model_version"] is None and forecast["history_count"] == 5
    assert forecast["duration_p50_s"] == pytest.approx(300.0)
    assert forecast["duration_p90_s"] == pytest.approx(460.0)


def test_a_key_with_little_history_falls_back_to_the_plane_median(
    world, api, django_capture_on_commit_callbacks
) -> None:
    _finished(world.queue_a, [100, 200, 300, 400, 500], key="bert")
    _finished(world.queue_a, [9_000], key="fresh")
    task_id = _submit(api, world.alice, django_capture_on_commit_callbacks, profile_key="fresh")
    forecast = api(world.alice).get(f"/api/v1/tasks/{task_id}/").json()["forecast"]
    assert (forecast["source"], forecast["baseline"], forecast["history_count"]) == (
        "baseline",
        "global_median",
        6,
    )
    assert forecast["duration_p50_s"] == pytest.approx(350.0)


def test_with_no_history_the_forecast_is_empty_and_says_so(
    world, api, django_capture_on_commit_callbacks
) -> None:
    task_id = _submit(api, world.alice, django_capture_on_commit_callbacks, profile_key="bert")
    forecast = api(world.alice).get(f"/api/v1/tasks/{task_id}/").json()["forecast"]
    assert forecast["source"] == "none"
    assert forecast["duration_p50_s"] is None and forecast["duration_p90_s"] is None


def test_attaching_twice_keeps_the_first_forecast(world) -> None:
    first = task_forecast_attach(task_id=world.task_a.pk)
    _finished(world.queue_a, [100, 200, 300], key="")
    again = task_forecast_attach(task_id=world.task_a.pk)
    assert again.pk == first.pk and again.source == "none"
    assert task_forecast_attach(task_id=10**9) is None


def test_a_bulk_submission_is_forecast_in_one_batch_and_a_refused_one_not_at_all(
    world, api, django_capture_on_commit_callbacks
) -> None:
    make_runs(world.queue_a, 300, now=timezone.now())
    assert forecast_model_train(kind="duration").promoted
    items = [
        {"queue": "train", "command": ["true"], "profile_key": "tiny"},
        {"queue": "train", "command": ["true"], "profile_key": "llama", "gpu_count": 2},
    ]
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api(world.alice).post(
            "/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": items}, format="json"
        )
    assert response.status_code == 201, response.json()
    assert len(callbacks) == 1
    p50 = [TaskForecast.objects.get(task_id=t["id"]).duration_p50_s for t in response.json()]
    assert 60 / 1.5 < p50[0] < 60 * 1.5 and 7_200 / 1.5 < p50[1] < 7_200 * 1.5
    TaskForecast.objects.all().delete()

    body = {
        "tenant": "vision",
        "tasks": [
            {"queue": "train", "command": ["true"]},
            {"queue": "train", "command": ["true"], "gpu_count": 64},
        ],
    }
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api(world.alice).post("/api/v1/tasks/bulk/", body, format="json")
    assert response.status_code == 400 and callbacks == []
    assert not TaskForecast.objects.exists()


def test_an_unreadable_active_model_falls_back_to_the_baseline(world, caplog) -> None:
    from apps.forecasting.models import ForecastModel

    _finished(world.queue_a, [100, 200, 300], key="bert")
    now = timezone.now()
    ForecastModel.objects.create(
        kind="duration", version=1, state="active", blob=b'{"envelope_version": 99}', metrics={},
        train_start=now, train_end=now, validation_start=now, validation_end=now, trained_at=now,
        decision_reason="test",
    )  # fmt: skip
    Task.objects.filter(pk=world.task_a.pk).update(profile_key="bert")
    forecast = task_forecast_attach(task_id=world.task_a.pk)
    assert (forecast.source, forecast.baseline, forecast.duration_p50_s) == ("baseline", "key_history", 200.0)
    assert "cannot be loaded" in caplog.text
