"""Reservations for large and gang tasks: the pure planner (`whalegen.scheduling.reserve`) and the optional
step in `decide` (`Config.reserve`), which leaves the default decision unchanged."""

from __future__ import annotations

import math

from tests.whalegen.placement.builders import task
from tests.whalegen.scheduling.builders import Pool, whole
from whalegen.placement.types import RunningTask
from whalegen.scheduling import Config, decide
from whalegen.scheduling.reserve import Holder, NodeRoom, ReserveConfig, delays, plan
from whalegen.scheduling.types import Code

CONFIG = ReserveConfig()


def room(*free: int, cpu: int = 64_000, mem: int = 512_000) -> NodeRoom:
    return NodeRoom(tuple(free), cpu, mem)


def holder(task_id: str, node: int, gpus: tuple[int, ...], end_s: float | None) -> Holder:
    return Holder(task_id, node, gpus, tuple(1000 for _ in gpus), 1000, 1024, end_s)


# -- the planner ---------------------------------------------------------------------------------------


def test_the_predicted_start_is_the_first_end_after_which_one_node_holds_the_task() -> None:
    rooms = [room(0, 0, 1000, 1000), room(0, 0, 0, 1000)]
    holders = [
        holder("a", 0, (0,), 500.0),
        holder("b", 1, (0, 1, 2), 200.0),  # frees three GPUs on node 1 first: 4 free there at 200
        holder("c", 0, (1,), 900.0),
    ]
    reservation = plan([task("big", gpus=4)], rooms, holders, 0.0, CONFIG)
    assert (reservation.start_s, reservation.nodes) == (200.0, (1,))


def test_a_task_past_its_predicted_end_is_expected_soon_not_already_gone() -> None:
    rooms = [room(0, 1000)]
    reservation = plan([task("big", gpus=2)], rooms, [holder("a", 0, (0,), 50.0)], 100.0, CONFIG)
    assert reservation.start_s == 100.0 + CONFIG.overdue_s


def test_without_known_ends_the_node_closest_to_holding_it_is_drained_with_no_start() -> None:
    rooms = [room(0, 0, 0, 1000), room(0, 0, 1000, 1000)]
    holders = [holder("a", 0, (0, 1, 2), None), holder("b", 1, (0, 1), None)]
    reservation = plan([task("big", gpus=4)], rooms, holders, 0.0, CONFIG)
    assert (reservation.start_s, reservation.nodes) == (None, (1,))


def test_a_gang_is_reserved_across_the_nodes_its_members_need() -> None:
    rooms = [room(0, 1000), room(0, 1000)]
    holders = [holder("a", 0, (0,), 100.0), holder("b", 1, (0,), 300.0)]
    members = [task("g0", gpus=2, gang_id="g", gang_size=2), task("g1", gpus=2, gang_id="g", gang_size=2)]
    reservation = plan(members, rooms, holders, 0.0, CONFIG)
    assert (reservation.task_ids, reservation.start_s, reservation.nodes) == (("g0", "g1"), 300.0, (0, 1))


def test_backfill_is_held_only_when_it_would_push_the_reserved_start() -> None:
    rooms = [room(0, 1000, 1000, 1000), room(1000, 1000)]
    holders = [holder("a", 0, (0,), 100.0)]
    big = [task("big", gpus=4)]
    reservation = plan(big, rooms, holders, 0.0, CONFIG)
    assert (reservation.start_s, reservation.nodes) == (100.0, (0,))
    # On the reserved node, running past the start: held. Ending before it, or elsewhere: not.
    assert delays(reservation, big, rooms, holders, holder("late", 0, (1,), 150.0), 0.0, CONFIG)
    assert not delays(reservation, big, rooms, holders, holder("short", 0, (1,), 90.0), 0.0, CONFIG)
    assert not delays(reservation, big, rooms, holders, holder("away", 1, (0,), math.inf), 0.0, CONFIG)


def test_backfill_with_no_known_end_is_held_on_a_drained_node_unless_both_fit() -> None:
    rooms = [room(0, 1000, 1000, 1000, 1000, 1000)]
    holders = [holder("a", 0, (0,), None)]
    big = [task("big", gpus=4)]
    reservation = plan(big, rooms, holders, 0.0, CONFIG)
    assert reservation.start_s is None
    # Six GPUs: the big task and a one-GPU task fit side by side even once drained, two more do not.
    assert not delays(reservation, big, rooms, holders, holder("x", 0, (1,), None), 0.0, CONFIG)
    two = Holder("y", 0, (1, 2, 3), (1000, 1000, 1000), 1000, 1024, None)
    assert delays(reservation, big, rooms, holders, two, 0.0, CONFIG)


# -- the step in decide --------------------------------------------------------------------------------


def _pool_with_one_gpu_held() -> tuple[Pool, RunningTask]:
    pool = Pool().node("n", whole(held=True), whole(), whole(), whole())
    return pool, RunningTask("r", "n", (0,), 1000, 1000, 1024, started_at_s=0.0)


def test_decide_holds_a_long_backfill_for_the_reserved_task_and_shows_its_predicted_start() -> None:
    pool, running = _pool_with_one_gpu_held()
    big = task("big", gpus=4, submitted_at_s=0.0)
    small = task("small", gpus=1, submitted_at_s=1.0)
    snapshot = pool.snapshot(
        [big, small], running=[running], expected_end_s={"r": 600.0}, expected_runtime_s={"small": 3600.0}
    )
    decisions = decide(snapshot, Config(reserve=ReserveConfig()), 100.0)
    assert decisions.placements == ()
    assert decisions.reservation is not None
    assert (decisions.reservation.task_ids, decisions.reservation.start_s) == (("big",), 600.0)
    assert decisions.unplaced["small"].code == Code.HELD_FOR_RESERVATION
    assert "big" in decisions.unplaced["small"].message
    assert decisions.estimates["big"] == 600.0
    assert decisions.estimates["small"] == 600.0


def test_decide_lets_a_backfill_through_that_ends_before_the_reserved_start() -> None:
    pool, running = _pool_with_one_gpu_held()
    big = task("big", gpus=4, submitted_at_s=0.0)
    small = task("small", gpus=1, submitted_at_s=1.0)
    snapshot = pool.snapshot(
        [big, small], running=[running], expected_end_s={"r": 600.0}, expected_runtime_s={"small": 300.0}
    )
    decisions = decide(snapshot, Config(reserve=ReserveConfig()), 100.0)
    assert [b.task_id for b in decisions.placements] == ["small"]
    assert decisions.reservation is not None and decisions.reservation.start_s == 600.0


def test_without_reserve_in_the_config_the_decision_is_the_default_one() -> None:
    pool, running = _pool_with_one_gpu_held()
    big = task("big", gpus=4, submitted_at_s=0.0)
    small = task("small", gpus=1, submitted_at_s=1.0)
    snapshot = pool.snapshot(
        [big, small], running=[running], expected_end_s={"r": 600.0}, expected_runtime_s={"small": 3600.0}
    )
    decisions = decide(snapshot, Config(), 100.0)
    assert [b.task_id for b in decisions.placements] == ["small"]
    assert decisions.reservation is None
