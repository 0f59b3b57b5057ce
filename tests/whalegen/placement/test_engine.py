"""`solve_cycle`: reasons, gangs, quotas, preemption, MIG units; one code path for replay and production."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace
from pathlib import Path

import pytest

from tests.whalegen.placement.builders import GIB, node, snapshot, task
from whalegen.placement import engine as engine_module
from whalegen.placement.engine import Engine, EngineConfig, solve_cycle
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.types import (
    ClusterSnapshot,
    GpuState,
    NodeState,
    Outcome,
    PartitionMode,
    Quota,
    RunningTask,
    UnitKind,
)
from whalegen.sim.naive import NaiveFgd
from whalegen.sim.replay import arrivals, shuffled_nodes
from whalegen.sim.trace import NODE_FILE, load_nodes, load_tasks, pod_file

TRACES = Path("/work/shared/traces/openb")


def test_a_task_no_node_can_take_gets_a_reason_and_a_sentence() -> None:
    snap = snapshot(
        [
            node("a", cpu=8, cpu_free=1, free=[200, 1000]),
            node("b", cpu=8, free=[300, 300]),
            node("c", model="P100"),
        ],
        [task("t", cpu=2, gpus=1, milli=460, models=["T4"])],
    )
    (unplaced,) = solve_cycle(snap, EngineConfig(policy="fgd"), now=0.0).unplaced
    assert unplaced.outcome is Outcome.NO_CAPACITY
    assert unplaced.message == (
        "1 of 2 T4 nodes have 460 milli free; 1 node lacks CPU (2 cores); 0 nodes lack host memory (1024 MiB)"
    )


def test_no_gpu_anywhere_reads_as_such() -> None:
    snap = snapshot([node("a", free=[200, 200])], [task("t", gpus=1, milli=460)])
    (unplaced,) = solve_cycle(snap, EngineConfig(policy="bestfit"), now=0.0).unplaced
    assert unplaced.message.startswith("no GPU node with 460 milli free")


def test_a_model_nobody_has_is_its_own_reason() -> None:
    snap = snapshot([node("a")], [task("t", gpus=1, models=["H100-80GB"])])
    (unplaced,) = solve_cycle(snap, EngineConfig(policy="whalegen"), now=0.0).unplaced
    assert unplaced.outcome is Outcome.NO_ALLOWED_MODEL
    assert "H100-80GB" in unplaced.message


def test_a_gang_places_every_member_or_none() -> None:
    gang = [task(f"g{i}", gpus=1, gang_id="job", gang_size=3) for i in range(3)]
    result = solve_cycle(snapshot([node("a")], gang), EngineConfig(policy="fgd"), now=0.0)
    assert result.placements == ()
    outcomes = sorted(u.outcome for u in result.unplaced)
    assert outcomes == [Outcome.GANG_UNPLACEABLE, Outcome.GANG_UNPLACEABLE, Outcome.NO_CAPACITY]
    fits = solve_cycle(snapshot([node("a"), node("b")], gang), EngineConfig(policy="fgd"), now=0.0)
    assert len(fits.placements) == 3


def test_a_gang_with_members_missing_waits() -> None:
    gang = [task(f"g{i}", gpus=1, gang_id="job", gang_size=4) for i in range(2)]
    result = solve_cycle(snapshot([node("a"), node("b")], gang), EngineConfig(policy="fgd"), now=0.0)
    assert {u.outcome for u in result.unplaced} == {Outcome.GANG_INCOMPLETE}
    assert "2 of 4" in result.unplaced[0].message


def test_an_undone_gang_leaves_room_for_the_next_task() -> None:
    gang = [task(f"g{i}", gpus=1, gang_id="job", gang_size=3, priority=5) for i in range(3)]
    single = task("single", gpus=2)
    result = solve_cycle(snapshot([node("a")], [*gang, single]), EngineConfig(policy="fgd"), now=0.0)
    assert [p.task_id for p in result.placements] == ["single"]


def test_quota_guarantee_then_borrow_limit() -> None:
    quotas = [Quota("team", guaranteed_milli=1000, borrow_limit_milli=1000)]
    tasks = [task(f"t{i}", gpus=1, tenant="team", submitted_at_s=i) for i in range(3)]
    result = solve_cycle(
        snapshot([node("a"), node("b")], tasks, quotas=quotas), EngineConfig(policy="fgd"), 0.0
    )
    assert [(p.task_id, p.borrowed) for p in result.placements] == [("t0", False), ("t1", True)]
    (refused,) = result.unplaced
    assert refused.task_id == "t2" and refused.outcome is Outcome.QUOTA_EXCEEDED
    assert "(1 GPU guaranteed + 1 GPU borrowable)" in refused.message


def test_higher_priority_goes_first() -> None:
    tasks = [task("low", gpus=2, priority=1), task("high", gpus=2, priority=9, submitted_at_s=5)]
    result = solve_cycle(snapshot([node("a")], tasks), EngineConfig(policy="fgd"), now=0.0)
    assert [p.task_id for p in result.placements] == ["high"]


def test_preemption_proposes_the_fewest_victims_with_the_least_progress_lost() -> None:
    # Node a: two preemptible 1-GPU tasks; node b: one preemptible 2-GPU task started recently.
    nodes = [node("a", free=[0, 0]), node("b", free=[0, 0])]
    running = [
        RunningTask("a0", "a", (0,), 1000, 1000, 1024, priority=0, preemptible=True, started_at_s=0),
        RunningTask("a1", "a", (1,), 1000, 1000, 1024, priority=0, preemptible=True, started_at_s=0),
        RunningTask("b01", "b", (0, 1), 1000, 1000, 1024, priority=0, preemptible=True, started_at_s=90),
    ]
    urgent = task("urgent", gpus=2, priority=10)
    result = solve_cycle(snapshot(nodes, [urgent], running=running), EngineConfig(policy="fgd"), now=100.0)
    (unplaced,) = result.unplaced
    assert unplaced.outcome is Outcome.WAITING_FOR_PREEMPTION
    assert [(p.victim_task_id, p.node) for p in result.preemptions] == [("b01", "b")]
    assert "priority 0 below 10" in result.preemptions[0].reason


def test_tasks_that_are_not_preemptible_are_never_victims() -> None:
    running = [RunningTask("r", "a", (0, 1), 1000, 1000, 1024, priority=0)]
    snap = snapshot([node("a", free=[0, 0])], [task("urgent", gpus=1, priority=10)], running=running)
    result = solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0)
    assert result.preemptions == ()
    assert result.unplaced[0].outcome is Outcome.NO_CAPACITY


def test_a_tenant_within_its_guarantee_reclaims_borrowed_capacity() -> None:
    quotas = [Quota("owner", 2000), Quota("borrower", 0, borrow_limit_milli=2000)]
    running = [RunningTask("loan", "a", (0, 1), 1000, 1000, 1024, tenant="borrower", borrowed=True)]
    snap = snapshot(
        [node("a", free=[0, 0])], [task("mine", gpus=2, tenant="owner")], running=running, quotas=quotas
    )
    result = solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0)
    (proposal,) = result.preemptions
    assert proposal.victim_task_id == "loan" and "borrowed capacity reclaimed" in proposal.reason


def test_a_borrowed_task_whose_tenant_is_back_within_its_guarantee_is_not_reclaimed() -> None:
    # "loan" was admitted above the borrower's guarantee, but the borrower's other work has ended: the
    # 2 GPUs it holds are now within its own guarantee of 2 GPUs, so the owner must wait.
    quotas = [Quota("owner", 2000), Quota("borrower", 2000, borrow_limit_milli=2000)]
    running = [RunningTask("loan", "a", (0, 1), 1000, 1000, 1024, tenant="borrower", borrowed=True)]
    snap = snapshot(
        [node("a", free=[0, 0])], [task("mine", gpus=2, tenant="owner")], running=running, quotas=quotas
    )
    result = solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0)
    assert result.preemptions == ()
    assert result.unplaced[0].outcome is Outcome.NO_CAPACITY


def test_a_borrowing_preemptor_never_takes_another_tenant_below_its_guarantee() -> None:
    # "theirs" holds 2 GPUs, exactly its guarantee; "mine" would borrow for its urgent task. Taking
    # "theirs"' low-priority task would put it below, and its own waiting work would take the GPUs back
    # next cycle. "mine"'s own low-priority task is fair game.
    quotas = [Quota("mine", 1000, borrow_limit_milli=8000), Quota("theirs", 2000)]
    running = [
        RunningTask("t0", "a", (0, 1), 1000, 1000, 1024, tenant="theirs", preemptible=True),
        RunningTask("m0", "b", (0, 1), 1000, 1000, 1024, tenant="mine", preemptible=True, started_at_s=5),
    ]
    urgent = task("urgent", gpus=2, priority=10, tenant="mine")
    nodes = [node("a", free=[0, 0]), node("b", free=[0, 0])]
    snap = snapshot(nodes, [urgent], running=running, quotas=quotas)
    result = solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0)
    assert [p.victim_task_id for p in result.preemptions] == ["m0"]
    alone = snapshot(nodes[:1], [urgent], running=running[:1], quotas=quotas)
    assert solve_cycle(alone, EngineConfig(policy="fgd"), now=10.0).preemptions == ()


def test_within_its_guarantee_a_preemptor_takes_by_priority_whatever_the_other_tenant_holds() -> None:
    # Guarantees add up to more than the pool (2 GPUs guaranteed on 1): priority decides between them.
    quotas = [Quota("mine", 1000), Quota("theirs", 1000)]
    running = [RunningTask("t0", "a", (0,), 1000, 1000, 1024, tenant="theirs", preemptible=True)]
    snap = snapshot([node("a", gpus=1, free=[0])], [task("urgent", gpus=1, priority=10, tenant="mine")],
                    running=running, quotas=quotas)  # fmt: skip
    assert [
        p.victim_task_id for p in solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0).preemptions
    ] == ["t0"]


def test_a_borrowing_preemptor_takes_from_another_tenant_only_what_it_holds_above_its_guarantee() -> None:
    # "theirs" holds 3 GPUs on a guarantee of 2: one of its 1-GPU tasks may go, not two.
    quotas = [Quota("mine", 0, borrow_limit_milli=4000), Quota("theirs", 2000, borrow_limit_milli=2000)]
    running = [
        RunningTask(f"t{i}", "a", (i,), 1000, 1000, 1024, tenant="theirs", preemptible=True) for i in range(3)
    ]
    nodes = [node("a", gpus=3, free=[0, 0, 0])]
    one = solve_cycle(snapshot(nodes, [task("u1", gpus=1, priority=10, tenant="mine")], running=running,
                               quotas=quotas), EngineConfig(policy="fgd"), now=10.0)  # fmt: skip
    assert len(one.preemptions) == 1
    two = solve_cycle(snapshot(nodes, [task("u2", gpus=2, priority=10, tenant="mine")], running=running,
                               quotas=quotas), EngineConfig(policy="fgd"), now=10.0)  # fmt: skip
    assert two.preemptions == ()
    # Nor across tasks of one cycle: the second urgent task finds the first one's victim already gone.
    both = solve_cycle(
        snapshot(nodes, [task("u1", gpus=1, priority=10, tenant="mine"),
                         task("u3", gpus=1, priority=10, tenant="mine")], running=running, quotas=quotas),
        EngineConfig(policy="fgd"), now=10.0,
    )  # fmt: skip
    assert len(both.preemptions) == 1


def test_quota_use_of_a_running_task_is_what_it_asked_not_the_bigger_unit_it_holds() -> None:
    # A 430-milli task sits on a whole GPU (held 1000). Its tenant's limit is 1000: with the ask counted
    # (as the quota rows and a new placement count it), 500 more fit; counted as held they would not.
    quotas = [Quota("vision", 1000)]
    running = [RunningTask("small", "a", (0,), 1000, 1000, 1024, tenant="vision", charge_milli=430)]
    snap = snapshot([node("a", free=[0, 1000])], [task("more", gpus=1, milli=500, tenant="vision")],
                    running=running, quotas=quotas)  # fmt: skip
    result = solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0)
    assert [p.task_id for p in result.placements] == ["more"]
    held = [RunningTask("small", "a", (0,), 1000, 1000, 1024, tenant="vision")]  # no charge: as held
    snap = snapshot([node("a", free=[0, 1000])], [task("more", gpus=1, milli=500, tenant="vision")],
                    running=held, quotas=quotas)  # fmt: skip
    assert (
        solve_cycle(snap, EngineConfig(policy="fgd"), now=10.0).unplaced[0].outcome is Outcome.QUOTA_EXCEEDED
    )


def test_mig_gpus_hand_out_the_smallest_profile_that_fits() -> None:
    a100 = node("a", model="A100-40GB", gpus=1, free=[1000], gpu_mem_mib=40_960, mode=PartitionMode.MIG)
    tasks = [
        task("small", gpus=1, milli=140, gpu_mem_mib=4000),
        task("mid", gpus=1, milli=280, gpu_mem_mib=9000),
    ]
    result = solve_cycle(snapshot([a100], tasks), EngineConfig(policy="fgd"), now=0.0)
    units = {p.task_id: p.unit for p in result.placements}
    assert units["small"].kind is UnitKind.MIG and units["small"].mig_profile == "1g.5gb"
    assert units["mid"].mig_profile == "2g.10gb"
    assert units["small"].mig_start_slice != units["mid"].mig_start_slice


def _carved(name: str, instances: tuple[tuple[str, int], ...], used_slices: int) -> NodeState:
    """One H100 in MIG mode whose free carved instances are `instances` (a unit-exact snapshot's GPU)."""
    gpu = GpuState(0, "H100-80GB", 1000, 81_559, 81_559, PartitionMode.MIG, used_slices, instances)
    return NodeState(name, 32_000, 32_000, 128 * 1024, 128 * 1024, (gpu,))


@pytest.mark.parametrize("policy", ["fgd", "whalegen", "bestfit"])
def test_a_carved_gpu_hands_out_its_free_instances_and_nothing_else(policy: str) -> None:
    # Free: a 3g at slice 0 and a 1g at slice 6 (slices 4-5 held). Three 1g-sized tasks: the 1g first
    # (the smallest instance that covers the ask), then the 3g; the third finds nothing, although the 3g
    # has slices to spare: a carved instance is one unit, as the commit binds it.
    gpu_node = _carved("a", (("1g.10gb", 6), ("3g.40gb", 0)), 0b0110000)
    tasks = [task(f"t{i}", gpus=1, milli=140, submitted_at_s=float(i)) for i in range(3)]
    result = solve_cycle(snapshot([gpu_node], tasks), EngineConfig(policy=policy), now=0.0)
    units = sorted((p.unit.mig_profile, p.unit.mig_start_slice) for p in result.placements)
    assert units == [("1g.10gb", 6), ("3g.40gb", 0)]
    assert [u.task_id for u in result.unplaced] == ["t2"]


def test_a_released_instance_goes_back_on_its_gpu_free_list() -> None:
    engine = Engine(snapshot([_carved("a", (("3g.40gb", 0),), 0b1110000)]), EngineConfig(policy="fgd"))
    first = engine.solve((task("x", gpus=1, milli=300),), 0.0)
    assert engine.state.mig_free[0][0] == ()
    engine.release(first.placements[0].task_id)
    assert engine.state.mig_free[0][0] == (("3g.40gb", 0),)
    again = engine.solve((task("y", gpus=1, milli=300),), 0.0)
    assert again.placements[0].unit.mig_profile == "3g.40gb"


def test_a_gpu_of_alike_shares_holds_whole_shares_per_task() -> None:
    # Four 250-milli shares: a 286-milli task holds two of them (as the commit binds it), so after two
    # such tasks the GPU is full and a third waits, where counting asks alone (572 milli) left room.
    gpu = GpuState(0, "T4", 1000, 16_000, 16_000, PartitionMode.SHARED, share_milli=250, share_mem_mib=4000)
    shared = NodeState("a", 32_000, 32_000, 128 * 1024, 128 * 1024, (gpu,))
    tasks = [task(f"t{i}", gpus=1, milli=286, submitted_at_s=float(i)) for i in range(3)]
    result = solve_cycle(snapshot([shared], tasks), EngineConfig(policy="bestfit"), now=0.0)
    assert len(result.placements) == 2 and [u.task_id for u in result.unplaced] == ["t2"]


def test_a_running_task_on_alike_shares_gives_back_whole_shares() -> None:
    # A running 286-milli task holds two 250-milli shares (the snapshot shows 500 free): releasing it, as a
    # trial preemption or a binding taken back does, frees both, not 286.
    gpu = GpuState(0, "T4", 500, 8_000, 16_000, PartitionMode.SHARED, share_milli=250, share_mem_mib=4000)
    shared = NodeState("a", 32_000, 31_000, 128 * 1024, 127 * 1024, (gpu,))
    running = [RunningTask("r", "a", (0,), 286, 1000, 1024)]
    engine = Engine(snapshot([shared], running=running), EngineConfig(policy="bestfit"))
    engine.release("r")
    assert engine.state.gpu_free[0][0] == 1000 and engine.state.gpu_mem_free[0][0] == 16_000


def test_whole_mode_gpus_take_one_task_each() -> None:
    whole = node("a", gpus=1, mode=PartitionMode.WHOLE)
    result = solve_cycle(
        snapshot([whole], [task("x", gpus=1, milli=200), task("y", gpus=1, milli=200)]),
        EngineConfig(policy="bestfit"),
        now=0.0,
    )
    assert len(result.placements) == 1 and result.placements[0].unit.kind is UnitKind.WHOLE


@pytest.mark.parametrize("policy", ["fgd", "whalegen", "bestfit"])
def test_a_kept_engine_decides_like_a_fresh_one_built_from_the_same_state(policy: str) -> None:
    """The replay keeps one engine; production builds one per cycle. Both must decide alike."""
    nodes = [node(f"n{i}", gpus=4, cpu=48) for i in range(6)]
    stream = [task(f"t{i}", cpu=1 + i % 5, gpus=1, milli=(230, 470, 1000, 810)[i % 4]) for i in range(30)]
    mix = shape_mix_from_tasks(stream)
    kept = Engine(ClusterSnapshot(tuple(nodes), shape_mix=mix), EngineConfig(policy=policy))
    running: list[RunningTask] = []
    by_id = {t.task_id: t for t in stream}
    for i, t in enumerate(stream):
        fresh_snapshot = ClusterSnapshot(kept.state.nodes(), (t,), tuple(running), (), mix)
        fresh = solve_cycle(fresh_snapshot, EngineConfig(policy=policy), now=float(i))
        mine = kept.solve((t,), float(i))
        assert mine.placements == fresh.placements
        for p in mine.placements:
            src = by_id[p.task_id]
            running.append(
                RunningTask(p.task_id, p.node, p.gpu_indexes, p.unit.gpu_milli, src.cpu_milli, src.mem_mib)
            )


@pytest.mark.skipif(not (TRACES / NODE_FILE).is_file(), reason="openb trace not present")
def test_the_engines_fgd_decides_exactly_like_a_plain_per_node_loop() -> None:
    nodes = shuffled_nodes(load_nodes(TRACES / NODE_FILE)[::6], seed=7)
    tasks = load_tasks(TRACES / pod_file("default"))
    stream = arrivals(tasks, 1000 * sum(len(n.gpus) for n in nodes), seed=7)[:400]
    mix = shape_mix_from_tasks(tasks)
    engine = Engine(ClusterSnapshot(nodes, shape_mix=mix), EngineConfig(policy="fgd"))
    naive = NaiveFgd(nodes, mix)
    for i, t in enumerate(stream):
        result = engine.solve((t,), float(i))
        expected = naive.place(t)
        got = (
            (engine.state.index[result.placements[0].node], result.placements[0].gpu_indexes)
            if result.placements
            else None
        )
        assert got == expected, f"task {i} {t}"


@pytest.mark.parametrize("policy", ["fgd", "whalegen", "random"])
def test_a_request_that_found_no_place_is_placed_once_a_task_leaves(policy: str) -> None:
    """A kept engine answers a request that failed without asking the policy again, until a release."""
    engine = Engine(ClusterSnapshot((node("a", gpus=1),)), EngineConfig(policy=policy))
    assert engine.solve((task("first", gpus=1),), 0.0).placements
    for i in range(3):
        (unplaced,) = engine.solve((task(f"again{i}", gpus=1),), 1.0).unplaced
        assert unplaced.outcome is Outcome.NO_CAPACITY
    engine.release("first")
    (placement,) = engine.solve((task("after", gpus=1),), 2.0).placements
    assert placement.node == "a"


def test_a_failure_is_explained_with_the_counts_of_the_moment() -> None:
    """The sentence of a failing request is kept only while nothing changes in between."""
    engine = Engine(ClusterSnapshot((node("a", gpus=1), node("b", gpus=1))), EngineConfig(policy="fgd"))
    big = task("big", cpu=40, gpus=1)
    (before,) = engine.solve((big,), 0.0).unplaced
    assert before.message.startswith("2 of 2 GPU nodes have 1000 milli free")
    assert engine.solve((task("small", gpus=1),), 1.0).placements
    (after,) = engine.solve((big,), 2.0).unplaced
    assert after.message.startswith("1 of 2 GPU nodes have 1000 milli free")


@pytest.mark.parametrize("policy", ["fgd", "whalegen"])
def test_forgetting_the_score_memos_changes_no_decision(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived engine drops its per-request class scores past MEMO_LIMIT; they are only a memo."""
    nodes = tuple(node(f"n{i}", gpus=4, cpu=48) for i in range(6))
    stream = [
        task(f"t{i}", cpu=1 + i % 5, gpus=int(i % 7 > 0), milli=(230, 470, 1000)[i % 3]) for i in range(60)
    ]
    mix = shape_mix_from_tasks(stream)

    def decisions() -> list[object]:
        engine = Engine(ClusterSnapshot(nodes, shape_mix=mix), EngineConfig(policy=policy))
        return [engine.solve((t,), float(i)) for i, t in enumerate(stream)]

    remembered = decisions()
    monkeypatch.setattr(engine_module, "MEMO_LIMIT", 1)
    assert decisions() == remembered


def test_an_engine_and_its_working_copy_go_when_the_engine_does() -> None:
    # The scheduling cycle holds the garbage collector off: whatever sits in a reference cycle waits for
    # it, and the whalegen policy's index used to tie the working copy (every binding) into one.
    snap = snapshot(
        [node("a", free=[1000, 1000]), node("b", free=[500])],
        [task("t1", gpus=1, milli=500), task("t2", gpus=1, milli=1000)],
    )
    was = gc.isenabled()
    gc.disable()
    try:
        engine = Engine(snap, EngineConfig(policy="whalegen"))
        result = engine.solve(snap.pending, now=0.0)
        assert len(result.placements) == 2
        state, policy = weakref.ref(engine.state), weakref.ref(engine.policy)
        del engine
        assert state() is None and policy() is None  # freed at once, by reference counting
    finally:
        if was:
            gc.enable()


def test_a_pool_without_a_schedulable_node_says_so_in_words() -> None:
    """Before: "no schedulable node has a schedulable node"."""
    cordoned = replace(node("a"), schedulable=False)
    result = solve_cycle(snapshot([cordoned], [task("t", gpus=1)]), EngineConfig(policy="fgd"), 0.0)
    (unplaced,) = result.unplaced
    assert (
        unplaced.message
        == "no schedulable node with GPUs in the pool (none, or all cordoned, draining or lost)"
    )


def test_a_gpu_memory_bound_holds_a_task_back_in_the_engine_and_leaves_its_gpu_to_the_next() -> None:
    # One GPU free; the tenant's admitted work states 60 GiB of its 100 GiB bound. "big" (60 GiB) waits for
    # the bound, so "small" (30 GiB), behind it in order, takes the GPU in the same cycle: the engine
    # counts the bound, so the GPU is not spent on a task the commit would hold back.
    quotas = [Quota("vision", 8000, gpu_mem_limit_mib=100 * GIB)]
    running = [RunningTask("old", "a", (0,), 1000, 1000, GIB, gpu_mem_mib=60 * GIB, tenant="vision")]
    pending = [
        task("big", gpus=1, tenant="vision", gpu_mem_mib=60 * GIB, submitted_at_s=1),
        task("small", gpus=1, tenant="vision", gpu_mem_mib=30 * GIB, submitted_at_s=2),
    ]
    nodes = [node("a", free=[0, 1000], gpu_mem_mib=80 * GIB)]
    result = solve_cycle(
        snapshot(nodes, pending, running=running, quotas=quotas), EngineConfig(policy="fgd"), 1.0
    )
    assert [p.task_id for p in result.placements] == ["small"]
    (waits,) = result.unplaced
    assert waits.task_id == "big" and waits.outcome is Outcome.QUOTA_EXCEEDED
    assert "state 61440 MiB of GPU memory" in waits.message and "limit is 102400 MiB" in waits.message
    assert "fits once 20480 MiB" in waits.message


def test_a_gang_counts_every_members_gpu_memory_against_the_bound_and_a_release_gives_it_back() -> None:
    quotas = [Quota("vision", 8000, gpu_mem_limit_mib=100 * GIB)]
    gang = [
        task(f"g{i}", gpus=2, tenant="vision", gpu_mem_mib=20 * GIB, gang_id="j", gang_size=3)
        for i in range(3)
    ]
    nodes = [node("a", gpus=8, gpu_mem_mib=80 * GIB)]
    result = solve_cycle(snapshot(nodes, gang, quotas=quotas), EngineConfig(policy="fgd"), 1.0)
    assert result.placements == () and {u.outcome for u in result.unplaced} == {Outcome.QUOTA_EXCEEDED}
    assert "asks 122880 MiB" in result.unplaced[0].message  # 3 members × 2 GPUs × 20 GiB
    running = [RunningTask("old", "a", (0, 1), 1000, 1000, GIB, gpu_mem_mib=45 * GIB, tenant="vision")]
    engine = Engine(snapshot(nodes, [], running=running, quotas=quotas), EngineConfig(policy="fgd"))
    assert engine.quota_check("vision", 1000, 20 * GIB)[0] is not None  # 90 GiB stated + 20 > 100
    engine.release("old")
    assert engine.quota_check("vision", 1000, 20 * GIB) == (None, False)
