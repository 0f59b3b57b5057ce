"""The MIG layout replay: tasks wait for a layout when no carved instance holds them, a re-carve costs the
agent's apply time, and pre-carving ahead of a forecast saves that wait; same input, same figures."""

from __future__ import annotations

from whalegen.scheduling.precarve import PrecarveConfig
from whalegen.sim.migwait import MigTask, forecaster, run_migwait

# Small tasks (a 1g.10gb each) every two minutes, each running ten minutes, on 7g-carved GPUs.
SMALL = [MigTask(f"t{i:03d}", 120.0 * i, 600.0, 100) for i in range(60)]


def test_without_precarve_small_tasks_take_whole_7g_instances_and_the_rest_queue() -> None:
    # Present units first: each small task takes a free 7g instance, so no GPU is idle to re-carve and
    # the fifth task waits for a departure.
    result = run_migwait(SMALL, gpus=4, initial="all-7g", apply_s=60.0)
    assert result.started == 60
    assert result.recarves_ahead == 0 and result.recarves_last_resort == 0
    assert result.p95_wait_s >= 600.0


def test_a_task_only_a_new_layout_holds_waits_a_cycle_and_the_apply_time() -> None:
    # One GPU of seven 1g instances; a 3g task arrives: the idle GPU is re-carved for it.
    task = [MigTask("big", 2.0, 600.0, 400)]
    result = run_migwait(task, gpus=1, initial="all-1g", apply_s=60.0)
    assert (result.waited_for_layout, result.recarves_last_resort) == (1, 1)
    assert result.mean_wait_s == 63.0  # the next 5-second tick, then 60 s of apply time


def test_precarve_ahead_of_the_forecast_saves_the_wait_for_a_layout() -> None:
    off = run_migwait(SMALL, gpus=4, initial="all-7g", apply_s=60.0)
    on = run_migwait(
        SMALL,
        gpus=4,
        initial="all-7g",
        apply_s=60.0,
        precarve=PrecarveConfig(keep_whole_share=0.0),
        forecast=forecaster(SMALL, "oracle"),
    )
    assert on.started == off.started == 60
    assert on.recarves_ahead >= 1
    assert on.mean_wait_s < off.mean_wait_s / 10 and on.p95_wait_s < off.p95_wait_s


def test_the_replay_is_deterministic_and_without_a_forecast_precarve_does_nothing() -> None:
    first = run_migwait(SMALL, gpus=4, initial="all-balanced", apply_s=30.0)
    second = run_migwait(
        SMALL, gpus=4, initial="all-balanced", apply_s=30.0, precarve=PrecarveConfig(), forecast=None
    )
    keys = ["started", "mean_wait_s", "p95_wait_s", "waited_for_layout", "recarves_last_resort"]
    assert [getattr(first, k) for k in keys] == [getattr(second, k) for k in keys]
    assert second.recarves_ahead == 0
