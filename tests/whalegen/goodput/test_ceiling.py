"""The strict fluid ceiling (whalegen/goodput/ceiling.py): by hand, against brute force, on fleet files."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whalegen.goodput.ceiling import FluidJob, fleet_ceiling, fluid_ceiling, interval_starts
from whalegen.goodput.data import (
    LUCID_COLOCATE_FILE,
    LUCID_SINGLE_FILE,
    GavelData,
)
from whalegen.goodput.fleet import load_fleet, parse_fleet
from whalegen.goodput.interference import fit_utilisation, lucid_observations
from whalegen.goodput.jobs import load_jobs
from whalegen.goodput.replay import ReplayConfig, World, dense_part, fleet_models
from whalegen.goodput.truth import MeasuredPairs

ROOT = Path(__file__).resolve().parents[3]
EXACT = 10_000  # more cuts than any test has arrivals: the LP is the best fluid schedule exactly


def _job(arrival_s: float, work: float, rates: Mapping[str, float], demand: float = 1.0) -> FluidJob:
    return FluidJob(arrival_s=arrival_s, work_ref_s=work, demand_gpus=demand, rate_ref=dict(rates))


def _brute_force(jobs: Sequence[FluidJob], gpus: Mapping[str, int], window_s: float, slot_s: float) -> float:
    """The best schedule in which each job, in each slot of `slot_s`, is idle or on one model for the whole
    slot (after its arrival), no model holding more than its GPUs: every such schedule is enumerated
    (memoised on the work each job has left)."""
    models = sorted(gpus)
    slots = round(window_s / slot_s)

    @functools.cache
    def best(slot: int, left: tuple[float, ...]) -> float:
        if slot == slots:
            return 0.0
        start = slot * slot_s
        choices = [
            [None] + ([m for m in models if j.rate_ref.get(m, 0) > 0] if j.arrival_s <= start else [])
            for j in jobs
        ]
        top = 0.0
        for pick in itertools.product(*choices):
            held = {m: sum(j.demand_gpus for j, p in zip(jobs, pick, strict=True) if p == m) for m in models}
            if any(held[m] > gpus[m] + 1e-9 for m in models):
                continue
            done = [
                min(left[k], j.rate_ref[p] * slot_s) if p is not None else 0.0
                for k, (j, p) in enumerate(zip(jobs, pick, strict=True))
            ]
            rest = tuple(round(left[k] - done[k], 9) for k in range(len(jobs)))
            top = max(top, sum(done) + best(slot + 1, rest))
        return top

    return best(0, tuple(j.work_ref_s for j in jobs))


# -- by hand --------------------------------------------------------------------------------------------


def test_a_later_faster_job_takes_the_gpu_from_an_earlier_slower_one() -> None:
    # One GPU, 4 s. Job a (0 s, 3 units of work at 1/s), job b (arrives at 2 s, 4 units at 2/s). Best: a
    # for [0, 2) (2 units), b for [2, 4) (4 units) = 6; finishing a first gives 3 + 2 = 5.
    jobs = [_job(0, 3, {"V": 1}), _job(2, 4, {"V": 2})]
    ceiling = fluid_ceiling(jobs, {"V": 1}, 4.0, EXACT)
    assert ceiling.work_ref_s == pytest.approx(6.0)
    assert ceiling.pct == pytest.approx(150.0)
    assert _brute_force(jobs, {"V": 1}, 4.0, 1.0) == pytest.approx(6.0)


def test_each_job_goes_to_the_model_where_it_gains_most() -> None:
    # x does 2/s on F, 1/s on S; y 1/s on either. 2 s: x on F, y on S = 4 + 2 = 6 (the other way, 2 + 2).
    jobs = [_job(0, 100, {"F": 2, "S": 1}), _job(0, 100, {"F": 1, "S": 1})]
    assert fluid_ceiling(jobs, {"F": 1, "S": 1}, 2.0, EXACT).work_ref_s == pytest.approx(6.0)
    assert _brute_force(jobs, {"F": 1, "S": 1}, 2.0, 1.0) == pytest.approx(6.0)


def test_fractional_jobs_share_a_gpu_by_their_demand() -> None:
    # Three half-GPU jobs on one GPU, 2 s: two run at once. The third (3/s) arrives at 1 s and displaces one
    # of the 1/s jobs: [0, 1) 1 + 1, [1, 2) 3 + 1 = 6.
    jobs = [_job(0, 100, {"V": 1}, 0.5), _job(0, 100, {"V": 1}, 0.5), _job(1, 100, {"V": 3}, 0.5)]
    assert fluid_ceiling(jobs, {"V": 1}, 2.0, EXACT).work_ref_s == pytest.approx(6.0)
    assert _brute_force(jobs, {"V": 1}, 2.0, 1.0) == pytest.approx(6.0)


def test_a_job_does_nothing_before_it_arrives_even_on_an_idle_fleet() -> None:
    # Eight idle GPUs; the one job arrives 1 s before the end: it does 1 s of its 100 at 1/s, not 8.
    jobs = [_job(9, 100, {"V": 1})]
    assert fluid_ceiling(jobs, {"V": 8}, 10.0).work_ref_s == pytest.approx(1.0)
    # Nor after the window, nor more than its work, nor on a model it cannot run on.
    late = [_job(10, 5, {"V": 1}), _job(0, 2, {"V": 1}), _job(0, 7, {"K80": 1})]
    assert fluid_ceiling(late, {"V": 8, "K80": 0}, 10.0).work_ref_s == pytest.approx(2.0)


def test_a_job_runs_in_one_place_at_a_time() -> None:
    # One job, 4 idle GPUs, 3 s: 3 s of work, not 12 (the bound that was only capacity would say 12).
    assert fluid_ceiling([_job(0, 100, {"V": 1})], {"V": 4}, 3.0).work_ref_s == pytest.approx(3.0)


def test_the_cuts_are_the_arrivals_thinned_at_quantiles() -> None:
    assert interval_starts([0, 5, 5, 7, 20], 10.0, 10) == [0.0, 5, 7]
    thinned = interval_starts([float(a) for a in range(100)], 100.0, 4)
    assert thinned == [0.0, 25.0, 50.0, 74.0]
    with pytest.raises(ValueError, match="at least 1"):
        interval_starts([1.0], 2.0, 0)


# -- against brute force ---------------------------------------------------------------------------------

MODELS = ("F", "S")
job_strategy = st.builds(
    _job,
    arrival_s=st.sampled_from([0.0, 1.0, 2.0]),
    work=st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]),
    rates=st.fixed_dictionaries({m: st.sampled_from([0.0, 1.0, 2.0, 3.0]) for m in MODELS}),
    demand=st.sampled_from([0.5, 1.0]),
)
fleet_strategy = st.sampled_from([{"F": 1, "S": 0}, {"F": 2, "S": 0}, {"F": 1, "S": 1}])


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(job_strategy, min_size=2, max_size=3), gpus=fleet_strategy)
def test_no_schedule_beats_the_lp(jobs: list[FluidJob], gpus: dict[str, int]) -> None:
    """1–2 GPUs, 2–3 jobs, 3 s in slots of 1 s: every schedule enumerated does at most the LP's work; a
    coarser cut only loosens it; it never passes the no-queue bound (each job alone on its best model)."""
    exact = fluid_ceiling(jobs, gpus, 3.0, EXACT).work_ref_s
    assert _brute_force(jobs, gpus, 3.0, 1.0) <= exact + 1e-6
    assert fluid_ceiling(jobs, gpus, 3.0, 1).work_ref_s >= exact - 1e-6
    usable = {m for m, n in gpus.items() if n > 0}
    no_queue = sum(
        min(
            j.work_ref_s,
            max((r for m, r in j.rate_ref.items() if m in usable), default=0) * (3 - j.arrival_s),
        )
        for j in jobs
    )
    assert exact <= no_queue + 1e-6


@pytest.mark.parametrize(
    ("jobs", "gpus", "slot_s"),
    [
        (
            [_job(0, 2, {"F": 3, "S": 1}), _job(1, 4, {"F": 2, "S": 2}), _job(0, 6, {"F": 1})],
            {"F": 1, "S": 1},
            1 / 3,
        ),
        ([_job(0, 3, {"F": 1}, 0.5), _job(1, 2, {"F": 2}), _job(2, 6, {"F": 3}, 0.5)], {"F": 2}, 1 / 3),
        ([_job(0, 5, {"F": 1, "S": 2}), _job(0, 5, {"F": 2, "S": 2})], {"F": 1, "S": 1}, 1 / 2),
    ],
    ids=["three jobs on two models", "whole and half jobs on two gpus", "two jobs both best on s"],
)
def test_the_lp_equals_the_best_schedule_where_slots_reach_it(
    jobs: list[FluidJob], gpus: dict[str, int], slot_s: float
) -> None:
    """Where slots this fine realise the fluid optimum (the first case: thirds of a second give 8 2/3;
    half-second slots only 8.5), the enumeration finds the LP's value."""
    assert fluid_ceiling(jobs, gpus, 3.0, EXACT).work_ref_s == pytest.approx(
        _brute_force(jobs, gpus, 3.0, slot_s), abs=1e-6
    )


