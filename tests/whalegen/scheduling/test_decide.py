"""`decide` on hand-built unit-exact pools: present units first, whole GPUs before idle MIG GPUs, re-carve
only for what no present unit holds, and every placement bound to free units."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.whalegen.placement.builders import task
from tests.whalegen.scheduling.builders import Pool, mig, mps, whole
from whalegen.placement.repartition import ClaimAction, MigSlot
from whalegen.placement.types import Isolation, Quota, RunningTask, TaskRequest
from whalegen.scheduling import Bound, Claim, Config, Decider, Decisions, Snapshot, decide

POLICIES = ["whalegen", "bestfit", "fgd"]
THREE_G = ("3g.40gb", 0, False)


def where(decisions: Decisions) -> dict[str, tuple[str, tuple[int, ...], str]]:
    return {
        b.task_id: (
            b.placement.node,
            b.placement.gpu_indexes,
            b.placement.unit.mig_profile or b.placement.unit.kind.value,
        )
        for b in decisions.placements
    }


def layouts(decisions: Decisions) -> dict[str, tuple[str, int, str]]:
    return {
        t: (plan.gpu[0], plan.gpu[1], slot.mig_profile)
        for plan in decisions.layouts
        for t, slot in plan.plan.for_tasks
    }


@pytest.mark.parametrize("policy", POLICIES)
def test_a_two_gpu_whole_task_takes_free_whole_gpus_not_the_idle_mig_gpu_beside_them(policy: str) -> None:
    # The demo's h200-train: GPU 0 of the first node in MIG (two free 3g), the rest whole and free. The
    # engine alone puts the task on GPUs 0 and 1 of the first node, which no unit there can carry.
    pool = (
        Pool()
        .node("n1", mig(("3g.40gb", 0, False), ("3g.40gb", 4, False)), *[whole() for _ in range(7)])
        .node("n2", *[whole() for _ in range(8)])
    )
    big = task("asr", gpus=2, milli=1000, gpu_mem_mib=60_000)
    decisions = decide(pool.snapshot([big]), Config(policy=policy), 0.0)
    placed = where(decisions)
    node, indexes, unit = placed["asr"]
    assert unit == "whole" and ("n1", 0) not in {(node, i) for i in indexes}
    assert decisions.unplaced == {} and decisions.layouts == ()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_mig_member_is_placed_on_the_one_instance_that_carries_it(policy: str) -> None:
    # The gang (a 7g MIG task and a 2-GPU whole task) needs n2's 7g and n0's two whole GPUs. When the engine
    # saw MIG GPUs as free slices it put the MIG member on n1, whose free units (two 3g) cannot carry it;
    # by its retry the whole task behind had taken n2's 7g, the gang was taken back and the whole task sat
    # on a MIG instance beside two idle whole GPUs (found by test_properties.py). The engine now takes
    # carved instances only: the gang binds whole, and the whole task waits, as nothing left carries it.
    pool = (
        Pool()
        .node("n0", whole(), whole())
        .node("n1", mig(("3g.40gb", 0, False), ("3g.40gb", 4, False)))
        .node("n2", mig(("7g.80gb", 0, False)))
    )
    tasks = [
        task("g-mig", gpus=1, isolation=Isolation.MIG, gang_id="c:g", gang_size=2, tenant="c"),
        task("g-whole", gpus=2, gang_id="c:g", gang_size=2, tenant="c", submitted_at_s=1.0),
        task("solo", gpus=1, tenant="a", submitted_at_s=2.0),
    ]
    decisions = decide(pool.snapshot(tasks), Config(policy=policy, preemption=False), 0.0)
    placed = where(decisions)
    assert placed["g-mig"] == ("n2", (0,), "7g.80gb")
    assert placed["g-whole"] == ("n0", (0, 1), "whole")
    assert set(decisions.unplaced) == {"solo"}  # n1's two 3g instances are not a whole GPU


@pytest.mark.parametrize("policy", POLICIES)
def test_a_task_does_not_starve_beside_a_unit_a_failing_gang_kept_taking(policy: str) -> None:
    # The gang's small member takes the one free MPS share; its MIG member asks two 7g, which the engine
    # carves on the idle MIG GPUs but their units (two 3g each) cannot carry, so the gang is taken back.
    # Each round the MPS task behind it missed that share, and after three misses it was given up while
    # the share stood free. Found by test_properties.py's work-conservation check (hypothesis).
    three_g = [("3g.40gb", 0, False), ("3g.40gb", 4, False)]
    pool = Pool().node("n", mps(shares=4, held=3), mig(*three_g), mig(*three_g), cpu_milli=8_000)
    tasks = [
        task("g-small", gpus=1, milli=100, gang_id="a:g", gang_size=2, tenant="a"),
        task(
            "g-mig",
            gpus=2,
            isolation=Isolation.MIG,
            gang_id="a:g",
            gang_size=2,
            tenant="a",
            submitted_at_s=1.0,
        ),
        task("solo", gpus=1, milli=100, isolation=Isolation.MPS, tenant="a", submitted_at_s=2.0),
    ]
    decisions = decide(pool.snapshot(tasks), Config(policy=policy, preemption=False), 0.0)
    assert where(decisions) == {"solo": ("n", (0,), "share")}
    assert set(decisions.unplaced) == {"g-small", "g-mig"}


def test_a_gpu_closed_to_one_task_is_open_again_to_the_next() -> None:
    # The engine carves a 4g for t0 over n1's 2g+1g+1g and a 2g for t4 over n0's two free 1g: neither maps.
    # Each is retried alone with its own GPU closed. t0's retry closed n1, and t4's retry inherited that
    # closure, so t4 waited ("no GPU node with 250 milli free") beside n1's free 2g. Found by driving the
    # work-conservation property of test_properties.py over 30,000 examples.
    layout = [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]
    pool = (
        Pool()
        .node("n0", mig(*[(p, s, False) for p, s in layout]), cpu_milli=4_000)
        .node("n1", mig(*[(p, s, p == "3g.40gb") for p, s in layout]), cpu_milli=4_000)
    )
    tasks = [
        task("t0", gpus=1, milli=430),
        task("t2", gpus=1, milli=100, gpu_mem_mib=30_000, submitted_at_s=2),
        task("t4", gpus=1, milli=250, submitted_at_s=4),
        task("t6", gpus=1, milli=250, priority=1, submitted_at_s=6),
    ]
    decisions = decide(pool.snapshot(tasks), Config(policy="whalegen", preemption=False), 0.0)
    assert where(decisions)["t4"] == ("n1", (0,), "2g.20gb")
    assert set(decisions.unplaced) == {"t0"}  # no free instance of 430 milli or more is left anywhere


@pytest.mark.parametrize("policy", POLICIES)
def test_a_free_whole_gpu_takes_a_task_before_an_idle_mig_gpu_is_recarved(policy: str) -> None:
    # 500 milli with 40 GB is a 4g.40gb on MIG: the free 3g.40gb cannot hold it, the whole GPU can.
    pool = Pool().node("m", mig(THREE_G)).node("w", whole())
    half = task("half", gpus=1, milli=500, gpu_mem_mib=40_000)
    decisions = decide(pool.snapshot([half]), Config(policy=policy), 0.0)
    assert where(decisions) == {"half": ("w", (0,), "whole")}
    assert decisions.layouts == () and decisions.unplaced == {}


@pytest.mark.parametrize("policy", POLICIES)
def test_an_idle_mig_gpu_is_recarved_for_the_task_no_present_unit_holds(policy: str) -> None:
    pool = Pool().node("m", mig(THREE_G)).node("w", whole())
    first, second = task("first", gpus=1), task("second", gpus=1)
    decisions = decide(pool.snapshot([first, second]), Config(policy=policy), 0.0)
    assert where(decisions) == {"first": ("w", (0,), "whole")}
    assert layouts(decisions) == {"second": ("m", 0, "7g.80gb")}
    assert decisions.unplaced["second"].code == "waiting_for_layout"


def test_a_free_instance_that_fits_is_used_and_its_gpu_is_not_recarved_for_another_task() -> None:
    pool = Pool().node("m", mig(THREE_G)).node("w", whole(held=True))
    small = task("small", gpus=1, milli=300, gpu_mem_mib=20_000)
    big = task("big", gpus=1, priority=9)
    decisions = decide(pool.snapshot([big, small]), Config(policy="whalegen"), 0.0)
    assert where(decisions) == {"small": ("m", (0,), "3g.40gb")}
    assert decisions.layouts == () and set(decisions.unplaced) == {"big"}


def test_a_recarve_comes_before_stopping_running_work() -> None:
    victim = RunningTask("old", "w", (0,), 1000, 1000, 1024, priority=0, preemptible=True, started_at_s=-60)
    urgent = task("urgent", gpus=1, priority=50)
    pool = Pool().node("m", mig(THREE_G)).node("w", whole(held=True))
    decisions = decide(pool.snapshot([urgent], running=[victim]), Config(), 0.0)
    assert layouts(decisions) == {"urgent": ("m", 0, "7g.80gb")} and decisions.preemptions == ()
    alone = Pool().node("w", whole(held=True))
    decisions = decide(alone.snapshot([urgent], running=[victim]), Config(), 0.0)
    assert [p.victim_task_id for p in decisions.preemptions] == ["old"]


def test_a_gang_is_recarved_for_whole_and_in_its_order() -> None:
    # Two idle MIG GPUs, each one free 3g: every task wants a whole GPU's worth (a 7g). The gang comes
    # first (priority 9) and gets a new layout on each GPU; the single behind it waits. A gang was never
    # re-carved for before: it waited `needs_layout_change` beside the idle GPUs for good.
    pool = Pool().node("m", mig(THREE_G), mig(THREE_G))
    gang = [task(f"g{i}", gpus=1, gang_id="job", gang_size=2, priority=9) for i in range(2)]
    single = task("single", gpus=1)
    decisions = decide(pool.snapshot([*gang, single]), Config(), 0.0)
    assert layouts(decisions) == {"g0": ("m", 0, "7g.80gb"), "g1": ("m", 1, "7g.80gb")} or layouts(
        decisions
    ) == {"g0": ("m", 1, "7g.80gb"), "g1": ("m", 0, "7g.80gb")}
    assert {decisions.unplaced[t].code for t in ("g0", "g1")} == {"waiting_for_layout"}
    assert "single" in decisions.unplaced and not decisions.placements


def test_a_gang_with_a_member_on_two_gpus_is_recarved_for_on_every_gpu() -> None:
    # Three idle MIG GPUs, each one free 3g; the gang's second member needs two GPUs. Before, a task on
    # several GPUs was never re-carved for, so neither member was: both waited `needs_layout_change`
    # beside the idle GPUs.
    pool = Pool().node("m", mig(THREE_G), mig(THREE_G), mig(THREE_G))
    one = task("one", gpus=1, gang_id="job", gang_size=2, priority=9)
    two = task("two", gpus=2, gang_id="job", gang_size=2, priority=9)
    decisions = decide(pool.snapshot([one, two]), Config(), 0.0)
    planned = sorted((plan.gpu[1], t) for plan in decisions.layouts for t, _ in plan.plan.for_tasks)
    assert [t for _, t in planned].count("two") == 2 and [t for _, t in planned].count("one") == 1
    assert {i for i, _ in planned} == {0, 1, 2} and decisions.placements == ()
    assert {decisions.unplaced[t].code for t in ("one", "two")} == {"waiting_for_layout"}
    assert "it binds once every layout is reported applied" in decisions.unplaced["two"].message


def test_a_task_on_two_gpus_is_recarved_for_on_both_before_the_task_behind_it() -> None:
    pool = Pool().node("m", mig(THREE_G), mig(THREE_G))
    pair = task("pair", gpus=2, priority=9)
    single = task("single", gpus=1)
    decisions = decide(pool.snapshot([pair, single]), Config(), 0.0)
    assert sorted(plan.gpu for plan in decisions.layouts) == [("m", 0), ("m", 1)]
    assert {t for plan in decisions.layouts for t, _ in plan.plan.for_tasks} == {"pair"}
    assert decisions.unplaced["pair"].code == "waiting_for_layout"
    assert decisions.unplaced["single"].code != "waiting_for_layout"


def test_a_task_on_two_gpus_gets_new_layouts_on_both_or_on_neither() -> None:
    # GPU 1 cannot be carved so (a stopped task's process is still on it: the engine's picture has it
    # open, the plan refuses it). The task must not keep GPU 0's layout: it would hold a GPU it can never
    # use; GPU 0 goes to the one-GPU task behind it, in the same step.
    pool = Pool().node("m", mig(THREE_G), mig(THREE_G))
    pair = task("pair", gpus=2, priority=9)
    single = task("single", gpus=1)
    base = pool.snapshot([pair, single])
    views = dict(base.gpu_views)
    views[("m", 1)] = replace(views[("m", 1)], stopping=True)
    decisions = decide(replace(base, gpu_views=views), Config(), 0.0)
    assert "pair" not in {t for plan in decisions.layouts for t, _ in plan.plan.for_tasks}
    assert decisions.unplaced["pair"].code == "needs_layout_change"
    assert "still has a stopped task's process on it" in decisions.unplaced["pair"].message
    assert [(plan.gpu, [t for t, _ in plan.plan.for_tasks]) for plan in decisions.layouts] == [
        (("m", 0), ["single"])
    ]
    assert decisions.unplaced["single"].code == "waiting_for_layout"


def _claimed(
    pool: Pool, tasks: list[TaskRequest], actions: dict[str, ClaimAction], **extra: object
) -> Snapshot:
    """The pool's snapshot with each task holding a claim on the free 7g of GPU i of node m."""
    base = pool.snapshot(**extra)  # type: ignore[arg-type]
    claims = {}
    for i, t in enumerate(tasks):
        (unit,) = base.free_units[("m", i)]
        claims[t.task_id] = (
            Claim(
                t.task_id, "m", i, unit.unit_id, MigSlot("7g.80gb", 0), 1000, actions[t.task_id], "the layout"
            ),
        )
    return replace(base, claims=claims, claimed_requests={t.task_id: t for t in tasks})


