"""Predictions steer placement: the pool's forecast shape mix reaches the engine and changes a choice.

Two nodes of two A100s (MPS). `b-frag` already runs a half-GPU task; `a-free` is empty and comes first
in the tie-break order. A whole-GPU task arrives. Weighed with the mix of the tasks the cycle knows
(one half-GPU, one whole-GPU task), both nodes fragment the same and the tie goes to `a-free`. When the
pool's arrivals model expects mostly two-GPU tasks in the next hour, the whalegen policy keeps
`a-free`'s pair of free GPUs intact and fills `b-frag`'s free GPU instead.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from apps.forecasting.models import ForecastModel
from apps.forecasting.selectors import pool_shape_mix, training_rows_arrivals
from apps.scheduling.models import Assignment, Cycle
from apps.workloads.models import Task
from tests.apps.scheduling.conftest import NOW, Fleet, run, start
from whalegen.forecast.arrivals import ArrivalConfig, train_arrivals


def _history(fleet: Fleet, *, days: int = 3, seed: int = 2) -> None:
    """Past submissions to the pool: nine in ten ask for two whole GPUs, the rest for half a GPU."""
    rng = np.random.default_rng(seed)
    tenant = fleet.tenants["t"]
    queue = tenant.queues.get()
    times = np.sort(rng.uniform(0, days * 86_400, days * 24 * 6))
    rows = Task.objects.bulk_create(
        Task(tenant=tenant, queue=queue, pool=fleet.pool, priority=0, state=Task.State.SUCCEEDED,
             gpu_count=2 if rng.random() < 0.9 else 1, gpu_milli=1000)
        for _ in times
    )  # fmt: skip
    for task, t in zip(rows, times, strict=True):
        task.created_at = NOW - timedelta(seconds=days * 86_400 - t)
        if task.gpu_count == 1:
            task.gpu_milli = 500
    Task.objects.bulk_update(rows, ["created_at", "gpu_milli"])


def _active_arrivals_model(fleet: Fleet) -> ForecastModel:
    times, labels = training_rows_arrivals(pool=fleet.pool, until=NOW, since=NOW - timedelta(days=30))
    model = train_arrivals(times, labels, ArrivalConfig(), NOW.timestamp(), rounds=60)
    return ForecastModel.objects.create(
        kind="arrivals", pool=fleet.pool, scope=ForecastModel.scope_of(fleet.pool, None), version=1,
        state="active", blob=model.to_bytes(), metrics={}, train_start=NOW - timedelta(days=3),
        train_end=NOW, validation_start=NOW, validation_end=NOW, trained_at=NOW, promoted_at=NOW,
        decision_reason="stored as active by the test",
    )  # fmt: skip


def _scene(fleet: Fleet) -> Any:
    fleet.tenant("t", guaranteed=8_000)
    fleet.node(name="b-frag", gpus=2, mode="mps", mps_shares=2)
    small = fleet.submit("t", gpu_count=1, gpu_milli=500)
    run(fleet)
    start(small)
    assert Assignment.objects.get(task=small).node.name == "b-frag"
    fleet.node(name="a-free", gpus=2, mode="mps", mps_shares=2)
    return fleet.submit("t", gpu_count=1, gpu_milli=1000)


@pytest.mark.parametrize(
    ("forecast", "source", "node"),
    [(False, "history", "a-free"), (True, "forecast", "b-frag")],
    ids=["without a model the known tasks' mix decides", "the forecast mix keeps the free pair whole"],
)
def test_the_forecast_shape_mix_steers_the_whalegen_policy(fleet: Fleet, forecast, source, node) -> None:
    big = _scene(fleet)
    _history(fleet)
    if forecast:
        _active_arrivals_model(fleet)
    report = run(fleet, minutes=1)
    assert report.placed == 1
    assert Assignment.objects.get(task=big).node.name == node
    stats = Cycle.objects.get(pk=report.cycle_id).stats
    assert stats["shape_mix_source"] == source
    if forecast:
        assert stats["shape_mix_reason"] == "arrivals model v1"
        top = max(stats["shape_mix"], key=lambda s: s[2])
        assert top[:2] == [2, 1000] and top[2] > 0.5
    else:
        assert stats["shape_mix_reason"] == "no active arrivals model for the pool"
        assert sorted(s[:2] for s in stats["shape_mix"]) == [[1, 500], [1, 1000]]


def test_the_forecast_mix_is_the_models_next_hour(fleet: Fleet) -> None:
    fleet.tenant("t", guaranteed=8_000)
    _history(fleet)
    _active_arrivals_model(fleet)
    steer = pool_shape_mix(pool_id=fleet.pool.pk, now=NOW)
    assert (steer.source, steer.model_version) == ("forecast", 1)
    assert steer.mix is not None and sum(steer.mix.weights) == pytest.approx(1.0)
    pairs = zip(steer.mix.shapes, steer.mix.weights, strict=True)
    shapes = {(s.num_gpu, s.gpu_milli, s.cpu_milli): w for s, w in pairs}
    # Two shapes were submitted; their CPU is what those tasks asked for (the default 1000 m).
    assert set(shapes) == {(2, 1000, 1000), (1, 500, 1000)}
    assert shapes[(2, 1000, 1000)] > 0.7


def test_a_model_that_cannot_forecast_falls_back_to_the_history_mix_with_the_reason(fleet: Fleet) -> None:
    big = _scene(fleet)
    ForecastModel.objects.create(
        kind="arrivals", pool=fleet.pool, scope=ForecastModel.scope_of(fleet.pool, None), version=7,
        state="active", blob=b'{"envelope_version": 999}', metrics={}, train_start=NOW, train_end=NOW,
        validation_start=NOW, validation_end=NOW, trained_at=NOW, decision_reason="damaged",
    )  # fmt: skip
    report = run(fleet, minutes=1)
    assert report.placed == 1 and Assignment.objects.get(task=big).node.name == "a-free"
    stats = Cycle.objects.get(pk=report.cycle_id).stats
    assert stats["shape_mix_source"] == "history"
    assert stats["shape_mix_reason"].startswith("arrivals model v7 failed: unknown model envelope version")