# -- on fleet files ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def truth_inputs(gavel: GavelData, traces_dir: Path) -> tuple[object, MeasuredPairs]:
    from whalegen.goodput.data import load_lucid_colocate, load_lucid_single

    observations = lucid_observations(
        load_lucid_single(traces_dir / LUCID_SINGLE_FILE),
        load_lucid_colocate(traces_dir / LUCID_COLOCATE_FILE),
    )
    return fit_utilisation(observations), MeasuredPairs.from_lucid(observations)


K80_ONLY = {
    "name": "k80-only",
    "pools": [
        {"name": "k80", "gpu_model": "K80", "nodes": 2, "gpus_per_node": 8, "cpu_cores": 32, "mem_gib": 256}
    ],
}
K80_FLEET = {
    "name": "k80-old",
    "pools": [
        {"name": "k80", "gpu_model": "K80", "nodes": 2, "gpus_per_node": 8, "cpu_cores": 32, "mem_gib": 256},
        {
            "name": "t4",
            "gpu_model": "T4",
            "nodes": 1,
            "gpus_per_node": 4,
            "cpu_cores": 32,
            "mem_gib": 256,
            "gpus": [{"mode": "time-slice", "count": 2, "max_shares": 2}],
        },
    ],
}


@pytest.mark.parametrize(
    "source",
    [
        "docs/fleets/default.yaml",
        "docs/fleets/holdout.yaml",
        "docs/fleets/older-mig.yaml",
        "k80 and t4",
        "k80 only",
    ],
)
def test_any_fleet_file_gets_a_ceiling_under_the_earlier_bounds(
    source: str, gavel: GavelData, traces_dir: Path, truth_inputs: tuple[object, MeasuredPairs]
) -> None:
    fleets = {"k80 and t4": K80_FLEET, "k80 only": K80_ONLY}
    fleet = parse_fleet(fleets[source]) if source in fleets else load_fleet(ROOT / source)
    rule, pairs = truth_inputs
    world = World.build(gavel, rule, fleet_models(fleet), pairs, 1)  # type: ignore[arg-type]
    jobs = dense_part(load_jobs(traces_dir / "openb" / "openb_pod_list_default.csv", gavel, 1))[:300]
    for load in (0.8, 1.5):
        bound = fleet_ceiling(fleet, jobs, world, ReplayConfig(load=load), max_intervals=6)
        assert 0 < bound.strict_pct <= bound.earlier.no_queue_pct + 1e-6
        assert bound.strict.intervals == 6
        assert bound.jobs <= len(jobs)  # jobs no model of the fleet runs are refused, not crashed on
