"""Profile-aware placement (`whalegen-aware`) and the two goodput baselines, on hand-built pools."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from whalegen.placement.aware import AwarePolicy, predicted_factor, predicted_low_factor
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    NodeState,
    PartitionMode,
    TaskProfile,
    TaskRequest,
)

GIB = 1024


def _node(name: str, model: str, gpus: int = 1, mode: PartitionMode = PartitionMode.WHOLE) -> NodeState:
    mem = 80 * GIB
    return NodeState(
        name,
        64_000,
        64_000,
        512 * GIB,
        512 * GIB,
        tuple(GpuState(i, model, WHOLE_GPU_MILLI, mem, mem, mode) for i in range(gpus)),
    )


def _task(
    task_id: str, profile: TaskProfile | None, milli: int = WHOLE_GPU_MILLI, submitted_s: float = 0.0
) -> TaskRequest:
    return TaskRequest(task_id, 1000, GIB, 1, milli, profile=profile, submitted_at_s=submitted_s)


def _place(
    nodes: tuple[NodeState, ...], tasks: list[TaskRequest], now_s: float = 0.0, policy: str = "whalegen-aware"
) -> Engine:
    engine = Engine(ClusterSnapshot(nodes), EngineConfig(policy=policy, preemption=False))
    for task in tasks:
        engine.solve((task,), now_s)
    return engine


def test_a_bandwidth_bound_task_goes_to_the_hbm_rich_model_and_a_compute_bound_one_to_the_flops_rich() -> (
    None
):
    nodes = (_node("l4", "L4"), _node("a100", "A100-80GB"))
    engine = _place(nodes, [_task("bw", TaskProfile(compute_exponent=0.0))])
    assert engine.state.names[engine.state.bindings["bw"].node] == "a100"
    policy = engine.policy
    assert isinstance(policy, AwarePolicy)
    assert policy.reasons["bw"].startswith("A100-80GB chosen: 6.8× this task's L4 speed (bandwidth-bound")
    engine = _place(nodes, [_task("fl", TaskProfile(compute_exponent=1.0))])
    assert engine.state.names[engine.state.bindings["fl"].node] == "l4"
    # Fragmentation-only whalegen sees two idle one-GPU nodes as equal and takes the first.
    plain = _place(nodes, [_task("bw", TaskProfile(compute_exponent=0.0))], policy="whalegen")
    assert plain.state.names[plain.state.bindings["bw"].node] == "l4"


def test_a_task_defers_a_slow_model_until_it_has_waited_then_takes_it() -> None:
    nodes = (_node("l4", "L4"), _node("h100", "H100-80GB"))
    busy = _task("first", TaskProfile(compute_exponent=0.0))
    engine = _place(nodes, [busy])  # takes the H100
    late = _task("bw", TaskProfile(compute_exponent=0.0), submitted_s=0.0)
    assert engine.solve((late,), 10.0).placements == ()  # L4 runs it at a fraction of its fleet average
    policy = engine.policy
    assert isinstance(policy, AwarePolicy) and "deferred" in policy.refusals["bw"]
    placed = engine.solve((late,), 10.0 + policy.defer_s)
    assert [p.node for p in placed.placements] == ["l4"]


def test_an_online_task_takes_an_isolated_mig_instance_before_a_shared_gpu() -> None:
    nodes = (
        _node("mps", "A100-80GB", mode=PartitionMode.SHARED),
        _node("mig", "A100-80GB", mode=PartitionMode.MIG),
    )
    service = TaskRequest("svc", 1000, GIB, 1, 400, profile=TaskProfile(0.5, 20.0, 0.9), sla_online=True)
    engine = _place(nodes, [service])
    assert engine.state.names[engine.state.bindings["svc"].node] == "mig"
    policy = engine.policy
    assert isinstance(policy, AwarePolicy) and "MIG instance" in policy.reasons["svc"]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_no_co_location_predicted_to_break_an_sla_or_the_floor_is_ever_chosen(seed: int) -> None:
    rng = random.Random(seed)
    nodes = tuple(
        _node(f"n{i}", rng.choice(["A100-80GB", "L4", "H100-80GB"]), 2, PartitionMode.SHARED)
        for i in range(3)
    )
    tasks = []
    for i in range(rng.randint(2, 10)):
        sla = rng.choice([None, 0.9, 0.95])
        util = rng.choice([None, rng.uniform(0, 100)])
        profile = TaskProfile(rng.random(), util, sla)
        tasks.append(_task(f"t{i}", profile, milli=rng.choice([200, 300, 500])))
    engine = _place(nodes, tasks)
    policy = engine.policy
    assert isinstance(policy, AwarePolicy)
    on: dict[tuple[int, int], list[str]] = {}
    for task_id, binding in engine.state.bindings.items():
        on.setdefault((binding.node, binding.gpu_indexes[0]), []).append(task_id)
    profiles = {t.task_id: t.profile for t in tasks}
    for members in on.values():
        if len(members) < 2:
            continue
        utils = {
            m: (p.sm_util_pct if (p := profiles[m]) and p.sm_util_pct is not None else 100.0) for m in members
        }
        total = sum(utils.values())
        for m in members:
            profile = profiles[m]
            assert profile is not None
            if profile.sla_min_factor is not None:  # an SLA is checked against the measured pairs' spread
                assert predicted_low_factor(utils[m], total - utils[m]) >= profile.sla_min_factor - 1e-12
            else:
                assert predicted_factor(utils[m], total - utils[m]) >= policy.floor - 1e-12


def test_the_whole_gpu_baselines_never_share_and_binpack_fills_one_node_first() -> None:
    nodes = (_node("a", "V100M16", 2, PartitionMode.SHARED), _node("b", "V100M16", 2, PartitionMode.SHARED))
    tasks = [_task(f"s{i}", None, milli=300) for i in range(2)]
    volcano = _place(nodes, tasks, policy="volcano-binpack")
    held = [volcano.state.bindings[t.task_id] for t in tasks]
    assert {b.node for b in held} == {0} and {b.gpu_indexes for b in held} == {(0,), (1,)}
    assert all(b.held_milli == (WHOLE_GPU_MILLI,) for b in held)
    share = _place(nodes, tasks, policy="share-binpack")
    assert {share.state.bindings[t.task_id].gpu_indexes for t in tasks} == {(0,)}  # both on one GPU
