"""Pre-carving on PostgreSQL: when the pool's arrivals model expects small MIG tasks, a cycle re-carves an
idle 7g GPU into small instances before they arrive, says why, and the node's desired state carries the
new layout; the next small task binds at once instead of waiting for a last-resort re-carve."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.test import override_settings

from apps.fleet.models import NodeAgent
from apps.fleet.selectors import desired_state_build
from apps.forecasting.models import ForecastModel
from apps.forecasting.selectors import training_rows_arrivals
from apps.inventory.models import ComputeUnit, Gpu
from apps.scheduling.models import Cycle, Repartition
from apps.workloads.models import Task
from tests.apps.factories import holder_of, units_held_by
from tests.apps.scheduling.conftest import NOW, Fleet, run
from tests.apps.scheduling.invariants import violations
from whalegen.forecast.arrivals import ArrivalConfig, train_arrivals

H100 = "H100-80GB"


def _history(fleet: Fleet, *, days: int = 3, seed: int = 4) -> None:
    """Past submissions to the pool: small one-GPU tasks (100 milli: a 1g.10gb), about six an hour."""
    rng = np.random.default_rng(seed)
    tenant = fleet.tenants["t"]
    queue = tenant.queues.get()
    times = np.sort(rng.uniform(0, days * 86_400, days * 24 * 6))
    rows = Task.objects.bulk_create(
        Task(tenant=tenant, queue=queue, pool=fleet.pool, priority=0, state=Task.State.SUCCEEDED,
             gpu_count=1, gpu_milli=100)
        for _ in times
    )  # fmt: skip
    for task, t in zip(rows, times, strict=True):
        task.created_at = NOW - timedelta(seconds=days * 86_400 - t)
    Task.objects.bulk_update(rows, ["created_at"])


def _active_arrivals_model(fleet: Fleet, *, tv_distance: float | None) -> None:
    times, labels = training_rows_arrivals(pool=fleet.pool, until=NOW, since=NOW - timedelta(days=30))
    model = train_arrivals(times, labels, ArrivalConfig(), NOW.timestamp(), rounds=60)
    metrics = {} if tv_distance is None else {"models": {"xgboost": {"mix_tv_distance": tv_distance}}}
    ForecastModel.objects.create(
        kind="arrivals", pool=fleet.pool, scope=ForecastModel.scope_of(fleet.pool, None), version=1,
        state="active", blob=model.to_bytes(), metrics=metrics, train_start=NOW - timedelta(days=3),
        train_end=NOW, validation_start=NOW, validation_end=NOW, trained_at=NOW, promoted_at=NOW,
        decision_reason="stored as active by the test",
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _precarve_on(settings: Any) -> None:
    """Pre-carving is off by default (docs/scheduling.md); these tests are about what it does when on."""
    settings.WHALEGEN_PRECARVE = True


def _scene(fleet: Fleet, *, tv_distance: float | None = 0.1) -> tuple[Any, Gpu]:
    fleet.tenant("t", guaranteed=8_000)
    node = fleet.node(model=H100, mode="mig", mig_layout=[("7g.80gb", 0)])
    _history(fleet)
    _active_arrivals_model(fleet, tv_distance=tv_distance)
    return node, Gpu.objects.get(node=node)


def _layout(gpu: Gpu) -> list[tuple[str, int | None]]:
    return [(u.mig_profile, u.mig_start) for u in ComputeUnit.objects.filter(gpu=gpu).order_by("mig_start")]


def test_an_idle_mig_gpu_gets_the_forecast_layout_with_its_reason_and_the_agent_sees_it(fleet: Fleet) -> None:
    node, gpu = _scene(fleet)
    before = NodeAgent.objects.get_or_create(node=node)[0].generation

    # 1. No task pending: the cycle re-carves the idle 7g for the expected 1g tasks.
    report = run(fleet)
    assert report.placed == 0
    layout = _layout(gpu)
    assert len(layout) == 7 and all(profile.startswith("1g.") for profile, _ in layout)
    ahead = Repartition.objects.get(gpu=gpu)
    assert (ahead.state, ahead.task_id, ahead.closed_at) == ("ahead", None, NOW)
    assert ahead.reason.startswith("re-carved ahead of forecast: ")
    assert "×1g.10gb expected in the next hour, arrivals model v1" in ahead.reason
    assert "GPU 0 on eu-1/n001 7g.80gb -> 1g.10gb+" in ahead.reason
    assert Cycle.objects.get(pk=report.cycle_id).stats["precarved"] == 1
    # The node's desired state, which the agent pulls, carries the new layout at a raised generation.
    generation = NodeAgent.objects.get(node=node).generation
    assert generation > before and ahead.generation == generation
    desired = desired_state_build(node=node, now=NOW)
    assert [(i.profile, i.start) for i in desired.gpus[0].instances] == layout

    # 2. The layout now serves the forecast: the next cycle leaves it alone.
    run(fleet, minutes=1)
    assert _layout(gpu) == layout and Repartition.objects.filter(gpu=gpu).count() == 1

    # 3. A small task arrives and binds to a 1g instance in its first cycle (no wait for a layout).
    small = fleet.submit("t", gpu_milli=100, gpu_mem_mib=5_000)
    report = run(fleet, minutes=2)
    small.refresh_from_db()
    assert (small.state, report.placed) == ("assigned", 1)
    assert units_held_by(small)[0].mig_profile == "1g.10gb"
    assert violations(fleet.pool.pk) == []


@pytest.mark.parametrize(
    ("setting", "tv_distance"),
    [(False, 0.1), (True, 0.8), (True, None)],
    ids=["turned off", "a forecast mix too unsure", "a model without its held-out mix figure"],
)
def test_no_precarve_when_off_or_the_forecast_is_not_trusted(
    fleet: Fleet, setting: bool, tv_distance: float | None
) -> None:
    _, gpu = _scene(fleet, tv_distance=tv_distance)
    with override_settings(WHALEGEN_PRECARVE=setting):
        report = run(fleet)
    assert _layout(gpu) == [("7g.80gb", 0)]
    assert not Repartition.objects.exists()
    assert Cycle.objects.get(pk=report.cycle_id).stats["precarved"] == 0


def test_a_busy_mig_gpu_is_never_precarved(fleet: Fleet) -> None:
    _, gpu = _scene(fleet)
    fleet.submit("t", gpu_milli=1000, gpu_mem_mib=70_000)  # takes the 7g instance
    report = run(fleet)
    assert report.placed == 1
    assert [(u.mig_profile, holder_of(u) is not None) for u in ComputeUnit.objects.filter(gpu=gpu)] == [
        ("7g.80gb", True)
    ]
    assert not Repartition.objects.exists()


def test_a_precarved_layout_marks_its_node_for_the_agent(
    fleet: Fleet, django_capture_on_commit_callbacks: Any
) -> None:
    """The agent's long poll waits on its node's change mark (docs/fleet.md, "Change marks"): a re-carve
    ahead of the forecast must move it after the commit, or the agent hears of the layout only with its
    next poll (20 s) or, fetching on the heartbeat's answer, with the heartbeat's periodic full way."""
    from apps.fleet import changes

    node, _ = _scene(fleet)
    before = changes.read(node.pk)
    with django_capture_on_commit_callbacks(execute=True):
        run(fleet)
        assert changes.read(node.pk) == before  # not before the commit
    assert changes.read(node.pk) != before
