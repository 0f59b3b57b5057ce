"""What the production cycle needs from the engine: MIG slices, isolation, online-SLA headroom, order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.whalegen.placement.builders import node, snapshot, task
from whalegen.placement.engine import EngineConfig, solve_cycle
from whalegen.placement.types import (
    GpuState,
    Isolation,
    NodeState,
    Outcome,
    PartitionMode,
    RunningTask,
    UnitKind,
)

GIB = 1024
H100 = "H100-80GB"


def h100_mig_node(name: str, gpus: list[tuple[int, int]]) -> NodeState:
    """An H100 node in MIG mode; per GPU (free milli as the snapshot reports it, occupied slice mask)."""
    states = tuple(
        GpuState(i, H100, free, 80 * GIB, 80 * GIB, PartitionMode.MIG, mask)
        for i, (free, mask) in enumerate(gpus)
    )
    return NodeState(name, 64_000, 64_000, 512 * GIB, 512 * GIB, states)


@pytest.mark.parametrize("policy", ["whalegen", "fgd", "bestfit"])
def test_a_small_task_goes_into_the_free_slices_of_a_partly_used_mig_gpu(policy: str) -> None:
    # GPU 0 has slice 0 taken by a running 1g.10gb (142 milli); GPU 1 is untouched. The 1g request must use
    # GPU 0's free slices (keeping GPU 1 whole), and on a pool of only partly used MIG GPUs it must place.
    small = task("small", gpus=1, milli=142, gpu_mem_mib=9000)
    partly = h100_mig_node("a", [(858, 0b1), (1000, 0)])
    (placement,) = solve_cycle(snapshot([partly], [small]), EngineConfig(policy=policy), now=0.0).placements
    assert placement.gpu_indexes == (0,)
    assert placement.unit.kind is UnitKind.MIG and placement.unit.mig_profile == "1g.10gb"
    assert placement.unit.mig_start_slice == 1
    only_partly = h100_mig_node("b", [(858, 0b1)])
    result = solve_cycle(snapshot([only_partly], [small]), EngineConfig(policy=policy), now=0.0)
    assert [p.gpu_indexes for p in result.placements] == [(0,)]


def test_preempting_a_running_mig_task_frees_its_slices() -> None:
    # Both 3g.40gb instances (428 milli each) of the GPU are held; the one at slices 0-3 is preemptible.
    full = h100_mig_node("a", [(144, 0xFF)])
    running = [
        RunningTask(
            "low", "a", (0,), 428, 1000, GIB, preemptible=True, mig_profile="3g.40gb", mig_start_slice=0
        ),
        RunningTask("other", "a", (0,), 428, 1000, GIB, priority=5, mig_profile="3g.40gb", mig_start_slice=4),
    ]
    urgent = task("urgent", gpus=1, milli=400, gpu_mem_mib=30_000, priority=10)
    result = solve_cycle(
        snapshot([full], [urgent], running=running), EngineConfig(policy="whalegen"), now=5.0
    )
    assert [p.victim_task_id for p in result.preemptions] == ["low"]
    assert result.unplaced[0].outcome is Outcome.WAITING_FOR_PREEMPTION


def mixed_nodes() -> list[NodeState]:
    shared = node("s", gpus=2, free=[500, 1000])
    mig = node("m", model="A100-40GB", gpus=1, gpu_mem_mib=40_960, mode=PartitionMode.MIG)
    return [shared, mig]


@pytest.mark.parametrize("policy", ["whalegen", "fgd"])
def test_isolation_filters_the_kind_of_gpu(policy: str) -> None:
    cfg = EngineConfig(policy=policy)
    on_mig = task("t", gpus=1, milli=140, gpu_mem_mib=4000, isolation=Isolation.MIG)
    (p,) = solve_cycle(snapshot(mixed_nodes(), [on_mig]), cfg, now=0.0).placements
    assert p.node == "m" and p.unit.kind is UnitKind.MIG
    on_mps = task("t", gpus=1, milli=140, isolation=Isolation.MPS)
    (p,) = solve_cycle(snapshot(mixed_nodes()[::-1], [on_mps]), cfg, now=0.0).placements
    assert p.node == "s" and p.unit.kind is UnitKind.SHARE


@pytest.mark.parametrize("policy", ["whalegen", "fgd"])
def test_an_exclusive_task_gets_a_whole_gpu_nobody_else_uses(policy: str) -> None:
    cfg = EngineConfig(policy=policy)
    alone = task("alone", gpus=1, milli=300, isolation=Isolation.EXCLUSIVE)
    second = task("second", gpus=1, milli=300, isolation=Isolation.EXCLUSIVE, submitted_at_s=1)
    filler = task("filler", gpus=1, milli=500, submitted_at_s=2)
    nodes = [node("s", gpus=2, free=[500, 1000])]
    result = solve_cycle(snapshot(nodes, [alone, second, filler]), cfg, now=0.0)
    placed = {p.task_id: p for p in result.placements}
    assert placed["alone"].gpu_indexes == (1,) and placed["alone"].unit.kind is UnitKind.WHOLE
    # The exclusive task's GPU is not shared afterwards: the filler takes GPU 0's 500 milli.
    assert placed["filler"].gpu_indexes == (0,)
    (unplaced,) = result.unplaced
    assert unplaced.task_id == "second" and "exclusive" in unplaced.message


def test_isolation_nothing_offers_has_its_own_reason() -> None:
    only_shared = [node("s", gpus=2)]
    (unplaced,) = solve_cycle(
        snapshot(only_shared, [task("t", gpus=1, milli=140, isolation=Isolation.MIG)]),
        EngineConfig(policy="whalegen"),
        now=0.0,
    ).unplaced
    assert unplaced.outcome is Outcome.NO_ISOLATION
    assert unplaced.message == "no schedulable node has a GPU in MIG mode (isolation mig)"


def test_batch_tasks_leave_the_online_reserve_free() -> None:
    cfg = EngineConfig(policy="whalegen", online_reserve_milli=1000)
    tasks = [
        task("batch1", gpus=1, milli=1000),
        task("batch2", gpus=1, milli=500, submitted_at_s=1),
        task("online", gpus=1, milli=1000, sla_online=True, submitted_at_s=2),
    ]
    result = solve_cycle(snapshot([node("a", gpus=2)], tasks), cfg, now=0.0)
    assert sorted(p.task_id for p in result.placements) == ["batch1", "online"]
    (unplaced,) = result.unplaced
    assert unplaced.task_id == "batch2" and unplaced.outcome is Outcome.ONLINE_RESERVE
    assert unplaced.message == (
        "batch task asks 500 milli-GPU; 1000 milli-GPU is free and the pool keeps 1000 for online tasks"
    )


def test_without_a_reserve_batch_tasks_may_use_everything() -> None:
    tasks = [task("b1", gpus=1, milli=1000), task("b2", gpus=1, milli=1000, submitted_at_s=1)]
    result = solve_cycle(snapshot([node("a", gpus=2)], tasks), EngineConfig(policy="whalegen"), now=0.0)
    assert len(result.placements) == 2


def test_an_order_key_overrides_priority_order() -> None:
    # One GPU, two tasks: by priority "high" would win; the cycle's fair-share order says "fair" first.
    tasks = [task("high", gpus=1, priority=5, order_key=1), task("fair", gpus=1, priority=0, order_key=0)]
    result = solve_cycle(snapshot([node("a", gpus=1)], tasks), EngineConfig(policy="fgd"), now=0.0)
    assert [p.task_id for p in result.placements] == ["fair"]
    without = [task("high", gpus=1, priority=5), task("low", gpus=1, priority=0)]
    result = solve_cycle(snapshot([node("a", gpus=1)], without), EngineConfig(policy="fgd"), now=0.0)
    assert [p.task_id for p in result.placements] == ["high"]


def _full_pool_of_batch(*, online_victim: bool = False, preemptible: bool = True) -> list[RunningTask]:
    """Two whole GPUs held by batch tasks of priority 0; `b1` started last (it loses least)."""
    return [
        RunningTask("b0", "a", (0,), 1000, 1000, GIB, preemptible=preemptible, started_at_s=0.0),
        RunningTask(
            "b1",
            "a",
            (1,),
            1000,
            1000,
            GIB,
            preemptible=preemptible,
            started_at_s=50.0,
            sla_online=online_victim,
        ),
    ]


def test_an_online_task_finding_no_room_displaces_preemptible_batch_work_of_its_priority() -> None:
    cfg = EngineConfig(
        policy="whalegen",
        online_reserve_milli=1500,
        online_reserve_why="1.5 GPUs forecast for online arrivals",
    )
    online = task("svc", gpus=1, milli=1000, sla_online=True)
    result = solve_cycle(
        snapshot([node("a", gpus=2, free=[0, 0])], [online], running=_full_pool_of_batch()), cfg, now=100.0
    )
    (victim,) = result.preemptions
    assert (victim.victim_task_id, victim.for_task_id) == ("b1", "svc")
    assert victim.reason == (
        "preemptible batch work making way for online task svc within the pool's online-service reserve of "
        "1500 milli-GPU: 1.5 GPUs forecast for online arrivals; loses 50 GPU-seconds of progress"
    )
    assert result.unplaced[0].outcome is Outcome.WAITING_FOR_PREEMPTION


@pytest.mark.parametrize(
    ("reserve_milli", "online_victim", "preemptible", "ask_milli"),
    [
        (0, False, True, 1000),
        (1500, True, True, 1000),
        (1500, False, False, 1000),
        (500, False, True, 1000),
    ],
    ids=[
        "without a reserve priority alone decides",
        "an online task is never displaced for another",
        "batch work that is not preemptible stays",
        "an ask larger than the reserve was not kept for",
    ],
)
def test_the_reserve_displaces_only_what_it_may(
    reserve_milli: int, online_victim: bool, preemptible: bool, ask_milli: int
) -> None:
    cfg = EngineConfig(policy="whalegen", online_reserve_milli=reserve_milli)
    online = task("svc", gpus=1, milli=ask_milli, sla_online=True)
    running = _full_pool_of_batch(online_victim=online_victim, preemptible=preemptible)
    if online_victim:  # both running tasks online: nothing batch to displace
        running = [replace(r, sla_online=True) for r in running]
    result = solve_cycle(
        snapshot([node("a", gpus=2, free=[0, 0])], [online], running=running), cfg, now=100.0
    )
    assert result.preemptions == ()
    assert result.unplaced[0].outcome is Outcome.NO_CAPACITY


def test_a_higher_priority_batch_task_outranks_the_online_class() -> None:
    cfg = EngineConfig(policy="whalegen", online_reserve_milli=1500)
    online = task("svc", gpus=1, milli=1000, sla_online=True)
    running = [replace(r, priority=5) for r in _full_pool_of_batch()]
    result = solve_cycle(
        snapshot([node("a", gpus=2, free=[0, 0])], [online], running=running), cfg, now=100.0
    )
    assert result.preemptions == ()
