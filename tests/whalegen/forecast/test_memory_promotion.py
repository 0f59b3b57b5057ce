"""The memory-peak promotion rule: under-prediction first, then memory saved at comparable risk."""

from __future__ import annotations

import pytest

from whalegen.forecast.memory import memory_promotion, pareto_beats, under_rate_noise


def s(under: float, saved: float) -> dict[str, float]:
    return {"under_rate": under, "saved_vs_request": saved}


@pytest.mark.parametrize(
    ("candidate", "other", "beats"),
    [
        (s(0.005, 0.60), s(0.005, 0.55), True),  # same risk, more saved
        (s(0.002, 0.595), s(0.005, 0.60), True),  # fewer misses, saved within the 1-point tolerance
        (s(0.002, 0.55), s(0.005, 0.60), False),  # fewer misses bought with 5 points less saved
        (s(0.006, 0.70), s(0.005, 0.60), False),  # more misses never win, whatever is saved
        (s(0.005, 0.60), s(0.005, 0.60), False),  # equal is not better
        (s(float("nan"), 0.60), s(0.005, 0.60), False),
    ],
)
def test_pareto_beats_at_comparable_memory_saved(candidate, other, beats) -> None:
    assert pareto_beats(candidate, other) is beats


def test_the_rule_checks_the_limit_then_baselines_then_the_active_model() -> None:
    base = {"peak_so_far": s(0.005, 0.60), "window_max": s(0.005, 0.61)}
    ok, reason = memory_promotion(s(0.003, 0.62), base, None, max_under=0.01)
    assert ok and reason.endswith("beats every baseline")
    ok, reason = memory_promotion(s(0.02, 0.90), base, None, max_under=0.01)
    assert not ok and "above the limit 0.0100" in reason
    ok, reason = memory_promotion(s(0.005, 0.605), base, None, max_under=0.01)
    assert not ok and "baseline window_max" in reason
    # Against the active model a real gain is needed: 0.5 point more saved at the same risk is noise.
    ok, reason = memory_promotion(s(0.003, 0.625), base, s(0.003, 0.62), max_under=0.01)
    assert not ok and "the active model" in reason
    ok, _ = memory_promotion(s(0.003, 0.64), base, s(0.003, 0.62), max_under=0.01)
    assert ok


def test_under_prediction_rates_within_sampling_noise_count_as_equal() -> None:
    # 9 against 7 misses in 920 validation origins: within one standard error (≈ 0.0029).
    base = {"peak_so_far": {**s(7 / 920, 0.68), "n": 920}}
    assert under_rate_noise(7 / 920, 920) == pytest.approx(((7 / 920) * (1 - 7 / 920) / 920) ** 0.5)
    ok, _ = memory_promotion(s(9 / 920, 0.75), base, None, max_under=0.01)
    assert ok  # the same risk, 7 points more memory saved
    ok, reason = memory_promotion(s(9 / 920, 0.68), base, None, max_under=0.01)
    assert not ok and "baseline peak_so_far" in reason  # the same risk and nothing saved: no gain
    far = {"peak_so_far": {**s(1 / 920, 0.68), "n": 920}}
    ok, _ = memory_promotion(s(9 / 920, 0.75), far, None, max_under=0.01)
    assert not ok  # 9 against 1 miss is not noise, whatever is saved
    # Without a count, no noise is allowed.
    ok, _ = memory_promotion(s(9 / 920, 0.75), {"peak_so_far": s(7 / 920, 0.68)}, None, max_under=0.01)
    assert not ok