def test_a_gang_binds_once_every_members_new_instance_is_in_place() -> None:
    pool = Pool().node("m", mig(("7g.80gb", 0, False)), mig(("7g.80gb", 0, False)))
    gang = [task(f"g{i}", gpus=1, gang_id="t:job", gang_size=2, tenant="t") for i in range(2)]
    ready = {"g0": ClaimAction.BIND, "g1": ClaimAction.BIND}
    decisions = decide(_claimed(pool, gang, ready), Config(), 0.0)
    assert where(decisions) == {"g0": ("m", (0,), "7g.80gb"), "g1": ("m", (1,), "7g.80gb")}

    half = {"g0": ClaimAction.BIND, "g1": ClaimAction.WAIT}
    decisions = decide(_claimed(pool, gang, half), Config(), 0.0)
    assert decisions.placements == ()
    assert {decisions.unplaced[t].code for t in ("g0", "g1")} == {"waiting_for_layout"}
    assert "gang job binds once every member's new layout is applied" in decisions.unplaced["g0"].message


def test_a_gang_whose_instances_are_ready_binds_within_its_tenants_quota_whole_or_not_at_all() -> None:
    pool = Pool().node("m", mig(("7g.80gb", 0, False)), mig(("7g.80gb", 0, False)))
    gang = [task(f"g{i}", gpus=1, gang_id="t:job", gang_size=2, tenant="t") for i in range(2)]
    ready = {"g0": ClaimAction.BIND, "g1": ClaimAction.BIND}
    one_gpu = [Quota("t", guaranteed_milli=1000)]
    decisions = decide(_claimed(pool, gang, ready, quotas=one_gpu), Config(), 0.0)
    assert decisions.placements == ()
    assert {decisions.unplaced[t].code for t in ("g0", "g1")} == {"quota_exceeded"}


