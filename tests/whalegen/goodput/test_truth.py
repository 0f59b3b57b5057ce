"""The replay's truth (whalegen.goodput.truth): measured where measured, the rule with a drawn error
elsewhere, each physics rule computed by hand on two jobs, GPU memory that keeps Gavel's unfit pairs apart."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from tests.whalegen.goodput.test_replay import RULE, V100, A, B, _fleet, _gavel, _job, measured_pairs
from whalegen.goodput.data import GavelData, JobType
from whalegen.goodput.jobs import Service, ServiceProfile
from whalegen.goodput.replay import ReplayConfig, World, run_goodput
from whalegen.goodput.speed import SpeedModel
from whalegen.goodput.truth import (
    SPEED_ERROR_SIGMA,
    MeasuredPairs,
    TrueSpeed,
    job_memory_mib,
    job_rate,
    mig_service_factor,
)
from whalegen.gpus.catalogue import get_model


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(_gavel(), RULE, [V100, "A100-40GB"], measured_pairs())


# -- speed --------------------------------------------------------------------------------------------------


def test_true_speed_is_gavels_measurement_where_measured_whatever_the_seed() -> None:
    for seed in (0, 1, 2):
        truth = TrueSpeed(_gavel(), seed)
        assert truth.speed(A, V100) == 10.0 and truth.speed(B, "P100") == 2.0
        assert truth.speed(A, "V100M32") == 10.0  # the same chip as the measured V100M16


def test_true_speed_elsewhere_is_the_rule_times_an_error_drawn_with_the_seed(gavel: GavelData) -> None:
    rule = SpeedModel(gavel)
    jobs = [j for j in gavel.job_types if (V100, j) in gavel.solo]
    logs = {}
    for seed in (1, 2):
        truth = TrueSpeed(gavel, seed)
        logs[seed] = [math.log(truth.speed(j, "H100") / rule.throughput(j, "H100")) for j in jobs]
        assert truth.speed(jobs[0], "H100") == TrueSpeed(gavel, seed).speed(jobs[0], "H100")  # deterministic
    assert logs[1] != logs[2]  # another seed, another truth
    # The drawn errors have the documented spread (lognormal σ) over the 80-odd job types.
    assert statistics.pstdev(logs[1]) == pytest.approx(SPEED_ERROR_SIGMA, rel=0.3)
    assert abs(statistics.mean(logs[1])) < 0.15


def test_a_job_gavel_found_not_to_fit_runs_at_zero_there(gavel: GavelData) -> None:
    truth = TrueSpeed(gavel, 0)
    big = JobType("ResNet-50 (batch size 128)", 2)
    assert truth.speed(big, "K80") == 0.0 and not truth.runs_on(big, "K80")
    assert truth.runs_on(big, V100)


# -- memory -------------------------------------------------------------------------------------------------


def test_every_pair_gavel_marks_unfit_exceeds_the_cards_memory_and_every_job_fits_alone(
    gavel: GavelData,
) -> None:
    fit = job_memory_mib(gavel)
    unfit = [(m, a, b) for (m, a, b) in gavel.unfit if a.num_gpus == 1 and b.num_gpus == 1]
    assert fit.unfit_pairs == len(unfit) > 100
    for model, a, b in unfit:
        assert fit.mem_mib[a] + fit.mem_mib[b] > (get_model(model).mem_mib or 0)
    for model, job in gavel.solo:
        assert fit.mem_mib[job] <= (get_model(model).mem_mib or 0)
    # Conservative, but not blunt: most measured pairs still fit together.
    assert fit.fit_pairs_excluded < 0.1 * fit.fit_pairs


# -- the rules by hand, two jobs each ---------------------------------------------------------------------


def test_a_fractional_job_alone_uses_no_more_than_its_share(world: World) -> None:
    # One whole V100, k8s-default. A 500-milli job of 1 h (0.5 GPU-h of work) holds the whole GPU but runs
    # at its share: it takes 1 h, not 0.5 h. A whole job of 1 h waits for it and runs 1–2 h. Offered 1.5
    # GPU-h at load 1: a 1.5 h window, in which 0.5 + 0.5 GPU-h are done: goodput 2/3.
    jobs = [_job("half", A, 3600, milli=500), _job("whole", B, 3600)]
    result = run_goodput(_fleet(), jobs, [], world, "k8s-default", 0, ReplayConfig(load=1.0))  # type: ignore[arg-type]
    assert job_rate(world.truth, jobs[0], V100) == pytest.approx(5.0)  # 10 it/s × 0.5
    assert result.window_h == pytest.approx(1.5, abs=1e-3)
    assert result.mean_jct_h == pytest.approx((1.0 + 2.0) / 2, abs=0.02)
    assert result.goodput_pct == pytest.approx(100 * 2 / 3, abs=0.5)


def test_a_fractional_job_on_a_mig_slice_at_least_its_size_runs_at_full_speed(world: World) -> None:
    # fgd carves each request the smallest A100 slice with its milli and memory. A 250-milli job gets
    # 2g.10gb (2/7 of the SMs, 2/8 of the bandwidth): between 0.25 and 0.286 of the GPU whatever the job's
    # exponent, at least its share, so it runs its work (1 h at its share of a V100) at its share of the
    # A100: in 10 / T(A100) h. A 570-milli job on its 4g.20gb slice (4/7 = 0.571 of the SMs, 4/8 of the
    # bandwidth) gets min(0.57, the slice's scale) of the GPU. (Before issue #41 both ran at the slice's
    # scale of a whole-GPU job: 3.5–4× longer.)
    small, large = _job("small", A, 3600, milli=250), _job("large", A, 3600, milli=570)
    fleet = _fleet("mig", model="A100-40GB")
    result = run_goodput(fleet, [small, large], [], world, "fgd", 0, ReplayConfig(load=0.2, step_s=10.0))  # type: ignore[arg-type]
    a100 = world.truth.speed(A, "A100-40GB")
    scale = world.truth.slice_scale(A, 4 / 7, 4 / 8)
    assert 0.5 <= scale <= 4 / 7
    small_h = 10.0 / a100
    large_h = 10.0 * 0.57 / (a100 * min(0.57, scale))
    assert result.finished == 2
    assert result.mean_jct_h == pytest.approx((small_h + large_h) / 2, rel=0.01)


def test_a_pair_within_memory_shares_and_a_pair_beyond_it_waits(world: World) -> None:
    # Gavel marks (A, B) as not fitting together on a V100; (A, A) fits. On one MPS V100 of two shares:
    # two 400-milli A jobs run together at the measured factor 0.9 (1 / 0.9 h each); an A and a B
    # job of 400 milli cannot share, so the second runs after the first (1 h, then 2 h).
    gavel = replace(
        _gavel(),
        pairs={(V100, A, A): (8.0, 8.0)},
        unfit=frozenset({(V100, A, B), (V100, B, A)}),
    )
    truth = World.build(gavel, RULE, [V100], measured_pairs())
    memory = get_model(V100).mem_mib or 0
    assert truth.job_mem_mib[A] + truth.job_mem_mib[B] > memory >= 2 * truth.job_mem_mib[A]
    fleet = _fleet("mps")
    config = ReplayConfig(load=0.5, step_s=10.0)  # a 1.6 h window, the replay runs on to 3.2 h
    pair = [_job("a1", A, 3600, milli=400), _job("a2", A, 3600, milli=400)]
    within = run_goodput(fleet, pair, [], truth, "share-binpack", 0, config)  # type: ignore[arg-type]
    assert within.mean_jct_h == pytest.approx(1 / 0.9, abs=0.01)
    pair = [_job("a", A, 3600, milli=400), _job("b", B, 3600, milli=400)]
    beyond = run_goodput(fleet, pair, [], truth, "share-binpack", 0, config)  # type: ignore[arg-type]
    assert beyond.mean_jct_h == pytest.approx((1.0 + 2.0) / 2, abs=0.01)


def test_a_service_on_a_mig_slice_is_capped_by_its_slice(world: World) -> None:
    # fgd carves a 500-milli service a 4g.20gb A100 slice: 4/7 = 57 % of the SMs. At 90 % utilisation (of a
    # whole GPU) it gets 57 / 90 = 0.63 of its speed, below its SLA of 0.9: every minute violates. At 40 %
    # the slice covers it: none does.
    assert mig_service_factor(90.0, 4 / 7) == pytest.approx(0.635, abs=1e-3)
    assert mig_service_factor(40.0, 4 / 7) == 1.0
    static = ReplayConfig(load=1.0, service_churn=False, step_s=60.0)
    fleet = _fleet("mig", model="A100-40GB")
    jobs = [_job("j", A, 600)]  # the window: a tenth of an hour of a whole A100's work
    for util, violating in ((90.0, 100.0), (40.0, 0.0)):
        service = Service("svc-000", ServiceProfile("pod", (util,) * 10, ()), 0.9)
        result = run_goodput(fleet, jobs, [service], world, "fgd", 0, static)  # type: ignore[arg-type]
        assert result.sla_violation_pct == pytest.approx(violating)


def test_measured_pairs_pick_among_the_nearest_measurements_their_spread() -> None:
    points = ((50.0, 50.0, 0.8), (50.0, 55.0, 0.9), (55.0, 50.0, 1.0), (0.0, 0.0, 0.2))
    pairs = MeasuredPairs(points, k=3)
    assert [pairs.factor(52.0, 52.0, pick) for pick in range(3)] == [0.8, 0.9, 1.0]
    assert pairs.factor(250.0, 52.0, 0) == pairs.factor(100.0, 52.0, 0)  # clamped to the measured range
