"""Start estimates walk the queue ahead: hand-computed cases for `queue_starts`, and through `decide`
(the decision's order, not the submission order, decides who is served first)."""

from __future__ import annotations

from tests.whalegen.placement.builders import task
from tests.whalegen.scheduling.builders import Pool, whole
from whalegen.placement.types import RunningTask
from whalegen.scheduling import Config, decide
from whalegen.scheduling.estimate import queue_starts


def test_each_task_waits_for_the_tasks_ahead_of_it_not_only_for_what_runs() -> None:
    # 1,000 milli frees at 600; three one-GPU tasks run 300 s each: 600, 900, 1,200.
    queue = [task(f"q{i}", gpus=1) for i in range(3)]
    starts = queue_starts(queue, {"H100": 0}, {"H100": [(600.0, 1000)]}, {}, lambda _: 300.0, 100.0)
    assert [starts[t.task_id].start_s for t in queue] == [600.0, 900.0, 1200.0]


def test_small_tasks_share_what_frees_and_an_overdue_end_counts_as_now() -> None:
    # 500 idle now; 1,000 overdue (end 50 < now 100) counts as freed now: 1,500 milli for 250 + 500 + 500
    # + 250 at 100; the fifth (500) waits for the first of them to end (100 + 40 = 140 frees 250; the
    # second, 100 + 60 = 160, frees 500 more).
    sizes = [250, 500, 500, 250, 500]
    queue = [task(f"s{i}", gpus=1, milli=m) for i, m in enumerate(sizes)]
    runs = {"s0": 40.0, "s1": 60.0, "s2": 1000.0, "s3": 1000.0, "s4": 10.0}
    starts = queue_starts(queue, {"A": 500}, {"A": [(50.0, 1000)]}, {}, runs.get, 100.0)
    assert [starts[t.task_id].start_s for t in queue] == [100.0, 100.0, 100.0, 100.0, 160.0]


def test_models_a_task_may_not_use_do_not_serve_it_and_the_order_is_kept() -> None:
    # A: 500 idle. B: 1,000 frees at 100. t1 (any model, 1,000) starts at 100 on B (most free first) and
    # frees it at 150. t2 (A only, 500) fits A now but starts no earlier than t1: 100. t3 (B only) waits
    # for t1's end: 150, and holds B for good (no run time). t4 (2,000) can never be served: unknown,
    # because t3 ahead of it holds what it needs with no known end; it holds nothing back.
    t1 = task("t1", gpus=1)
    t2 = task("t2", gpus=1, milli=500, models=["A"])
    t3 = task("t3", gpus=1, models=["B"])
    t4 = task("t4", gpus=2)
    t5 = task("t5", gpus=1, milli=500, models=["A"])
    runs = {"t1": 50.0, "t2": 400.0, "t5": 10.0}
    starts = queue_starts([t1, t2, t3, t4, t5], {"A": 500, "B": 0}, {"B": [(100.0, 1000)]}, {}, runs.get, 0.0)
    assert [starts[t].start_s for t in ("t1", "t2", "t3", "t4", "t5")] == [100.0, 100.0, 150.0, None, 500.0]
    assert "tasks ahead of it in the queue take 1000 milli-GPU" in starts["t4"].why_unknown


def test_a_running_task_without_a_known_end_makes_the_estimate_unknown_and_says_so() -> None:
    starts = queue_starts([task("w", gpus=1)], {"A": 0}, {}, {"A": 1000}, lambda _: 60.0, 0.0)
    assert starts["w"].start_s is None
    assert "held by tasks with no known end" in starts["w"].why_unknown


def test_decide_serves_the_queue_in_its_own_order() -> None:
    # One GPU, held until 600. The high-priority task submitted last is ordered first: it starts at 600
    # and runs 3,600 s; the low-priority one, submitted first, starts after it, at 4,200.
    running = RunningTask("r", "w", (0,), 1000, 1000, 1024, started_at_s=0.0)
    pool = Pool().node("w", whole(held=True))
    low = task("low", gpus=1, priority=0, submitted_at_s=0.0)
    high = task("high", gpus=1, priority=9, submitted_at_s=50.0)
    snapshot = pool.snapshot(
        [low, high],
        running=[running],
        expected_end_s={"r": 600.0},
        expected_runtime_s={"low": 60.0, "high": 3600.0},
    )
    decisions = decide(snapshot, Config(), 100.0)
    assert decisions.estimates == {"high": 600.0, "low": 4200.0}


def test_an_unknown_start_says_what_the_tasks_ahead_took_since_the_last_unknown() -> None:
    # 1,000 idle, nothing due. u1 (2,000) can never start: nothing would free enough. t (1,000) starts now
    # and, with no run time, takes the 1,000 for good. u2 (2,000) is unknown too, now because of t.
    u1, t, u2 = task("u1", gpus=2), task("t", gpus=1), task("u2", gpus=2)
    starts = queue_starts([u1, t, u2], {"A": 1000}, {}, {}, lambda _: None, 0.0)
    assert [starts[x].start_s for x in ("u1", "t", "u2")] == [None, 0.0, None]
    assert starts["u1"].why_unknown == "nothing running on the GPUs it may use would free enough"
    assert "tasks ahead of it in the queue take 1000 milli-GPU" in starts["u2"].why_unknown


def test_a_task_larger_than_every_node_has_no_estimate_however_much_the_pool_frees() -> None:
    # Two idle 2-GPU nodes hold 4 GPUs in all: summed, a 3-GPU task "fits now"; no node could hold it.
    pool = Pool().node("w1", whole(), whole()).node("w2", whole(), whole())
    big, small = task("big", gpus=3), task("small", gpus=2)
    decisions = decide(pool.snapshot([big, small]), Config(), 100.0)
    assert "big" not in decisions.estimates or decisions.estimates["big"] is None
    why = decisions.unplaced["big"].message
    assert "estimated start unknown: no schedulable node could hold 3 GPUs" in why
