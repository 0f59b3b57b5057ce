from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from whalegen.forecast.arrivals import (
    OTHER,
    ArrivalConfig,
    ArrivalModel,
    arrival_counts,
    arrival_rows,
    evaluate_arrivals,
    expected_shape_mix,
    forecast_arrivals,
)
from whalegen.forecast.memory import MemoryConfig, MemoryModel, calibrate_margin, evaluate_memory, memory_rows


def test_memory_rows_target_is_the_future_peak_and_features_the_past() -> None:
    cfg = MemoryConfig(window_s=300, horizon_s=300, origin_every_s=60, min_samples=3)
    t = np.arange(0, 1_200, 60.0)
    v = np.where(t < 600, 100.0, 400.0)
    rows = memory_rows(np.array(["a"] * len(t)), t, v, cfg)
    at_300 = rows[rows["t"] == 300].iloc[0]
    assert at_300["anchor"] == 100.0  # peak so far
    assert at_300["target"] == 400.0  # samples 360…600 include the jump at 600
    at_240 = rows[rows["t"] == 240].iloc[0]
    assert at_240["target"] == 100.0  # 300…540: before the jump
    # Changing samples after an origin leaves that origin's features alone.
    v2 = v.copy()
    v2[t > 300] = 10_000.0
    rows2 = memory_rows(np.array(["a"] * len(t)), t, v2, cfg)
    cols = ["anchor", "last_frac", "win_max_frac", "win_std_frac", "age_s"]
    pd.testing.assert_frame_equal(rows.loc[rows["t"] <= 300, cols], rows2.loc[rows2["t"] <= 300, cols])


def test_calibrated_margin_keeps_under_prediction_at_the_target_on_its_rows() -> None:
    rng = np.random.default_rng(0)
    predicted = np.full(999, 100.0)
    actual = rng.uniform(50, 150, 999)
    margin = calibrate_margin(actual, predicted, 0.01)
    assert np.mean(actual > predicted * margin) <= 0.01
    assert np.mean(actual > predicted * margin * 0.99) > 0.0  # and not more than needed
    assert calibrate_margin(np.full(10, 1.0), np.full(10, 5.0), 0.01) == 1.0


