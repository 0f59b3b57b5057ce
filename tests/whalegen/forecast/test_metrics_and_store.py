from __future__ import annotations

import math

import numpy as np
import pytest
import xgboost as xgb

from whalegen.forecast import metrics
from whalegen.forecast.store import dump_model, load_model, should_promote


def test_smape_counts_both_zero_as_a_perfect_forecast() -> None:
    assert metrics.smape([0, 0, 10], [0, 0, 10]) == 0.0
    assert metrics.smape([0, 10], [0, 30]) == pytest.approx(100.0 * (0 + 1.0) / 2)


def test_relative_error_buckets_match_hand_count() -> None:
    actual = np.array([100.0, 100.0, 100.0, 100.0, 100.0])
    predicted = np.array([105.0, 140.0, 190.0, 900.0, 5000.0])  # 5 %, 40 %, 90 %, 800 %, 4900 %
    buckets = metrics.relative_error_buckets(actual, predicted)
    assert buckets == {"within_10pct": 0.2, "within_50pct": 0.4, "within_100pct": 0.6, "within_1000pct": 0.8}


def test_spearman_is_one_for_monotone_and_handles_ties() -> None:
    assert metrics.spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert metrics.spearman([1, 1, 2, 2], [5, 5, 7, 7]) == pytest.approx(1.0)
    assert math.isnan(metrics.spearman([1, 2, 3], [5, 5, 5]))


def test_pinball_and_under_prediction_rate() -> None:
    assert metrics.pinball([10.0], [8.0], 0.9) == pytest.approx(1.8)
    assert metrics.pinball([10.0], [12.0], 0.9) == pytest.approx(0.2)
    assert metrics.under_prediction_rate([1, 2, 3, 4], [1, 1, 3, 5]) == 0.25


def test_model_envelope_round_trips_boosters_and_refuses_the_wrong_kind() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    booster = xgb.train({"nthread": 1}, xgb.DMatrix(x, label=x[:, 0] * 2), 5)
    blob = dump_model("series", {"a": 1}, {"main": booster})
    env = load_model(blob, "series")
    assert env.meta == {"a": 1}
    np.testing.assert_array_equal(
        env.boosters["main"].predict(xgb.DMatrix(x)), booster.predict(xgb.DMatrix(x))
    )
    with pytest.raises(ValueError, match="expected 'duration'"):
        load_model(blob, "duration")


@pytest.mark.parametrize(
    ("candidate", "active", "promote"),
    [
        pytest.param(0.9, 1.0, True, id="beats baselines and the active model"),
        pytest.param(0.9, 0.8, False, id="worse than the active model"),
        pytest.param(1.2, None, False, id="worse than a baseline with no active model"),
        pytest.param(0.95, None, True, id="first model beating every baseline"),
        pytest.param(float("nan"), None, False, id="no metric never promotes"),
    ],
)
def test_should_promote_needs_to_beat_every_baseline_and_the_active_model(
    candidate: float, active: float | None, promote: bool
) -> None:
    baselines = {"persistence": {"mae": 1.0}, "window_mean": {"mae": 1.1}}
    decision = should_promote(
        {"mae": candidate}, None if active is None else {"mae": active}, baselines, metric="mae"
    )
    assert decision.promote is promote
    assert decision.reason


def test_should_promote_respects_direction_and_margin() -> None:
    baselines = {"global_median": {"spearman": 0.30}}
    assert should_promote(
        {"spearman": 0.4}, None, baselines, metric="spearman", lower_is_better=False
    ).promote
    assert not should_promote({"mae": 0.995}, None, {"p": {"mae": 1.0}}, metric="mae", min_gain=0.01).promote


def test_should_promote_refuses_a_memory_model_over_the_under_prediction_limit() -> None:
    baselines = {"peak_so_far": {"saved_vs_request": 0.05, "under_rate": 0.006}}
    risky = {"saved_vs_request": 0.30, "under_rate": 0.02}
    safe = {"saved_vs_request": 0.15, "under_rate": 0.008}
    kwargs = {"metric": "saved_vs_request", "lower_is_better": False, "limits": {"under_rate": 0.01}}
    assert not should_promote(risky, None, baselines, **kwargs).promote  # type: ignore[arg-type]
    assert should_promote(safe, None, baselines, **kwargs).promote  # type: ignore[arg-type]


def test_a_baseline_over_the_limit_is_not_a_rival() -> None:
    kwargs = {"metric": "saved_vs_request", "lower_is_better": False, "limits": {"under_rate": 0.01}}
    safe = {"saved_vs_request": 0.09, "under_rate": 0.008}
    unsafe_rule = {"saved_vs_request": 0.14, "under_rate": 0.013}
    safe_rule = {"saved_vs_request": 0.10, "under_rate": 0.005}
    assert should_promote(safe, None, {"window_max": unsafe_rule}, **kwargs).promote  # type: ignore[arg-type]
    both = {"window_max": unsafe_rule, "peak": safe_rule}
    assert not should_promote(safe, None, both, **kwargs).promote  # type: ignore[arg-type]
