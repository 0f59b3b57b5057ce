"""Invariants of `solve_cycle` on random clusters and task lists, for every policy."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from whalegen.placement.engine import Engine, EngineConfig, solve_cycle
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.policies import Policy
from whalegen.placement.registry import POLICY_NAMES, make_policy
from whalegen.placement.state import Request
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    Isolation,
    NodeState,
    PartitionMode,
    TaskRequest,
    UnitKind,
)

MODELS = ("T4", "V100M32", "A100-40GB")


@st.composite
def nodes(draw: st.DrawFn) -> tuple[NodeState, ...]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from(MODELS))
        mode = (
            draw(st.sampled_from([PartitionMode.SHARED, PartitionMode.WHOLE, PartitionMode.MIG]))
            if model == "A100-40GB"
            else draw(st.sampled_from([PartitionMode.SHARED, PartitionMode.WHOLE]))
        )
        gpus = []
        for d in range(draw(st.integers(1, 4))):
            total_mem = 40_960 if model == "A100-40GB" else 16_384
            free = draw(st.sampled_from([0, 150, 400, 1000])) if mode is PartitionMode.SHARED else 1000
            gpus.append(
                GpuState(d, model, free, total_mem if free == 1000 else total_mem // 2, total_mem, mode)
            )
        cpu = draw(st.integers(1, 32)) * 1000
        mem = draw(st.integers(1, 64)) * 1024
        out.append(
            NodeState(f"n{i}", cpu, draw(st.integers(0, cpu)), mem, draw(st.integers(0, mem)), tuple(gpus))
        )
    return tuple(out)


@st.composite
def tasks(draw: st.DrawFn) -> tuple[TaskRequest, ...]:
    out = []
    for i in range(draw(st.integers(1, 10))):
        num_gpu = draw(st.sampled_from([0, 1, 1, 2]))
        milli = draw(st.sampled_from([100, 250, 500, 1000])) if num_gpu == 1 else WHOLE_GPU_MILLI
        gang = draw(st.sampled_from([None, None, "g1", "g2"]))
        out.append(
            TaskRequest(
                task_id=f"t{i}",
                cpu_milli=draw(st.integers(0, 8)) * 1000,
                mem_mib=draw(st.integers(0, 16)) * 1024,
                num_gpu=num_gpu,
                gpu_milli=milli if num_gpu else 0,
                gpu_mem_mib=draw(st.sampled_from([0, 0, 4096, 12_000])) if num_gpu else 0,
                allowed_models=frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))),
                gang_id=gang,
                gang_size=2 if gang else 1,
                priority=draw(st.integers(0, 3)),
                isolation=draw(st.sampled_from([Isolation.ANY, Isolation.ANY, *Isolation])),
            )
        )
    return tuple(out)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=nodes(), pending=tasks(), policy=st.sampled_from(POLICY_NAMES), seed=st.integers(0, 5))
def test_placements_never_overcommit_and_respect_models_and_gangs(
    cluster: tuple[NodeState, ...], pending: tuple[TaskRequest, ...], policy: str, seed: int
) -> None:
    snapshot = ClusterSnapshot(cluster, pending)
    result = solve_cycle(snapshot, EngineConfig(policy=policy, seed=seed), now=0.0)
    by_node = {n.name: n for n in cluster}
    by_task = {t.task_id: t for t in pending}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    milli: dict[tuple[str, int], int] = defaultdict(int)
    gpu_mem: dict[tuple[str, int], int] = defaultdict(int)
    # A stock-cluster baseline (`whole_gpus_only`: the device plugin's view) sees every GPU as a whole card,
    # an idle MIG GPU included; its placements are judged by the mode it sees.
    whole_only = make_policy(policy).whole_gpus_only
    for p in result.placements:
        t = by_task[p.task_id]
        n = by_node[p.node]
        cpu[p.node] += t.cpu_milli
        mem[p.node] += t.mem_mib
        assert len(p.gpu_indexes) == t.num_gpu == len(set(p.gpu_indexes))
        if t.num_gpu and t.allowed_models:
            assert n.model in t.allowed_models
        for index in p.gpu_indexes:
            gpu = n.gpus[index]
            mode = PartitionMode.WHOLE if whole_only else gpu.mode
            assert p.unit.gpu_milli >= t.gpu_milli
            milli[(p.node, index)] += (
                p.unit.gpu_milli if p.unit.kind is not UnitKind.WHOLE else gpu.free_milli
            )
            gpu_mem[(p.node, index)] += t.gpu_mem_mib
            if mode is PartitionMode.WHOLE:
                assert gpu.free_milli == WHOLE_GPU_MILLI and p.unit.kind is UnitKind.WHOLE
            if t.isolation is Isolation.MIG:
                assert mode is PartitionMode.MIG
            elif t.isolation is Isolation.MPS:
                assert mode is PartitionMode.SHARED
            elif t.isolation is Isolation.EXCLUSIVE:
                # A card nobody used, held whole (so the over-commit check below leaves room for no one).
                assert mode is not PartitionMode.MIG and gpu.free_milli == WHOLE_GPU_MILLI
                assert p.unit.kind is UnitKind.WHOLE
    for name, used in cpu.items():
        assert used <= by_node[name].cpu_free_milli
    for name, used in mem.items():
        assert used <= by_node[name].mem_free_mib
    for (name, index), used in milli.items():
        gpu = by_node[name].gpus[index]
        assert used <= gpu.free_milli
        if gpu.mode is PartitionMode.SHARED:
            assert gpu_mem[(name, index)] <= gpu.free_mem_mib
    placed = {p.task_id for p in result.placements}
    for gang in {t.gang_id for t in pending if t.gang_id}:
        members = {t.task_id for t in pending if t.gang_id == gang}
        assert members <= placed or not (members & placed)
    # Every task is either placed or explained, once.
    explained = [u.task_id for u in result.unplaced]
    assert sorted([*placed, *explained]) == sorted(by_task)
    assert all(u.message for u in result.unplaced)


@settings(max_examples=25, deadline=None)
@given(cluster=nodes(), pending=tasks(), policy=st.sampled_from(POLICY_NAMES), seed=st.integers(0, 5))
def test_the_same_seed_gives_the_same_result(
    cluster: tuple[NodeState, ...], pending: tuple[TaskRequest, ...], policy: str, seed: int
) -> None:
    snapshot = ClusterSnapshot(cluster, pending)
    config = EngineConfig(policy=policy, seed=seed)
    assert solve_cycle(snapshot, config, now=1.0) == solve_cycle(snapshot, config, now=1.0)


@st.composite
def shared_nodes(draw: st.DrawFn) -> tuple[NodeState, ...]:
    """Nodes of shared-mode GPUs, mostly roomy, with a few MIG or whole-mode ones among them."""
    out = []
    for i in range(draw(st.integers(1, 6))):
        model = draw(st.sampled_from(MODELS))
        mode = draw(st.sampled_from([PartitionMode.SHARED] * 4 + [PartitionMode.WHOLE]))
        frees = draw(st.lists(st.sampled_from([0, 150, 400, 1000, 1000]), min_size=1, max_size=4))
        if mode is PartitionMode.WHOLE:
            frees = [0 if free < 1000 else 1000 for free in frees]
        gpus = tuple(GpuState(d, model, free, 16_384, 16_384, mode) for d, free in enumerate(frees))
        cpu, mem = 32_000, 64 * 1024
        cpu_free = draw(st.sampled_from([cpu, cpu, 4000, 0]))
        mem_free = draw(st.sampled_from([mem, mem, 8 * 1024, 0]))
        out.append(NodeState(f"n{i}", cpu, cpu_free, mem, mem_free, gpus))
    return tuple(out)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=shared_nodes(),
    pending=tasks(),
    options=st.sampled_from(["", ":sumsq=0", ":strand=0", ":memory=0"]),
)
def test_whalegens_one_step_node_score_answers_like_filter_then_score(
    cluster: tuple[NodeState, ...], pending: tuple[TaskRequest, ...], options: str
) -> None:
    """`WhalegenPolicy.score_node` skips the engine's generic filter on shared-mode nodes; it must
    give the same score and devices as `eligible_devices` followed by `score`, on every node."""
    mix = shape_mix_from_tasks(pending)
    engine = Engine(ClusterSnapshot(cluster, shape_mix=mix), EngineConfig(policy=f"whalegen{options}"))
    policy = engine.policy
    for t in pending:
        # Without a GPU-memory bound, as the one-step path needs (with one it defers to the generic).
        req = Request.of(replace(t, gpu_mem_mib=0))
        for n in range(len(engine.state)):
            assert policy.score_node(n, req) == Policy.score_node(policy, n, req)
        # The engine scores a sweep's nodes in one call, in any order: each answer is the node's own.
        everyone = list(range(len(engine.state)))[::-1]
        assert policy.score_nodes(everyone, req) == [Policy.score_node(policy, n, req) for n in everyone]
        engine.solve((t,), 0.0)  # the next request meets a changed cluster