def _two_gpu_claims(
    pool: Pool, t: TaskRequest, actions: tuple[ClaimAction, ClaimAction], **extra: object
) -> Snapshot:
    """The pool's snapshot with task `t` holding a claim on the free 7g of GPUs 0 and 1 of node m."""
    base = pool.snapshot(**extra)  # type: ignore[arg-type]
    claims = []
    for i, action in enumerate(actions):
        (unit,) = base.free_units[("m", i)]
        why = "applied" if action is ClaimAction.BIND else f"GPU {i} on m: the agent has not reported it"
        claims.append(Claim(t.task_id, "m", i, unit.unit_id, MigSlot("7g.80gb", 0), 1000, action, why))
    return replace(base, claims={t.task_id: tuple(claims)}, claimed_requests={t.task_id: t})


def test_a_task_on_two_gpus_binds_once_both_new_instances_are_in_place() -> None:
    pool = Pool().node("m", mig(("7g.80gb", 0, False)), mig(("7g.80gb", 0, False)))
    pair = task("pair", gpus=2, tenant="t")
    both = (ClaimAction.BIND, ClaimAction.BIND)
    decisions = decide(_two_gpu_claims(pool, pair, both), Config(), 0.0)
    (bound,) = decisions.placements
    assert where(decisions) == {"pair": ("m", (0, 1), "7g.80gb")}
    assert len(set(bound.unit_ids)) == 2

    half = (ClaimAction.BIND, ClaimAction.WAIT)
    decisions = decide(_two_gpu_claims(pool, pair, half), Config(), 0.0)
    assert decisions.placements == ()
    assert decisions.unplaced["pair"].code == "waiting_for_layout"
    assert decisions.unplaced["pair"].message == "GPU 1 on m: the agent has not reported it"


