"""Training through the plane: time split, baselines, promotion only when it is earned."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.forecasting.models import ForecastModel
from apps.forecasting.services import forecast_model_train
from tests.apps.forecasting.runs import make_runs
from tests.apps.scheduling.conftest import NOW
from whalegen.forecast.durations import DurationParams


def test_a_model_trained_on_runs_with_a_signal_beats_the_median_and_is_promoted(world) -> None:
    now = NOW
    make_runs(world.queue_a, 300, now=now)
    outcome = forecast_model_train(kind="duration", now=now)
    assert outcome.promoted, outcome.reason
    row = ForecastModel.objects.get(pk=outcome.model.pk)
    assert (row.state, row.version, row.promoted_at) == ("active", 1, now)
    scores = row.metrics["models"]
    assert scores["xgboost_p50"]["log_mae"] < 0.5 * scores["global_median"]["log_mae"]
    assert scores["xgboost_p50"]["log_mae"] < scores["key_history_mean"]["log_mae"]
    assert "beats every baseline" in row.decision_reason
    # Earlier runs trained, the latest validated; both windows are kept.
    assert row.train_start < row.train_end == row.validation_start < row.validation_end <= now
    assert row.metrics["n_train"] >= 200 and 40 <= row.metrics["n_validation"] <= 70
    assert bytes(row.blob).startswith(b"{")


def test_a_candidate_worse_than_the_active_model_is_kept_as_a_candidate_with_its_reason(world) -> None:
    now = NOW
    make_runs(world.queue_a, 300, now=now)
    first = forecast_model_train(kind="duration", now=now)
    # Two rounds at a tiny learning rate: the candidate barely moves from its anchor (the key's recent
    # mean), which ignores the GPU count the active model learned.
    weak = DurationParams(eta=0.01, max_rounds=2, early_stopping_rounds=1)
    second = forecast_model_train(kind="duration", now=now, params=weak)
    assert first.promoted and not second.promoted
    assert "does not beat" in second.reason
    rows = {m.version: m for m in ForecastModel.objects.filter(kind="duration")}
    assert (rows[1].state, rows[2].state) == ("active", "candidate")
    assert rows[2].decision_reason == second.reason and rows[2].promoted_at is None


def test_retraining_on_the_same_runs_does_not_replace_the_active_model(world) -> None:
    # A fixed clock: the duration features include the hour and weekday of submission, so with the wall
    # clock the two fits (and this comparison) changed with the time of day the suite ran.
    now = NOW
    make_runs(world.queue_a, 300, now=now)
    forecast_model_train(kind="duration", now=now)
    again = forecast_model_train(kind="duration", now=now)
    assert not again.promoted and "does not beat the active model" in again.reason
    compared = again.model.metrics["same_inputs_vs_active"]
    # Both were scored on the same validation runs, and the figures behind the decision are kept.
    assert compared["candidate"]["log_mae"] > 0.98 * compared["active"]["log_mae"]
    assert ForecastModel.objects.filter(kind="duration", state="active").get().version == 1


def test_a_better_candidate_retires_the_active_model(world) -> None:
    now = NOW
    make_runs(world.queue_a, 300, now=now)
    weak = DurationParams(eta=0.3, max_rounds=3, early_stopping_rounds=1, max_depth=1)
    first = forecast_model_train(kind="duration", now=now, params=weak)
    assert first.promoted, first.reason  # the first model only has to beat the baselines
    second = forecast_model_train(kind="duration", now=now)
    assert second.promoted, second.reason
    states = dict(ForecastModel.objects.values_list("version", "state"))
    assert states == {1: "retired", 2: "active"}
    assert ForecastModel.objects.get(version=1).retired_at == now


def test_too_few_runs_train_nothing_and_say_why(world) -> None:
    now = NOW
    make_runs(world.queue_a, 30, now=now)
    outcome = forecast_model_train(kind="duration", now=now)
    assert outcome.model is None and not outcome.promoted
    assert "30 finished runs" in outcome.reason
    assert not ForecastModel.objects.exists()


@pytest.mark.parametrize(
    ("kind", "words"),
    [("memory_peak", "0 task memory samples in the window"), ("idle_gpus", "per pool; name the pool")],
    ids=["memory peaks need telemetry series", "idle GPUs need a pool series"],
)
def test_kinds_without_data_on_the_plane_are_not_trained_and_say_why(world, kind, words) -> None:
    outcome = forecast_model_train(kind=kind, now=timezone.now())
    assert outcome.model is None and words in outcome.reason


def test_arrivals_train_per_pool_and_the_decision_follows_the_rule_on_the_stored_metrics(world) -> None:
    import numpy as np

    from apps.workloads.models import Task
    from whalegen.forecast.store import should_promote

    # Three days of submissions to the H100 pool: a daily cycle (busy 08–20 h), two shapes.
    rng = np.random.default_rng(1)
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    times = []
    for hour in range(72):
        busy = 8 <= (now - timedelta(hours=72 - hour)).hour < 20
        times += [
            now - timedelta(hours=72 - hour, minutes=float(m)) for m in rng.uniform(0, 60, 8 if busy else 1)
        ]
    tasks = Task.objects.bulk_create(
        Task(
            tenant=world.tenant_a,
            queue=world.queue_a,
            pool=world.h100,
            priority=0,
            gpu_milli=500 if i % 3 else 1000,
        )
        for i in range(len(times))
    )
    for task, at in zip(tasks, times, strict=True):
        task.created_at = at
    Task.objects.bulk_update(tasks, ["created_at"])
    outcome = forecast_model_train(kind="arrivals", pool=world.h100, now=now)
    row = outcome.model
    assert row is not None and row.pool == world.h100 and row.scope == f"pool:{world.h100.pk}"
    scores = row.metrics["models"]
    assert set(scores) == {"xgboost", "persistence", "last_hour_mean", "same_slot_yesterday", "training_rate"}
    baselines = {k: v for k, v in scores.items() if k != "xgboost"}
    expected = should_promote(scores["xgboost"], None, baselines, metric="poisson_deviance")
    assert (outcome.promoted, row.state == "active") == (expected.promote, expected.promote)
    assert row.decision_reason.startswith(expected.reason.split(" (")[0])
