from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from whalegen.goodput.data import GavelData, JobType
from whalegen.goodput.speed import EQUAL_SPEED_RULE, SpeedModel, holdout_errors
from whalegen.gpus.speed import GpuFigures, fit_power_law, gpu_figures

RESNET50_64 = JobType("ResNet-50 (batch size 64)", 1)


def _figures(tflops: float, gbps: float) -> GpuFigures:
    return GpuFigures(f"{tflops}/{gbps}", tflops, gbps)


def test_the_fit_recovers_a_known_exponent_and_scale() -> None:
    k, a = 2.0, 0.3
    cards = [_figures(5, 300), _figures(10, 700), _figures(40, 900)]
    points = [(f, k * f.fp32_tflops**a * f.mem_bandwidth_gbps ** (1 - a)) for f in cards]
    fit = fit_power_law(points)
    assert fit.compute_exponent == pytest.approx(a)
    assert math.exp(fit.log_scale) == pytest.approx(k)
    assert fit.throughput(_figures(80, 2000)) == pytest.approx(2.0 * 80**0.3 * 2000**0.7)


def test_the_exponent_is_clipped_to_zero_one() -> None:
    # Throughput grows faster than FLOPS along the FLOPS/bandwidth axis: the slope is above 1, so a = 1.
    cards = [_figures(10, 100), _figures(20, 100)]
    fit = fit_power_law([(cards[0], 1.0), (cards[1], 8.0)])
    assert fit.compute_exponent == 1.0
    # Both measured, the scale is refitted to their mean log residual: log k = mean(log T − log F).
    assert fit.log_scale == pytest.approx((math.log(1.0 / 10) + math.log(8.0 / 20)) / 2)


def test_one_point_or_one_balance_cannot_tell_compute_from_bandwidth() -> None:
    assert fit_power_law([(_figures(10, 100), 5.0)]).compute_exponent == 0.5
    same_ratio = [(_figures(10, 100), 5.0), (_figures(20, 200), 10.0)]
    assert fit_power_law(same_ratio).compute_exponent == 0.5


def test_an_anchored_prediction_scales_the_anchor_by_the_rules_ratio() -> None:
    fit = fit_power_law([(_figures(10, 100), 5.0)], fixed_exponent=0.5)
    # Twice the FLOPS, same bandwidth, a = 0.5: sqrt(2) times the anchor's measured 10.
    assert fit.from_anchor(_figures(10, 100), 10.0, _figures(20, 100)) == pytest.approx(10 * math.sqrt(2))
    # Four times both: four times, whatever a is.
    assert fit.from_anchor(_figures(10, 100), 10.0, _figures(40, 400)) == pytest.approx(40.0)


def _tiny_gavel() -> GavelData:
    # K80 (4.37, 240), P100 (9.3, 732), V100 (15.7, 900): a pure-bandwidth job, T = 0.01 × GB/s.
    job = JobType("Synthetic (batch size 1)", 1)
    solo = {("K80", job): 2.4, ("P100", job): 7.32, ("V100M16", job): 9.0}
    return GavelData(solo=solo, pairs={}, unfit=frozenset(), solo_unfit=frozenset())


def test_a_bandwidth_bound_job_scales_with_bandwidth_on_unmeasured_models() -> None:
    model = SpeedModel(_tiny_gavel())
    job = model.job_types[0]
    assert model.compute_exponent(job) == pytest.approx(0.0, abs=1e-9)
    assert model.throughput(job, "H100") == pytest.approx(33.5)  # 0.01 × 3,350 GB/s
    assert model.throughput(job, "A100-80GB") == pytest.approx(20.39)
    # A MIG 3g.40gb of an A100 80 GB has 4 of 8 memory slices: half the bandwidth, whatever its compute.


def test_measured_models_return_the_measurement(gavel: GavelData) -> None:
    model = SpeedModel(gavel)
    for (name, job), value in gavel.solo.items():
        assert model.throughput(job, name) == value
    assert model.throughput(RESNET50_64, "V100M32") == gavel.solo[("V100M16", RESNET50_64)]
    assert model.throughput(JobType("ResNet-50 (batch size 128)", 2), "K80") == 0.0


def test_unmeasured_models_stay_within_the_hardware_ratios_to_the_anchor(gavel: GavelData) -> None:
    model = SpeedModel(gavel)
    v100 = gpu_figures("V100M16")
    for name in ("A100-80GB", "H100-80GB", "H200-141GB", "L4"):
        target = gpu_figures(name)
        ratios = (target.fp32_tflops / v100.fp32_tflops, target.mem_bandwidth_gbps / v100.mem_bandwidth_gbps)
        for job in model.job_types:
            assert model.anchor_model(job) == "V100M16"
            ratio = model.throughput(job, name) / gavel.solo[("V100M16", job)]
            assert min(ratios) - 1e-9 <= ratio <= max(ratios) + 1e-9, (name, job)


def test_held_out_error_stays_bounded_and_beats_the_model_blind_baseline(gavel: GavelData) -> None:
    # A regression guard, loose on purpose: measured medians are 0.31-0.51 (docs/notes/goodput-design.md).
    rows = {(r.rule, r.held_out_model): r for r in holdout_errors(gavel)}
    for held in ("K80", "P100", "V100M16"):
        assert rows[("fitted a", held)].jobs == 80
        assert rows[("fitted a", held)].median_rel_error < 0.75
    for held in ("K80", "V100M16"):
        assert rows[("fitted a", held)].median_rel_error < rows[(EQUAL_SPEED_RULE, held)].median_rel_error


def test_a_model_without_figures_is_refused() -> None:
    with pytest.raises(ValueError, match="G1"):
        gpu_figures("G1")


@given(
    a=st.floats(0.0, 1.0),
    k=st.floats(1e-3, 1e3),
    cards=st.lists(
        st.tuples(st.floats(1.0, 100.0), st.floats(100.0, 5000.0)),
        min_size=3,
        max_size=5,
        unique_by=lambda c: c[0] / c[1],
    ),
)
def test_the_fit_recovers_any_exponent_in_range_from_exact_data(
    a: float, k: float, cards: list[tuple[float, float]]
) -> None:
    figures = [_figures(f, b) for f, b in cards]
    # Cards of (nearly) one FLOPS-to-bandwidth balance cannot identify a, by construction.
    assume(max(x.log_balance for x in figures) - min(x.log_balance for x in figures) >= 0.1)
    points = [(x, k * x.fp32_tflops**a * x.mem_bandwidth_gbps ** (1 - a)) for x in figures]
    fit = fit_power_law(points)
    assert fit.compute_exponent == pytest.approx(a, abs=1e-6)
    for x, t in points:
        assert fit.throughput(x) == pytest.approx(t, rel=1e-6)
