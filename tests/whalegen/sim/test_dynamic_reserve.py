"""`+reserve` in the dynamic replay: a hand-made trace where the large task's start, and which small task
may backfill around it, are known for each forecast."""

from __future__ import annotations

from whalegen.placement.types import GpuState, NodeState, Shape, ShapeMix, TaskRequest
from whalegen.sim.dynamic import TimedTask, oracle_predictions, run_dynamic

MIX = ShapeMix((Shape(1000, 1, 1000, mem_mib=1024),), (1.0,))
NODE = NodeState(
    "n", 64_000, 64_000, 256_000, 256_000, tuple(GpuState(i, "T4", 1000, 0, 0) for i in range(4))
)


def timed(task_id: str, at_s: float, life_s: float, num_gpu: int = 1) -> TimedTask:
    return TimedTask(TaskRequest(task_id, 1000, 1024, num_gpu, 1000), at_s, life_s)


# One 4-GPU node. s1 runs 0–10; the 4-GPU task L arrives at 1. s2 (2–12) and s3 (5–15) would run past
# L's predicted start (10); `short` (3–8) ends before it.
TRACE = (
    timed("s1", 0, 10),
    timed("L", 1, 10, num_gpu=4),
    timed("s2", 2, 10),
    timed("short", 3, 5),
    timed("s3", 5, 10),
)


def run(policy: str, forecast: str) -> dict[str, float]:
    predicted = oracle_predictions(TRACE) if forecast == "oracle" else {}
    result = run_dynamic([NODE], TRACE, policy, 0, mix=MIX, predicted_s=predicted, forecast=forecast)
    return dict(result.start_s)


def test_without_reservation_small_tasks_backfill_and_the_large_task_waits_for_all_of_them() -> None:
    starts = run("whalegen", "none")
    assert starts == {"s1": 0, "s2": 2, "short": 3, "s3": 5, "L": 15}


def test_with_true_ends_the_large_task_starts_at_its_predicted_start_and_only_short_work_backfills() -> None:
    starts = run("whalegen+reserve", "oracle")
    assert starts == {"s1": 0, "L": 10, "short": 3, "s2": 20, "s3": 20}


def test_with_no_forecast_the_reserved_node_drains_and_nothing_backfills() -> None:
    starts = run("whalegen+reserve", "none")
    assert starts == {"s1": 0, "L": 10, "short": 20, "s2": 20, "s3": 20}


def test_reservation_metrics_count_the_large_task_and_its_promised_start() -> None:
    result = run_dynamic(
        [NODE],
        TRACE,
        "whalegen+reserve",
        0,
        mix=MIX,
        predicted_s=oracle_predictions(TRACE),
        forecast="oracle",
    )
    assert (result.forecast, result.large_started, result.large_p95_delay_s) == ("oracle", 1, 9.0)
    assert (result.reserved, result.reserved_with_start, result.reserve_mae_s) == (1, 1, 0.0)
    # Queued on arrival: L, s2, s3. Each was shown the first predicted end after which the node held it.
    assert result.queued == 3 and result.estimated == 3
