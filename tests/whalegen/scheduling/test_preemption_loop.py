"""Preemption in decisions made one after another (issue #41's ping-pong): a victim is only stopped for a
task that then takes the room its leaving makes, so no task is stopped again and again for nothing."""

from __future__ import annotations

import pytest

from tests.whalegen.placement.builders import node, task
from tests.whalegen.scheduling.cycles import Cycles
from whalegen.scheduling import Config

POLICIES = ["whalegen", "bestfit", "fgd", "k8s-default"]


def _best_effort(task_id: str, **extra: object) -> object:
    return task(task_id, gpus=1, cpu=2, preemptible=True, priority=0, submitted_at_s=0.0, **extra)


@pytest.mark.parametrize("policy", POLICIES)
def test_victims_are_not_stopped_again_and_again_for_a_task_lower_work_keeps_out(policy: str) -> None:
    # One node of two GPUs and 8 cores. a and b (best effort, 2 cores each) hold the GPUs; c (best effort,
    # CPU only, 4 cores) waits. p (priority 1) needs a GPU and 6 cores: stopping a frees a GPU and 2
    # cores, enough beside the 4 idle ones. Before the fix the same decision then gave c those 4 cores,
    # so at the next cycle p lacked CPU again and stopped c (or a, back on its GPU), cycle after cycle.
    pool = Cycles(
        [node("n1", gpus=2, cpu=8)],
        [_best_effort("a"), _best_effort("b")],
        Config(policy=policy),
    )
    pool.step(0.0)
    assert set(pool.running) == {"a", "b"}
    pool.pending += [
        task("p", gpus=1, cpu=6, priority=1, submitted_at_s=1.0),
        task("c", cpu=4, preemptible=True, priority=0, submitted_at_s=2.0),
    ]
    for cycle in range(1, 9):
        pool.step(float(cycle))
    assert "p" in pool.running
    assert sum(pool.stopped.values()) == 1, pool.stopped
    first = pool.history[1]
    assert [(v.victim_task_id, v.for_task_id) for v in first.preemptions] == [("a", "p")]
    # The room a leaves is p's alone in that decision: c does not take the idle cores p counted on.
    assert "c" not in {b.task_id for b in first.placements}
    assert "p" in {b.task_id for b in pool.history[2].placements}


@pytest.mark.parametrize("policy", POLICIES)
def test_nothing_is_stopped_for_a_task_the_victims_room_would_not_hold(policy: str) -> None:
    # p needs 12 cores: the node has 8, so stopping a and b frees GPUs but never enough CPU.
    pool = Cycles(
        [node("n1", gpus=2, cpu=8)],
        [_best_effort("a"), _best_effort("b")],
        Config(policy=policy),
    )
    pool.step(0.0)
    pool.pending.append(task("p", gpus=1, cpu=12, priority=1, submitted_at_s=1.0))
    decisions = pool.step(1.0)
    assert decisions.preemptions == ()
    assert "CPU (12 cores)" in decisions.unplaced["p"].message


@pytest.mark.parametrize("policy", POLICIES)
def test_a_second_task_does_not_preempt_on_a_node_held_for_the_first_and_says_so(policy: str) -> None:
    # p1 stops a on n1 and counts on n1's idle cores; p2 could stop b there, but n1 is held for p1 this
    # cycle: p2 waits, and its reason names the hold. At the next cycle p1 runs and p2 may preempt.
    pool = Cycles([node("n1", gpus=2, cpu=8)], [_best_effort("a"), _best_effort("b")], Config(policy=policy))
    pool.step(0.0)
    pool.pending += [
        task("p1", gpus=1, cpu=6, priority=1, submitted_at_s=1.0),
        task("p2", gpus=1, cpu=1, priority=1, submitted_at_s=2.0),
    ]
    first = pool.step(1.0)
    assert [(v.victim_task_id, v.for_task_id) for v in first.preemptions] == [("a", "p1")]
    assert "not preempted for on n1: held this cycle for p1" in first.unplaced["p2"].message
    second = pool.step(2.0)
    assert "p1" in {b.task_id for b in second.placements}
    assert [(v.victim_task_id, v.for_task_id) for v in second.preemptions] == [("b", "p2")]
    third = pool.step(3.0)
    assert "p2" in {b.task_id for b in third.placements}
    pool.step(4.0)
    assert pool.stopped == {"a": 1, "b": 1} and {"p1", "p2"} <= set(pool.running)