def test_a_task_on_two_gpus_binds_within_its_quota_counted_once_per_gpu() -> None:
    pool = Pool().node("m", mig(("7g.80gb", 0, False)), mig(("7g.80gb", 0, False)))
    pair = task("pair", gpus=2, tenant="t")
    both = (ClaimAction.BIND, ClaimAction.BIND)
    short = decide(
        _two_gpu_claims(pool, pair, both, quotas=[Quota("t", guaranteed_milli=1000)]), Config(), 0.0
    )
    assert short.placements == () and short.unplaced["pair"].code == "quota_exceeded"
    enough = decide(
        _two_gpu_claims(pool, pair, both, quotas=[Quota("t", guaranteed_milli=2000)]), Config(), 0.0
    )
    assert where(enough) == {"pair": ("m", (0, 1), "7g.80gb")}


def test_two_small_tasks_never_share_one_carved_instance() -> None:
    # The engine's slice model could put two 1g requests in the slices of one free 3g; units say one each.
    pool = Pool().node("m", mig(("3g.40gb", 0, False), ("3g.40gb", 4, True)))
    a, b = task("a", gpus=1, milli=100), task("b", gpus=1, milli=100)
    decisions = decide(pool.snapshot([a, b]), Config(), 0.0)
    assert len(decisions.placements) == 1
    (lone,) = decisions.placements
    assert len(lone.unit_ids) == 1
    assert set(decisions.unplaced) == {"a", "b"} - {lone.task_id}


