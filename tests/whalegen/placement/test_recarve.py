"""`solve_recarving_last`: present units first; idle MIG GPUs are opened to a new layout only for the tasks
none of them holds, single one-GPU tasks before gangs, and without stopping running work for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.whalegen.placement.builders import task
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.recarve import (
    FreeInstance,
    IdleMigGpu,
    RecarveResult,
    disguised_recarves,
    solve_recarving_last,
)
from whalegen.placement.types import (
    ClusterSnapshot,
    ComputeUnit,
    GpuState,
    NodeState,
    PartitionMode,
    Placement,
    RunningTask,
    TaskRequest,
    UnitKind,
)

H100 = "H100-80GB"
MEM = 81_152
THREE_G = FreeInstance("3g.40gb", 0, 428, 40_448)
POLICIES = ["whalegen", "bestfit", "fgd"]


def mig_node(name: str, gpus: int = 1) -> NodeState:
    """H100s in MIG mode, each carved 3g.40gb@0 (free), the other half of the GPU uncarved."""
    carved = tuple(GpuState(i, H100, 428, 40_448, MEM, PartitionMode.MIG, 0b1111_0000) for i in range(gpus))
    return NodeState(name, 64_000, 64_000, 512 * 1024, 512 * 1024, carved)


def whole_node(name: str, *, free: bool) -> NodeState:
    gpu = GpuState(0, H100, 1000 if free else 0, MEM if free else 0, MEM, PartitionMode.WHOLE)
    return NodeState(name, 64_000, 64_000, 512 * 1024, 512 * 1024, (gpu,))


def idle_of(*nodes: NodeState) -> dict[tuple[str, int], IdleMigGpu]:
    return {
        (n.name, g.index): IdleMigGpu(n.name, g.index, (THREE_G,))
        for n in nodes
        for g in n.gpus
        if g.mode is PartitionMode.MIG
    }


def solve(
    nodes: list[NodeState],
    pending: list[TaskRequest],
    *,
    policy: str = "whalegen",
    running: tuple[RunningTask, ...] = (),
) -> RecarveResult:
    base = ClusterSnapshot(tuple(nodes), running=running)
    config = EngineConfig(policy=policy)
    ordered = [t if t.order_key is not None else _key(t, i) for i, t in enumerate(pending)]
    return solve_recarving_last(
        Engine(base, config), ordered, 0.0, idle=idle_of(*nodes), base=base, config=config
    )


def _key(t: TaskRequest, i: int) -> TaskRequest:
    return replace(t, order_key=i)


def where(result: RecarveResult) -> dict[str, tuple[str, tuple[int, ...], str]]:
    return {
        p.task_id: (p.node, p.gpu_indexes, p.unit.mig_profile or p.unit.kind.value)
        for p in result.result.placements
    }


@pytest.mark.parametrize("policy", POLICIES)
def test_a_free_whole_gpu_takes_a_task_before_an_idle_mig_gpu_is_recarved(policy: str) -> None:
    # 500 milli with 40 GB is a 4g.40gb on MIG: the free 3g.40gb cannot hold it, the whole GPU can.
    half = task("half", gpus=1, milli=500, gpu_mem_mib=40_000)
    result = solve([mig_node("m"), whole_node("w", free=True)], [half], policy=policy)
    assert where(result) == {"half": ("w", (0,), "whole")}
    assert result.recarve_pass == frozenset() and result.result.unplaced == ()


@pytest.mark.parametrize("policy", POLICIES)
def test_an_idle_mig_gpu_is_opened_for_the_task_no_present_unit_holds(policy: str) -> None:
    first = task("first", gpus=1)
    second = task("second", gpus=1)
    result = solve([mig_node("m"), whole_node("w", free=True)], [first, second], policy=policy)
    assert where(result) == {"first": ("w", (0,), "whole"), "second": ("m", (0,), "7g.80gb")}
    assert result.recarve_pass == {"second"}
    # After the cycle the picture shows the re-carved GPU taken and nothing else open.
    assert [g.free_milli for n in result.nodes_after for g in n.gpus] == [0, 0]


def test_a_free_instance_that_fits_is_used_and_its_gpu_is_not_recarved_for_another_task() -> None:
    small = task("small", gpus=1, milli=300, gpu_mem_mib=20_000)
    big = task("big", gpus=1, priority=9)
    result = solve([mig_node("m"), whole_node("w", free=False)], [big, small])
    assert where(result) == {"small": ("m", (0,), "3g.40gb")}
    assert result.recarve_pass == frozenset()
    assert [u.task_id for u in result.result.unplaced] == ["big"]


def test_a_recarve_comes_before_stopping_running_work() -> None:
    victim = RunningTask("old", "w", (0,), 1000, 1000, 1024, priority=0, preemptible=True, started_at_s=-60)
    urgent = task("urgent", gpus=1, priority=50)
    result = solve([mig_node("m"), whole_node("w", free=False)], [urgent], running=(victim,))
    assert where(result) == {"urgent": ("m", (0,), "7g.80gb")}
    assert result.result.preemptions == ()
    # Without an idle MIG GPU the same task preempts.
    base = ClusterSnapshot((whole_node("w", free=False),), running=(victim,))
    config = EngineConfig(policy="whalegen")
    alone = solve_recarving_last(
        Engine(base, config), [_key(urgent, 0)], 0.0, idle={}, base=base, config=config
    )
    assert [p.victim_task_id for p in alone.result.preemptions] == ["old"]


def test_single_tasks_are_recarved_for_before_a_gang_that_never_is() -> None:
    gang = [task(f"g{i}", gpus=1, gang_id="job", gang_size=2, priority=9) for i in range(2)]
    single = task("single", gpus=1)
    result = solve([mig_node("m", gpus=2)], [*gang, single])
    placed = where(result)
    assert placed["single"][2] == "7g.80gb"
    assert "g0" not in placed and "g1" not in placed


def test_disguised_recarves_are_placements_no_free_instance_carries() -> None:
    idle = {("m", 0): IdleMigGpu("m", 0, (THREE_G,))}
    requests = {
        "a": task("a", gpus=1, milli=100),
        "b": task("b", gpus=1, milli=100),
        "c": task("c", gpus=1, milli=500, gpu_mem_mib=40_000),
    }
    one_g = [
        Placement(t, "m", (0,), ComputeUnit(UnitKind.MIG, 142, "1g.10gb", s)) for t, s in [("a", 0), ("b", 1)]
    ]
    four_g = Placement("c", "m", (0,), ComputeUnit(UnitKind.MIG, 571, "4g.40gb", 0))
    # The 3g.40gb carries the first 1g; the second 1g and the 4g.40gb need a new layout.
    assert [p.task_id for p in disguised_recarves([*one_g, four_g], idle, requests)] == ["b", "c"]
