from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from whalegen.forecast.series import (
    Aggregation,
    SeriesConfig,
    SeriesModel,
    XgbParams,
    bin_series,
    build_rows,
    evaluate_series,
    predict_series,
)

FAST = XgbParams(max_rounds=60, early_stopping_rounds=10)


def _minutes(values: list[float], start: str = "2020-05-01") -> pd.Series:
    index = pd.date_range(start, periods=len(values), freq="60s")
    return pd.Series(values, index=index, dtype=np.float64)


def test_bin_series_takes_the_bin_maximum_or_mean_and_keeps_gaps() -> None:
    times = pd.Series(pd.to_datetime(["2020-01-01 00:00", "2020-01-01 00:04", "2020-01-01 00:25"]))
    values = pd.Series([3.0, 7.0, 1.0])
    by_max = bin_series(times, values, 600, Aggregation.MAX)
    by_mean = bin_series(times, values, 600, Aggregation.MEAN)
    assert by_max.tolist()[0] == 7.0 and by_mean.tolist()[0] == 5.0
    assert np.isnan(by_max.iloc[1])  # 00:10–00:20 had no sample: a gap, not a zero
    assert by_max.iloc[2] == 1.0


def test_baselines_on_a_hand_made_series() -> None:
    # 10-minute bins, horizon 20 minutes (2 bins), window 30 minutes (3 bins).
    cfg = SeriesConfig(horizon_s=1_200, bin_s=600, window_s=1_800)
    y = pd.Series([1.0, 2.0, 4.0, 8.0, 16.0], index=pd.date_range("2020-01-01", periods=5, freq="600s"))
    rows = build_rows(y, cfg, scale=16.0)
    assert rows["target"].tolist()[:3] == [4.0, 8.0, 16.0]
    assert rows["base_persistence"].tolist() == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert rows["base_window_mean"].tolist()[3] == pytest.approx((2.0 + 4.0 + 8.0) / 3)
    # No bin one day earlier exists: the seasonal baseline falls back to persistence.
    assert rows["base_same_slot_yesterday"].tolist() == rows["base_persistence"].tolist()


def test_same_slot_yesterday_reads_the_target_slot_one_day_back() -> None:
    cfg = SeriesConfig(horizon_s=3_600, bin_s=3_600)
    y = pd.Series(np.arange(30, dtype=np.float64), index=pd.date_range("2020-01-01", periods=30, freq="h"))
    rows = build_rows(y, cfg, scale=30.0)
    # Origin hour 25 targets hour 26; yesterday's hour 26 is hour 2.
    assert rows.loc[25, "base_same_slot_yesterday"] == 2.0
    assert rows.loc[25, "target"] == 26.0


def test_features_never_look_past_the_origin() -> None:
    cfg = SeriesConfig(horizon_s=3_600, bin_s=600)
    rng = np.random.default_rng(1)
    base = pd.Series(
        rng.integers(0, 50, 2_000).astype(np.float64),
        index=pd.date_range("2020-01-01", periods=2_000, freq="600s"),
    )
    cut = 1_500
    changed = base.copy()
    changed.iloc[cut + 1 :] = rng.integers(100, 200, len(base) - cut - 1)
    a = build_rows(base, cfg, 50.0)
    b = build_rows(changed, cfg, 50.0)
    features = [c for c in a.columns if c not in {"target", "origin", "target_time"}]
    pd.testing.assert_frame_equal(a.loc[:cut, features], b.loc[:cut, features])
    # The target itself is in the future and does change: the test could notice a leak.
    assert not a.loc[cut - 6 : cut, "target"].equals(b.loc[cut - 6 : cut, "target"])


def test_horizon_must_be_whole_bins_and_at_most_a_day() -> None:
    with pytest.raises(ValueError, match="whole number"):
        SeriesConfig(horizon_s=900, bin_s=600)
    with pytest.raises(ValueError, match="one day"):
        SeriesConfig(horizon_s=2 * 86_400, bin_s=600)


def _mean_reverting_pools(n: int = 3_000) -> dict[str, pd.Series]:
    """Two pools whose level jumps and then decays back to a set point: persistence is wrong after
    every jump, a model that knows the recent mean is not."""
    rng = np.random.default_rng(7)
    out = {}
    for name, size in (("small", 16.0), ("big", 64.0)):
        level, values = size / 2, []
        for _ in range(n):
            if rng.random() < 0.05:
                level += rng.normal(0, size / 4)
            level += 0.3 * (size / 2 - level)
            values.append(float(np.clip(round(level), 0, size)))
        out[name] = _minutes(values)
    return out


def test_xgboost_beats_persistence_when_the_series_is_predictable() -> None:
    series = _mean_reverting_pools()
    cfg = SeriesConfig(horizon_s=600, bin_s=60)
    split = series["small"].index[2_200]
    _, evaluation = evaluate_series(series, cfg, split, params=FAST)
    models = evaluation.models
    assert set(models) == {"xgboost", "persistence", "same_slot_yesterday", "window_mean"}
    assert models["xgboost"]["mae"] < 0.9 * models["persistence"]["mae"]
    assert evaluation.n_test == models["persistence"]["n"] > 0
    assert set(evaluation.per_series) == {"small", "big"}
    assert evaluation.chosen == "xgboost"  # the inner validation agreed
    assert evaluation.inner_mae["persistence"] > min(
        evaluation.inner_mae["reg:absoluteerror"], evaluation.inner_mae["reg:pseudohubererror"]
    )


def test_an_unpredictable_step_series_is_served_by_persistence() -> None:
    # Symmetric ±1 steps at random minutes: the last value is the MAE-optimal forecast, so the model
    # must not beat it on the inner validation and the evaluation serves persistence itself.
    rng = np.random.default_rng(4)
    steps = rng.choice([-1.0, 0.0, 1.0], size=4_000, p=[0.03, 0.94, 0.03])
    series = {"walk": _minutes(list(40.0 + np.cumsum(steps)))}
    cfg = SeriesConfig(horizon_s=600, bin_s=60)
    model, evaluation = evaluate_series(series, cfg, series["walk"].index[3_000], params=FAST)
    assert model.chosen == evaluation.chosen == "persistence"
    assert evaluation.models["xgboost"]["mae"] == evaluation.models["persistence"]["mae"]
    again = SeriesModel.from_bytes(model.to_bytes())
    assert again.chosen == "persistence"
    history = series["walk"].iloc[:3_500]
    assert predict_series(again, history, "walk") == history.iloc[-1]


@pytest.fixture(scope="module")
def trained() -> tuple[dict[str, pd.Series], SeriesModel]:
    series = _mean_reverting_pools(1_500)
    cfg = SeriesConfig(horizon_s=600, bin_s=60)
    model, _ = evaluate_series(series, cfg, series["big"].index[1_000], params=FAST)
    return series, model


def test_model_round_trips_through_bytes_with_identical_forecasts(
    trained: tuple[dict[str, pd.Series], SeriesModel],
) -> None:
    series, model = trained
    again = SeriesModel.from_bytes(model.to_bytes())
    assert again.config == model.config and again.scales == model.scales
    history = series["big"].iloc[:1_200]
    assert predict_series(again, history, "big") == predict_series(model, history, "big")


def test_forecasts_of_a_count_series_are_whole_numbers(
    trained: tuple[dict[str, pd.Series], SeriesModel],
) -> None:
    series, model = trained
    assert model.integer_valued
    forecast = predict_series(model, series["big"].iloc[:1_100], "big")
    assert forecast == round(forecast)
