from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from whalegen.forecast.durations import (
    DurationConfig,
    DurationModel,
    DurationParams,
    evaluate_durations,
    history_features,
    predict_durations,
)

FAST = DurationParams(max_rounds=80, early_stopping_rounds=10)


def test_history_holds_only_tasks_finished_by_submission() -> None:
    # Task 0 runs 0–100, task 1 runs 50–60, task 2 is submitted at 100 (task 0 ends exactly then).
    start = np.array([0.0, 50.0, 100.0, 100.0])
    end = np.array([100.0, 60.0, 400.0, 150.0])
    keys = ["a", "a", "a", "b"]
    hist = history_features(start, end, keys)
    assert hist["key_count"].tolist() == [0, 0, 2, 0]
    assert hist.loc[2, "key_mean_s"] == pytest.approx((100 + 10) / 2)
    assert hist.loc[2, "key_mean_log"] == pytest.approx((math.log(100) + math.log(10)) / 2)
    assert hist.loc[1, "key_running"] == 1  # task 0 still running when task 1 arrives
    assert hist.loc[3, "global_mean_s"] == pytest.approx(55.0)  # b has no history; the pool does


def test_history_of_a_task_ignores_everything_after_its_submission() -> None:
    rng = np.random.default_rng(3)
    start = np.sort(rng.uniform(0, 1_000, 200))
    end = start + rng.lognormal(3, 1, 200)
    keys = [f"k{i % 4}" for i in range(200)]
    a = history_features(start, end, keys)
    later = end.copy()
    later[150:] = end[150:] * 50  # rewrite the future
    b = history_features(start, later, keys)
    pd.testing.assert_frame_equal(a.iloc[:151], b.iloc[:151])


def _tasks(n: int = 1_200, seed: int = 5) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Durations set by the request (GPU count) and a per-key factor, log-normal noise."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"gpus": rng.choice([1, 2, 8], n), "queue": rng.choice(["dev", "prod"], n)})
    base = np.where(frame["gpus"] == 8, 20_000.0, np.where(frame["gpus"] == 2, 2_000.0, 200.0))
    base *= np.where(frame["queue"] == "prod", 3.0, 1.0)
    start = np.sort(rng.uniform(0, 30 * 86_400, n))
    end = start + base * rng.lognormal(0, 0.3, n)
    return frame, start, end


def test_quantile_model_orders_p50_below_p90_and_beats_the_global_median() -> None:
    frame, start, end = _tasks()
    cfg = DurationConfig(key_cols=("gpus", "queue"), feature_cols=("gpus", "queue"))
    model, evaluation = evaluate_durations(frame, start, end, cfg, 0.7, FAST)
    xgb_scores, median = evaluation.models["xgboost_p50"], evaluation.models["global_median"]
    assert xgb_scores["within_50pct"] > median["within_50pct"] + 0.3
    assert xgb_scores["log_mae"] < median["log_mae"]
    assert 0.7 <= xgb_scores["p90_coverage"] <= 1.0
    pred = predict_durations(model, frame.iloc[-50:], start[-50:], frame.iloc[:-50], start[:-50], end[:-50])
    assert pred.shape == (50, 2)
    assert np.all(pred[:, 0] <= pred[:, 1])


def test_key_history_baseline_is_the_mean_of_the_keys_finished_tasks() -> None:
    frame, start, end = _tasks(400)
    by_gpus = DurationConfig(key_cols=("gpus",), feature_cols=("gpus",))
    by_both = DurationConfig(key_cols=("gpus", "queue"), feature_cols=("gpus",))
    tiny = DurationParams(max_rounds=5, early_stopping_rounds=5)  # only the baselines are looked at
    _, coarse = evaluate_durations(frame, start, end, by_gpus, 0.7, tiny)
    _, fine = evaluate_durations(frame, start, end, by_both, 0.7, tiny)
    # Durations depend on GPUs and queue: the history of the full key lands near the truth, the
    # history of a key that mixes both queues (a 3× difference) does not.
    assert fine.models["key_history_mean"]["within_50pct"] > 0.8
    assert coarse.models["key_history_mean"]["within_50pct"] < 0.6
    bar = fine.to_json()["helios_bar"]
    assert bar == {"within_10pct": 0.1, "within_50pct": 0.5, "within_100pct": 0.7, "within_1000pct": 0.9}


def test_duration_model_round_trips_with_identical_predictions() -> None:
    frame, start, end = _tasks(500)
    cfg = DurationConfig(key_cols=("queue",), feature_cols=("gpus", "queue"))
    model, _ = evaluate_durations(frame, start, end, cfg, 0.7, FAST)
    again = DurationModel.from_bytes(model.to_bytes())
    assert again.categories == model.categories == {"queue": ["dev", "prod"]}
    args = (frame.iloc[-20:], start[-20:], frame.iloc[:-20], start[:-20], end[:-20])
    np.testing.assert_array_equal(predict_durations(again, *args), predict_durations(model, *args))


def test_a_zero_length_task_is_not_in_its_own_history() -> None:
    start = np.array([10.0, 10.0, 20.0])
    end = np.array([10.0, 15.0, 30.0])
    hist = history_features(start, end, ["a", "a", "a"])
    assert hist["key_count"].tolist() == [0, 0, 2]
    assert hist.loc[2, "key_mean_s"] == pytest.approx((1.0 + 5.0) / 2)  # 0 s is floored at 1 s