def _memory_trace(n_tasks: int = 30, n: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    ids, ts, vs = [], [], []
    for k in range(n_tasks):
        level = rng.uniform(2_000, 20_000)
        t = np.arange(n) * 60.0
        v = level * (1 + 0.2 * np.sin(t / 900.0 + k)) + rng.normal(0, level * 0.02, n)
        ids += [f"p{k}"] * n
        ts.append(t)
        vs.append(v)
    return np.array(ids), np.concatenate(ts), np.concatenate(vs)


def test_memory_forecaster_saves_memory_against_the_request_and_round_trips() -> None:
    ids, t, v = _memory_trace()
    cfg = MemoryConfig(window_s=1_800, horizon_s=1_800)
    model, ev = evaluate_memory(ids, t, v, cfg, 0.6, request=40_000.0, rounds=60)
    xgb_scores = ev.models["xgboost"]
    assert ev.models["request"]["saved_vs_request"] == 0.0
    assert xgb_scores["saved_vs_request"] > 0.3
    assert xgb_scores["under_rate"] <= 0.05
    again = MemoryModel.from_bytes(model.to_bytes())
    rows = memory_rows(ids, t, v, cfg).iloc[:50]
    np.testing.assert_array_equal(again.predict_peak(rows), model.predict_peak(rows))
    assert np.all(model.predict_peak(rows) >= rows["anchor"].to_numpy())


def test_arrival_counts_bin_by_shape_and_pool_the_rest() -> None:
    counts = arrival_counts(np.array([0, 10, 650, 700, 1_300]), ["a", "b", "a", "c", "a"], ("a", OTHER), 600)
    assert counts.to_numpy().tolist() == [[1, 1], [1, 1], [1, 0]]


def test_arrival_rows_use_only_bins_up_to_the_origin() -> None:
    cfg = ArrivalConfig(bin_s=600, steps=3, max_shapes=2)
    rng = np.random.default_rng(2)
    counts = pd.DataFrame(rng.poisson(2.0, (2_000, 2)).astype(float), columns=["a", OTHER])
    counts.index = np.arange(2_000) * 600
    changed = counts.copy()
    changed.iloc[1_501:] = 99.0
    origin = np.array([1_500])
    a = arrival_rows(counts, cfg, np.array([1.0, 1.0]), origin)
    b = arrival_rows(changed, cfg, np.array([1.0, 1.0]), origin)
    features = [c for c in a.columns if c != "target"]
    pd.testing.assert_frame_equal(a[features], b[features])
    assert (b["target"] == 99.0).all()


def _daily_arrivals(days: int = 14) -> tuple[np.ndarray, list[str]]:
    """Shape 'big' arrives only in the day's first six hours, 'small' all day long."""
    rng = np.random.default_rng(4)
    times, labels = [], []
    for d in range(days):
        for h in range(24):
            for _ in range(rng.poisson(6 if h < 6 else 0)):
                times.append(d * 86_400 + h * 3_600 + rng.uniform(0, 3_600))
                labels.append("big")
            for _ in range(rng.poisson(3)):
                times.append(d * 86_400 + h * 3_600 + rng.uniform(0, 3_600))
                labels.append("small")
    order = np.argsort(times)
    return np.asarray(times)[order], [labels[i] for i in order]


def test_arrival_forecaster_learns_the_daily_shape_mix_better_than_persistence() -> None:
    times, labels = _daily_arrivals()
    model, ev = evaluate_arrivals(times, labels, ArrivalConfig(max_shapes=2), 0.7, rounds=200)
    assert ev.models["xgboost"]["poisson_deviance"] < ev.models["persistence"]["poisson_deviance"]
    assert ev.models["xgboost"]["mix_tv_distance"] < ev.models["last_hour_mean"]["mix_tv_distance"]
    # At noon no 'big' task is expected in the next hour; 'small' ones keep coming.
    noon = forecast_arrivals(model, times, labels, 18 * 86_400 + 12 * 3_600)
    assert noon.shape == (6, 3) and sorted(noon.columns) == sorted(["big", "small", OTHER])
    assert noon["big"].sum() < 0.5 < noon["small"].sum()
    mix = expected_shape_mix(noon)
    assert sum(mix.values()) == pytest.approx(1.0)
    assert mix["small"] > 0.8  # at noon nearly every expected arrival is a 'small' task
    again = ArrivalModel.from_bytes(model.to_bytes())
    pd.testing.assert_frame_equal(forecast_arrivals(again, times, labels, 18 * 86_400 + 12 * 3_600), noon)


@pytest.mark.parametrize("now_s", [5 * 86_400 + 3 * 3_600 + 17.0, 9 * 86_400])
def test_forecast_arrivals_labels_the_next_bins_from_now(now_s: float) -> None:
    times, labels = _daily_arrivals(10)
    model, _ = evaluate_arrivals(times, labels, ArrivalConfig(max_shapes=2), 0.7, rounds=20)
    out = forecast_arrivals(model, times, labels, now_s)
    edge = (now_s // 600) * 600
    assert list(out.index) == [edge + k * 600 for k in range(6)]
    assert (out.to_numpy() >= 0).all()


def test_conformal_bound_covers_exchangeable_rows_at_the_level_and_pac_holds_the_realised_rate() -> None:
    from whalegen.forecast.memory import conformal_rank

    assert conformal_rank(999, 0.01) == 990  # ⌈1000 · 0.99⌉
    assert conformal_rank(2_039, 0.01, 0.9) > conformal_rank(2_039, 0.01)
    assert conformal_rank(50, 0.01, 0.9) == 51  # too few rows for a finite bound at that confidence
    rng = np.random.default_rng(7)
    alpha, n_cal, trials = 0.05, 200, 400
    plain, pac = [], []
    for _ in range(trials):
        predicted = rng.uniform(1.0, 3.0, n_cal + 4_000)
        actual = predicted * rng.lognormal(0.0, 0.4, n_cal + 4_000)  # exchangeable ratios
        cal, new = slice(0, n_cal), slice(n_cal, None)
        m_plain = calibrate_margin(actual[cal], predicted[cal], alpha)
        m_pac = calibrate_margin(actual[cal], predicted[cal], alpha, confidence=0.9)
        plain.append(np.mean(actual[new] > m_plain * predicted[new]))
        pac.append(np.mean(actual[new] > m_pac * predicted[new]))
    # Split conformal: the expected miss rate is 1 − k/(n + 1) ≤ α (tight); the Monte Carlo mean over
    # 400 draws lands on it within about 3 standard errors (≈ 0.00075 each).
    expected = 1.0 - conformal_rank(n_cal, alpha) / (n_cal + 1)
    assert alpha - 0.005 < expected <= alpha
    assert abs(np.mean(plain) - expected) < 0.0025
    # PAC: the realised rate is ≤ α in at least ~90 % of calibration draws; plain only in about half.
    assert np.mean(np.asarray(pac) <= alpha) >= 0.85
    assert np.mean(np.asarray(plain) <= alpha) < 0.75