def test_mps_shares_add_up_to_what_a_task_asks() -> None:
    pool = Pool().node("s", mps(shares=4, held=1))
    t = task("t", gpus=1, milli=500)
    decisions = decide(pool.snapshot([t]), Config(), 0.0)
    (bound,) = decisions.placements
    assert len(bound.unit_ids) == 2


def test_a_start_estimate_comes_from_a_running_task_end_and_unknown_says_why() -> None:
    running = RunningTask("r", "w", (0,), 1000, 1000, 1024, started_at_s=0.0)
    pool = Pool().node("w", whole(held=True))
    waiting = task("w1", gpus=1)
    known = decide(pool.snapshot([waiting], running=[running], expected_end_s={"r": 600.0}), Config(), 100.0)
    assert known.estimates["w1"] == 600.0
    unknown = decide(pool.snapshot([waiting], running=[running]), Config(), 100.0)
    assert unknown.estimates["w1"] is None
    assert "held by tasks with no known end" in unknown.unplaced["w1"].message


def test_fragmentation_before_and_after_a_decision_that_places_nothing_is_the_same() -> None:
    # An idle MIG GPU is pictured open after a decision (a re-carve may give it any layout); before it
    # must be pictured the same way, or a what-if that placed nothing showed fragmentation falling.
    from whalegen.placement.fragmentation import cluster_fragmentation
    from whalegen.placement.types import Shape, ShapeMix
    from whalegen.scheduling import nodes_before

    pool = Pool().node("m", mig(THREE_G)).node("w", whole(), whole(held=True))
    too_big = task("too-big", gpus=4)  # no node has four GPUs: nothing is placed
    snapshot = pool.snapshot([too_big])
    decisions = decide(snapshot, Config(policy="whalegen"), 0.0)
    assert decisions.placements == () and decisions.layouts == ()
    mix = ShapeMix((Shape(1000, 1, 1000), Shape(1000, 1, 300)), (0.5, 0.5))
    before = cluster_fragmentation(nodes_before(snapshot), mix)
    after = cluster_fragmentation(decisions.nodes_after, mix)
    assert before.amount_pct == pytest.approx(after.amount_pct)
    assert before.idle_milli == after.idle_milli == 2000  # the idle MIG GPU and the free whole GPU


def test_a_placement_no_units_carry_is_not_heard_while_the_engine_places() -> None:
    # n0's GPU is free in the engine's picture but lists no free unit (as a picture that fell behind
    # its units would): whichever task the engine puts there misses. The production cycle writes what it
    # hears at once, so that one must not be heard (`finish` takes it back and tries again).
    pool = Pool().node("n0", whole()).node("n1", whole())
    tasks = [task("a", gpus=1), task("b", gpus=1, submitted_at_s=1.0)]
    full = pool.snapshot(tasks)
    snapshot = replace(full, free_units={k: v for k, v in full.free_units.items() if k[0] != "n0"})
    config = Config(preemption=False)
    decider = Decider(snapshot, config)
    heard: list[Bound] = []
    made = decider.begin(snapshot.cluster.pending, 0.0, on_placed=heard.extend)
    decisions = decider.finish(0.0)
    assert sorted(p.node for p in made) == ["n0", "n1"]
    assert [b.placement.node for b in heard] == ["n1"]
    assert decisions == decide(snapshot, config, 0.0)
    assert heard == list(decisions.placements)
