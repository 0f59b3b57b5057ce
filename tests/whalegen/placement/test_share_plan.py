"""The `whalegen` share plan: the LP over per-GPU share sets, and the online rules that follow it.

Every expected plan below is worked out by hand: the fewest GPUs per share for the given mix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from tests.whalegen.placement.builders import mix, node, snapshot, task
from whalegen.placement.engine import Engine, EngineConfig, solve_cycle
from whalegen.placement.types import NodeState, RunningTask, Shape, ShapeMix, TaskRequest
from whalegen.placement.whalegen_policy import (
    MAX_PATTERNS,
    fewest_bins,
    pattern_count,
    share_patterns,
    share_plan,
)


def share(milli: int, weight: float, cpu: float = 1, mem_gib: float = 1) -> tuple[Shape, float]:
    return Shape(cpu_milli=int(cpu * 1000), num_gpu=1, gpu_milli=milli, mem_mib=int(mem_gib * 1024)), weight


def test_share_patterns_are_every_multiset_that_fits_one_gpu() -> None:
    assert sorted(share_patterns([600, 400])) == [(400,), (400, 400), (600,), (600, 400)]
    assert sorted(share_patterns([500])) == [(500,), (500, 500)]
    assert share_patterns([810, 160]).count((810, 160)) == 1
    assert (160,) * 6 in share_patterns([160]) and (160,) * 7 not in share_patterns([160])


@dataclass(frozen=True)
class PlanCase:
    shares: tuple[tuple[int, float], ...]  # (milli, weight)
    want: dict[tuple[int, ...], float]  # pattern -> GPUs per arriving share


PLANS = {
    # 600 and 400 complete each other: one GPU per pair, half a GPU per share.
    "complements pair up": PlanCase(((600, 1), (400, 1)), {(600, 400): 0.5}),
    # Only 470s: two per GPU.
    "one size pairs with itself": PlanCase(((470, 1),), {(470, 470): 0.5}),
    # Three 810s per 160: one 810 in three gets its 160, the other two stay alone (190 milli the optimum
    # wastes anyway).
    "a rare filler goes with the large share": PlanCase(
        ((810, 3), (160, 1)), {(810, 160): 0.25, (810,): 0.5}
    ),
    # 700 + 300 leaves nothing; a 300 over can share with two more 300s.
    "the surplus packs by itself": PlanCase(((700, 1), (300, 4)), {(700, 300): 0.2, (300, 300, 300): 0.2}),
}


@pytest.mark.parametrize("case", PLANS.values(), ids=PLANS.keys())
def test_share_plan_is_an_optimal_packing_of_the_mix(case: PlanCase) -> None:
    plan = share_plan(mix(*(share(milli, weight) for milli, weight in case.shares)))
    rates: dict[tuple[int, ...], float] = {}
    for entries in plan.by_size.values():
        for j, rate in entries:
            pattern = plan.patterns[j]
            # by_size holds bins × copies of the size; per size it is the same number of bins.
            rates[pattern] = rate / pattern.count(next(s for s in pattern if (j, rate) in plan.by_size[s]))
    assert set(rates) == set(case.want)
    for pattern, want in case.want.items():
        assert rates[pattern] == pytest.approx(want)


def test_fewest_bins_reaches_the_hand_computed_optimum() -> None:
    sizes = [650, 550, 470, 320, 230, 220]
    rates = np.array([0.2, 0.1, 0.3, 0.2, 0.1, 0.1])
    patterns = share_patterns(sizes)
    counts = np.array([[p.count(s) for p in patterns] for s in sizes], dtype=float)
    x = fewest_bins(counts, rates)
    assert (x >= 0).all()
    assert counts @ x == pytest.approx(rates)
    # Lower bound: no 650 or 550 shares a GPU with a 650, 550 or 470, and at most two 470s share one:
    # 0.2 + 0.1 + 0.3 / 2 = 0.45 GPUs. Reached by 650+320, 550+230+220 and 470+470.
    assert x.sum() == pytest.approx(0.45)
    used = {patterns[j] for j in np.flatnonzero(x > 1e-9)}
    assert used == {(650, 320), (550, 230, 220), (470, 470)}


def test_the_plans_objective_is_the_hand_computed_optimum_of_a_small_mix() -> None:
    # Shares of 500 (half the arrivals), 300 and 200 (a quarter each) bring 0.5·500 + 0.25·300 +
    # 0.25·200 = 375 milli per share on average, so no packing uses fewer than 0.375 GPUs per share;
    # 500+500 and 500+300+200 fill GPUs exactly, at 0.125 and 0.25 GPUs per share: the bound is met.
    plan = share_plan(mix(share(500, 2), share(300, 1), share(200, 1)))
    gpus_per_share = {plan.patterns[j]: rate / plan.patterns[j].count(500) for j, rate in plan.by_size[500]}
    assert sum(gpus_per_share.values()) == pytest.approx(0.375)
    assert all(sum(pattern) == 1000 for pattern in plan.patterns)


def highs_optimum(counts: np.ndarray, rates: np.ndarray) -> float:
    """An independent solver's optimum of the same LP (SciPy's HiGHS, a dev dependency)."""
    result = linprog(np.ones(counts.shape[1]), A_eq=counts, b_eq=rates, bounds=(0, None), method="highs")
    assert result.status == 0, result.message
    return float(result.fun)


@settings(max_examples=60, deadline=None)
@given(
    demand=st.dictionaries(
        st.integers(1, 99).map(lambda tenth: tenth * 10), st.integers(1, 20), min_size=1, max_size=7
    )
)
def test_fewest_bins_gives_a_feasible_plan_as_good_as_highs(demand: dict[int, int]) -> None:
    sizes = sorted(demand)
    while pattern_count(sizes) > MAX_PATTERNS:
        sizes = sizes[1:]  # `share_plan` drops the smallest sizes the same way
    patterns = share_patterns(sizes)
    counts = np.array([[p.count(size) for p in patterns] for size in sizes], dtype=float)
    rates = np.array([demand[size] for size in sizes], dtype=float)
    rates /= rates.sum()
    x = fewest_bins(counts, rates)
    # Feasible: no negative GPU counts, and every size's arrivals get exactly their rate of slots.
    assert (x >= 0).all()
    assert counts @ x == pytest.approx(rates, abs=1e-9)
    # Optimal: as few GPUs per share as an independent solver finds.
    assert x.sum() == pytest.approx(highs_optimum(counts, rates), abs=1e-9)


@dataclass(frozen=True)
class OnlineCase:
    policy: str
    nodes: tuple[NodeState, ...]
    tasks: tuple[TaskRequest, ...]
    shape_mix: ShapeMix
    want: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPUs) per task, in order
    running: tuple[RunningTask, ...] = ()


SIXTY_FORTY = mix(share(600, 1), share(400, 1))
# Shares bring 4 cores, whole-GPU work (most of the volume) half a core: about 1.2 cores per GPU.
LIGHT_WHOLE = mix(
    share(600, 1, cpu=1),
    share(600, 1, cpu=7),
    share(400, 2, cpu=4),
    (Shape(cpu_milli=500, num_gpu=1, gpu_milli=1000), 20),
)
ONLINE = {
    # The plan pairs 400 with 600: the second 400 opens its own GPU and waits, so both 600s complete a
    # GPU (2 GPUs used).
    "a share waits for the complement the plan pairs it with": OnlineCase(
        "whalegen",
        (node("a", gpus=4),),
        (task("t1", gpus=1, milli=400), task("t2", gpus=1, milli=400), task("t3", gpus=1, milli=600)),
        SIXTY_FORTY,
        (("a", (0,)), ("a", (1,)), ("a", (0,))),
    ),
    # Plain sum-of-squares puts the second 400 into the first one's 600 gap (its 200 left is below every
    # share, so closed): the 600s then need fresh GPUs (3 GPUs used).
    "without the plan the second 400 takes the first one's gap": OnlineCase(
        "whalegen:plan=0",
        (node("a", gpus=4),),
        (task("t1", gpus=1, milli=400), task("t2", gpus=1, milli=400), task("t3", gpus=1, milli=600)),
        SIXTY_FORTY,
        (("a", (0,)), ("a", (0,)), ("a", (1,))),
    ),
    # Three 810s per 160: the plan puts one 810 in three with a 160 and leaves two alone. The first 810
    # opens a GPU alone (both patterns are equally behind; the first listed wins), so its 190 milli wait
    # for nothing; the 160 takes that room rather than open a fresh GPU to wait for an 810.
    "a share takes room nobody waits for before opening a fresh GPU": OnlineCase(
        "whalegen",
        (node("a", gpus=4),),
        (task("t1", gpus=1, milli=810), task("t2", gpus=1, milli=160)),
        mix(share(810, 3), share(160, 1)),
        (("a", (0,)), ("a", (0,))),
    ),
    # A GPU that comes with the snapshot half used waits for the plan's shares that fit its gap.
    "a partly used GPU of the snapshot waits for the share that completes it": OnlineCase(
        "whalegen",
        (node("a", gpus=2), node("b", gpus=2, free=[1000, 600])),
        (task("t", gpus=1, milli=600),),
        SIXTY_FORTY,
        (("b", (1,)),),
        running=(RunningTask("r", "b", (1,), 400, 1000, 1024),),
    ),
    # The 400 on `a` waits for a 600 that brings 4 cores on average. A whole-GPU task with 6 cores would
    # leave `a` 2: it goes to `b`, and the 600 still completes `a`'s GPU.
    "work keeps off the CPU a waiting share needs": OnlineCase(
        "whalegen",
        (node("a", gpus=2, cpu=12), node("b", gpus=2, cpu=12)),
        (
            task("t1", cpu=4, gpus=1, milli=400),
            task("t2", cpu=6, gpus=1),
            task("t3", cpu=4, gpus=1, milli=600),
        ),
        LIGHT_WHOLE,
        (("a", (0,)), ("b", (0,)), ("a", (0,))),
    ),
}


@pytest.mark.parametrize("case", ONLINE.values(), ids=ONLINE.keys())
def test_online_share_plan_rules(case: OnlineCase) -> None:
    snap = snapshot(case.nodes, case.tasks, running=case.running, shape_mix=case.shape_mix)
    result = solve_cycle(snap, EngineConfig(policy=case.policy), now=0.0)
    assert result.unplaced == ()
    # One cycle places pending tasks in submission order, then by id: t1, t2, t3.
    got = {p.task_id: (p.node, p.gpu_indexes) for p in result.placements}
    assert tuple(got[t.task_id] for t in case.tasks) == case.want


def test_a_waiting_share_keeps_its_expected_cpu_and_memory_on_the_node() -> None:
    snap = snapshot([node("a", gpus=2, cpu=12), node("b", gpus=2, cpu=12)], shape_mix=LIGHT_WHOLE)
    engine = Engine(snap, EngineConfig(policy="whalegen"))
    policy = engine.policy
    engine.solve((task("t1", cpu=4, gpus=1, milli=400),), 0.0)
    # The 400 opened GPU 0 of `a`, which now waits for a 600: 4 cores (mean of 1 and 7) and 1 GiB kept.
    assert policy.planned == {0: (600,)}  # type: ignore[attr-defined]
    assert policy.reserved_cpu.tolist() == [4000, 0]  # type: ignore[attr-defined]
    assert policy.reserved_mem.tolist() == [1024, 0]  # type: ignore[attr-defined]
    engine.solve((task("t2", cpu=4, gpus=1, milli=600),), 1.0)
    assert policy.planned == {}  # type: ignore[attr-defined]
    assert policy.reserved_cpu.tolist() == [0, 0]  # type: ignore[attr-defined]
    assert engine.state.gpu_free[0] == [0, 1000]


def test_a_gap_that_grows_when_a_share_leaves_waits_for_the_plan_shares_that_fit_it() -> None:
    engine = Engine(snapshot([node("a", gpus=2)], shape_mix=SIXTY_FORTY), EngineConfig(policy="whalegen"))
    policy = engine.policy
    engine.solve((task("t1", gpus=1, milli=400),), 0.0)
    engine.solve((task("t2", gpus=1, milli=600),), 1.0)
    assert engine.state.gpu_free[0] == [0, 1000]
    assert policy.planned == {}  # type: ignore[attr-defined]
    engine.release("t1")
    # 400 milli free again: the largest set of planned shares that fits it is one 400.
    assert policy.planned == {0: (400,)}  # type: ignore[attr-defined]
    result = engine.solve((task("t3", gpus=1, milli=400),), 2.0)
    assert [(p.node, p.gpu_indexes) for p in result.placements] == [("a", (0,))]
    assert policy.planned == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize("sizes", [[600, 400], [810, 160], [470], [650, 550, 470, 320, 230, 220], [160, 110]])
def test_pattern_count_counts_what_share_patterns_lists(sizes: list[int]) -> None:
    assert pattern_count(sizes) == len(share_patterns(sizes))


def test_shares_too_small_for_a_small_lp_are_left_to_sum_of_squares() -> None:
    # A 10-milli share fits 100 times in a GPU: with it the patterns number in the tens of thousands.
    sizes = [10, 50, 100, 200, 250, 300, 500, 700]
    assert pattern_count(sizes) > MAX_PATTERNS >= pattern_count(sizes[1:])
    plan = share_plan(mix(*(share(milli, 1) for milli in sizes)))
    assert sorted(plan.by_size) == sizes[1:]
