"""Dynamic replay: hand-made traces whose queue, allocation and counts are known, the forecast wrapper,
determinism, and the `whalegen replay --dynamic` command on a slice of openb."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.state import Request
from whalegen.placement.types import (
    ClusterSnapshot,
    GpuState,
    NodeState,
    RunningTask,
    Shape,
    ShapeMix,
    TaskRequest,
)
from whalegen.sim.dynamic import (
    ForecastAligned,
    TimedTask,
    load_timed_tasks,
    run_dynamic,
    sample_cluster,
    split_time,
    trace_window,
)
from whalegen.sim.trace import NODE_FILE, pod_file

TRACES = Path("/work/shared/traces/openb")
ROOT = Path(__file__).resolve().parents[3]
needs_trace = pytest.mark.skipif(not (TRACES / NODE_FILE).is_file(), reason="openb trace not present")


def node(name: str, gpus: int, cpu_milli: int = 64_000, mem_mib: int = 256_000) -> NodeState:
    return NodeState(
        name,
        cpu_milli,
        cpu_milli,
        mem_mib,
        mem_mib,
        tuple(GpuState(i, "T4", 1000, 0, 0) for i in range(gpus)),
    )


def timed(task_id: str, at_s: float, life_s: float, num_gpu: int = 1, gpu_milli: int = 1000) -> TimedTask:
    return TimedTask(TaskRequest(task_id, 1000, 1024, num_gpu, gpu_milli), at_s, life_s)


MIX = ShapeMix((Shape(1000, 1, 1000, mem_mib=1024), Shape(1000, 1, 500, mem_mib=1024)), (0.5, 0.5))


@pytest.mark.parametrize("policy", ["fgd", "whalegen", "bestfit"])
def test_a_task_waits_exactly_until_the_one_holding_the_gpu_departs(policy: str) -> None:
    tasks = [timed("a", 0, 100), timed("b", 10, 50)]
    result = run_dynamic([node("n0", 1)], tasks, policy, 1, mix=MIX)
    # b waits from 10 until a leaves at 100 (delay 90), then runs 50 s: last departure at 150.
    assert result.mean_delay_s == pytest.approx(45.0)  # (0 + 90) / 2
    assert result.makespan_s == pytest.approx(150.0)
    assert result.not_started == 0 and result.never_started == 0
    # The horizon is the trace's own: 0 → 100 (a's deletion); the GPU is busy all of it.
    assert result.horizon_s == pytest.approx(100.0)
    assert result.alloc_pct == pytest.approx(100.0)


def test_time_averaged_allocation_matches_the_hand_computation() -> None:
    tasks = [timed("a", 0, 100), timed("b", 50, 50, gpu_milli=500)]
    result = run_dynamic([node("n0", 2)], tasks, "whalegen", 1, mix=MIX)
    # (1000 milli × 100 s + 500 milli × 50 s) / (2000 milli × 100 s) = 62.5 %
    assert result.alloc_pct == pytest.approx(62.5)
    assert result.offered_pct == pytest.approx(62.5)
    assert result.mean_delay_s == 0.0
    assert result.series_alloc_pct[0] == pytest.approx(50.0)
    assert result.series_alloc_pct[-1] == pytest.approx(75.0)


@pytest.mark.parametrize("window", [1, 32], ids=["strict fifo", "window of 32"])
def test_a_task_that_fits_no_node_is_counted_as_never_started_and_does_not_block_the_rest(
    window: int,
) -> None:
    tasks = [timed("big", 0, 100, num_gpu=2), timed("small", 5, 10)]
    result = run_dynamic([node("n0", 1)], tasks, "fgd", 1, mix=MIX, queue_window=window)
    assert result.never_started == 1
    assert result.not_started == 1
    assert result.mean_delay_s == 0.0  # "small" starts on arrival: "big" was rejected, not queued


def test_a_task_started_after_the_trace_ends_counts_as_not_started_by_the_end() -> None:
    # a holds the GPU to 100; c would only start at 100 + 80 = 180, after the horizon (0 → 150).
    tasks = [timed("a", 0, 100), timed("b", 1, 80), timed("c", 2, 148)]
    result = run_dynamic([node("n0", 1)], tasks, "fgd", 1, mix=MIX)
    assert result.horizon_s == pytest.approx(150.0)
    assert result.not_started == 1
    assert result.never_started == 0
    assert result.makespan_s == pytest.approx(180 + 148)


def test_the_queue_window_bounds_which_waiting_tasks_are_tried() -> None:
    # One GPU busy to 100; three whole-GPU tasks queue behind it, then a CPU-only task arrives at 10.
    # A long CPU-only task keeps the horizon open (0 → 1000) so every start falls inside it.
    tasks = [
        TimedTask(TaskRequest("clock", 1000, 1024), 0, 1000),
        timed("a", 0, 100),
        *(timed(f"q{i}", 1 + i, 10) for i in range(3)),
        TimedTask(TaskRequest("cpu", 1000, 1024), 10, 5),
    ]
    wide = run_dynamic([node("n0", 1)], tasks, "fgd", 1, mix=MIX, queue_window=8)
    narrow = run_dynamic([node("n0", 1)], tasks, "fgd", 1, mix=MIX, queue_window=2)
    # Wide: "cpu" starts on arrival. Narrow: it is fourth in line and each departure spends its two tries
    # on one q that starts and one that does not (100: q0, q1; 110: q1, q2), so it starts at 120 with q2.
    # The q tasks start at 100, 110, 120 either way.
    total_wide = wide.mean_delay_s * wide.tasks
    total_narrow = narrow.mean_delay_s * narrow.tasks
    assert total_narrow - total_wide == pytest.approx(120 - 10)
    assert total_wide == pytest.approx((100 - 1) + (110 - 2) + (120 - 3))


def _two_gaps(policy: str) -> tuple[Engine, ForecastAligned]:
    """Two identical one-GPU nodes, each with a 500-milli share running: two equally good gaps."""
    running = tuple(RunningTask(f"r{i}", f"n{i}", (0,), 500, 1000, 1024) for i in range(2))
    # A snapshot's free figures already exclude its running tasks.
    nodes = tuple(
        NodeState(f"n{i}", 64_000, 63_000, 256_000, 256_000 - 1024, (GpuState(0, "T4", 500, 0, 0),))
        for i in range(2)
    )
    snapshot = ClusterSnapshot(nodes, running=running, shape_mix=MIX)
    engine = Engine(snapshot, EngineConfig(policy=policy))
    wrapper = ForecastAligned(engine.policy)
    wrapper.adopt(engine)
    wrapper.started("r0", 0, (0,), end_s=1000.0)
    wrapper.started("r1", 1, (0,), end_s=100.0)
    return engine, wrapper


@pytest.mark.parametrize("policy", ["whalegen", "fgd"])
@pytest.mark.parametrize(
    ("end_s", "want_node"),
    [(None, "n0"), (90.0, "n1"), (950.0, "n0")],
    ids=["without a forecast the first node wins", "a short task joins the short one", "a long one the long"],
)
def test_the_forecast_wrapper_puts_a_share_next_to_tasks_ending_at_the_same_time(
    policy: str, end_s: float | None, want_node: str
) -> None:
    engine, wrapper = _two_gaps(policy)
    wrapper.expect(end_s, now_s=0.0)
    result = engine.solve((TaskRequest("new", 1000, 1024, 1, 500),), 0.0)
    assert result.placements[0].node == want_node
    assert result.placements[0].gpu_indexes == (0,)


def test_a_whole_gpu_task_aligned_among_tied_nodes_still_gets_its_gpus() -> None:
    nodes = tuple(node(f"n{i}", 2) for i in range(3))
    engine = Engine(ClusterSnapshot(nodes, shape_mix=MIX), EngineConfig(policy="whalegen"))
    wrapper = ForecastAligned(engine.policy, slack=100)
    wrapper.adopt(engine)
    wrapper.expect(500.0, now_s=0.0)
    first = engine.solve((TaskRequest("a", 1000, 1024, 2, 1000),), 0.0).placements[0]
    wrapper.started("a", engine.state.index[first.node], (0, 1), 500.0)
    wrapper.expect(400.0, now_s=0.0)
    second = engine.solve((TaskRequest("b", 1000, 1024, 1, 1000),), 0.0).placements[0]
    assert len(first.gpu_indexes) == 2
    assert len(second.gpu_indexes) == 1


def test_a_departed_task_no_longer_steers_the_wrapper() -> None:
    engine, wrapper = _two_gaps("whalegen")
    request = Request.of(TaskRequest("new", 1000, 1024, 1, 500))
    wrapper.expect(90.0, now_s=0.0)
    assert engine.choose(request) == (1, (0,))  # n1's task ends at 100, near this one's 90
    wrapper.departed("r1")
    # n1's prediction is forgotten: only n0 has a predicted end, so it is the better-known place.
    assert engine.choose(request) == (0, (0,))


def _synthetic(seed: int, count: int = 300) -> list[TimedTask]:
    rng = random.Random(seed)
    shapes = [(1, 1000), (1, 500), (1, 250), (2, 1000), (0, 0)]
    tasks = []
    for i in range(count):
        num_gpu, milli = rng.choice(shapes)
        request = TaskRequest(f"t{i}", rng.choice([1000, 4000, 8000]), 4096, num_gpu, milli)
        tasks.append(TimedTask(request, rng.uniform(0, 3_000), rng.expovariate(1 / 200)))
    return tasks


def _comparable(result: object) -> dict[str, object]:
    fields = dataclasses.asdict(result)  # type: ignore[call-overload]
    fields.pop("cpu_seconds")
    fields.pop("policy")
    fields.pop("forecast")
    return dict(fields)


def test_forecasts_off_decide_exactly_as_the_plain_policy() -> None:
    cluster = [node(f"n{i}", 4) for i in range(3)]
    tasks = _synthetic(5)
    plain = run_dynamic(cluster, tasks, "whalegen", 7)
    wrapped = run_dynamic(cluster, tasks, "whalegen+forecast", 7, predicted_s={})
    assert plain.mean_delay_s > 0  # the trace does contend, so the comparison means something
    assert _comparable(plain) == _comparable(wrapped)


def test_oracle_forecasts_change_decisions_on_a_contended_trace() -> None:
    cluster = [node(f"n{i}", 4) for i in range(3)]
    tasks = _synthetic(5)
    oracle = {t.request.task_id: t.lifetime_s for t in tasks}
    plain = run_dynamic(cluster, tasks, "whalegen", 7)
    aligned = run_dynamic(cluster, tasks, "whalegen+forecast", 7, predicted_s=oracle, forecast="oracle")
    assert aligned.forecast == "oracle"
    assert _comparable(plain) != _comparable(aligned)


def test_the_same_seed_gives_the_same_run_and_cluster() -> None:
    nodes = [node(f"n{i}", 1 + i % 4) for i in range(40)]
    assert sample_cluster(nodes, 0.25, 3) == sample_cluster(nodes, 0.25, 3)
    assert sample_cluster(nodes, 0.25, 3) != sample_cluster(nodes, 0.25, 4)
    assert len(sample_cluster(nodes, 0.25, 3)) == 10
    cluster = list(sample_cluster(nodes, 0.1, 3))
    tasks = _synthetic(9)
    first = run_dynamic(cluster, tasks, "fgd", 3)
    second = run_dynamic(cluster, tasks, "fgd", 3)
    assert _comparable(first) == _comparable(second)


def test_the_window_keeps_tasks_alive_at_the_split_with_what_is_left_of_their_lifetime() -> None:
    tasks = [timed("old", 0, 50), timed("alive", 10, 100), timed("new", 60, 5), timed("later", 70, 5)]
    split = split_time(tasks, 0.5)
    assert split == 60
    window = {t.request.task_id: t for t in trace_window(tasks, split)}
    assert set(window) == {"alive", "new", "later"}
    assert (window["alive"].creation_s, window["alive"].lifetime_s) == (60, 50)


@needs_trace
def test_the_loader_reads_lifetimes_as_deletion_minus_creation() -> None:
    tasks = load_timed_tasks(TRACES / pod_file("default"))
    assert len(tasks) == 8152
    with (TRACES / pod_file("default")).open() as handle:
        row = next(csv.DictReader(handle))
    assert tasks[0].lifetime_s == float(row["deletion_time"]) - float(row["creation_time"])


@needs_trace
def test_the_command_prints_json_for_each_policy_and_forecast(tmp_path: Path) -> None:
    plot = tmp_path / "alloc.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "whalegen",
            "replay",
            "--dynamic",
            "--policy",
            "fgd,whalegen+forecast",
            "--forecast",
            "none,oracle",
            "--cluster-frac",
            "0.008",
            "--split-frac",
            "0.95",
            "--seeds",
            "42",
            "--json",
            "--plot",
            str(plot),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    runs = json.loads(out.stdout)["runs"]
    assert [(r["policy"], r["forecast"]) for r in runs] == [
        ("fgd", "none"),
        ("whalegen+forecast", "none"),
        ("whalegen+forecast", "oracle"),
    ]
    assert all(0 < r["alloc_pct"] <= 100 for r in runs)
    assert "arrivals" in out.stderr  # progress
    assert plot.stat().st_size > 10_000
