from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from whalegen.forecast.durations import (
    DurationConfig,
    DurationModel,
    DurationParams,
    conformal_shifts,
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


def test_burst_features_count_same_key_submissions_known_at_submission() -> None:
    # Key a: a burst of three within a minute, then one after 10 minutes; key b in between.
    start = np.array([0.0, 5.0, 30.0, 40.0, 630.0])
    end = np.array([20.0, 500.0, 900.0, 50.0, 700.0])
    hist = history_features(start, end, ["a", "a", "a", "b", "a"])
    assert hist["key_submitted_last_10s"].tolist() == [0, 1, 0, 0, 0]
    assert hist["key_submitted_last_min"].tolist() == [0, 1, 2, 0, 0]
    assert hist["key_burst_position"].tolist() == [0, 1, 2, 0, 0]
    assert hist["key_submitted_last_10min"].tolist() == [0, 1, 2, 0, 1]  # 630 − 30 = 600: inside
    # At 630 task 0 (20 s) and 1 (495 s) finished; task 2 (submitted at 30) still runs.
    assert hist.loc[4, "key_oldest_running_age_s"] == pytest.approx(600.0)
    assert hist.loc[4, "key_latest_submitted_log"] == pytest.approx(math.log(495.0))
    assert hist.loc[4, "since_key_finish_s"] == pytest.approx(130.0)
    ewm = 0.3 * math.log(495.0) + 0.7 * math.log(20.0)
    assert hist.loc[4, "key_ewm_log"] == pytest.approx(ewm)


def _bursty_tasks(n_bursts: int = 700, seed: int = 9) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Two keys; a task's duration is set by the size of the burst it arrives in (known at submission
    from the same key's submissions in the last minute), not by the key's finished history."""
    rng = np.random.default_rng(seed)
    starts, durs, keys = [], [], []
    t = 0.0
    for _ in range(n_bursts):
        t += rng.uniform(3_600, 7_200)
        size = int(rng.choice([1, 3, 6]))
        key = str(rng.choice(["x", "y"]))
        for j in range(size):
            starts.append(t + 2.0 * j)
            durs.append(60.0 * (1 + j) ** 2 * rng.lognormal(0, 0.1))
            keys.append(key)
    start = np.asarray(starts)
    return pd.DataFrame({"key": keys}), start, start + np.asarray(durs)


def test_model_earns_its_blend_weight_where_submission_features_carry_the_signal() -> None:
    frame, start, end = _bursty_tasks()
    cfg = DurationConfig(key_cols=("key",), feature_cols=("key",))
    model, evaluation = evaluate_durations(frame, start, end, cfg, 0.7, FAST)
    xgb_scores = evaluation.models["xgboost_p50"]
    rules = ("key_last10_geomean", "key_recent_ewm", "key_last10_median", "key_history_mean")
    assert model.blend_weight >= 0.5
    for rule in rules:
        assert xgb_scores["within_50pct"] > evaluation.models[rule]["within_50pct"] + 0.2
        assert xgb_scores["log_mae"] < evaluation.models[rule]["log_mae"]
    assert evaluation.to_json()["chosen"] == model.chosen


def test_blend_weight_zero_serves_the_rule_and_survives_the_envelope() -> None:
    frame, start, end = _tasks(500)
    cfg = DurationConfig(key_cols=("gpus", "queue"), feature_cols=("gpus",))
    model, _ = evaluate_durations(frame, start, end, cfg, 0.7, FAST)
    fallback = DurationModel(
        model.config, model.feature_names, model.categories, model.booster, model.global_median_s,
        model.n_train, blend_weight=0.0, blend_baseline="key_last10_mean_log",
    )  # fmt: skip
    again = DurationModel.from_bytes(fallback.to_bytes())
    assert (again.blend_weight, again.blend_baseline) == (0.0, "key_last10_mean_log")
    assert again.chosen == "baseline key_last10_mean_log"
    args = (frame.iloc[-30:], start[-30:], frame.iloc[:-30], start[:-30], end[:-30])
    pred = predict_durations(again, *args)
    hist = history_features(
        np.concatenate([start[:-30], start[-30:]]),
        np.concatenate([end[:-30], np.full(30, np.nan)]),
        [tuple(r) for r in frame[["gpus", "queue"]].astype(str).itertuples(index=False, name=None)],
    ).iloc[-30:]
    np.testing.assert_allclose(pred[:, 0], np.exp(hist["key_last10_mean_log"].to_numpy()), rtol=1e-6)
    assert np.all(pred[:, 0] <= pred[:, 1])


def test_batch_and_sibling_features_use_only_what_is_known_at_submission() -> None:
    # Key a: a batch of three at t=0 (one ends at 100, two run long), one more at t=1000.
    start = np.array([0.0, 0.0, 0.0, 1_000.0, 5_000.0])
    end = np.array([100.0, 4_000.0, 4_500.0, 1_100.0, 5_100.0])
    hist = history_features(start, end, ["a", "a", "a", "a", "a"])
    assert hist["key_same_instant"].tolist() == [3, 3, 3, 1, 1]
    # At 1000: one finish (100 s, at t=100, within the hour); two siblings running for 1000 s, past
    # the key's typical 100 s.
    assert hist.loc[3, "key_finished_last_hour"] == 1
    assert hist.loc[3, "key_running_over_ewm"] == 2
    assert hist.loc[3, "key_running_median_age_log"] == pytest.approx(math.log(1_000.0))
    # At 5000 the finishes at 4000 and 4500 lie within the hour; the one at 1100 does not.
    assert hist.loc[4, "key_finished_last_hour"] == 2
    assert math.isnan(hist.loc[4, "key_running_over_ewm"])  # nothing runs


def test_new_features_do_not_move_when_later_submissions_change() -> None:
    rng = np.random.default_rng(8)
    start = np.sort(rng.choice(np.arange(0.0, 3_000.0, 5.0), 300))  # repeated instants: batches
    end = start + rng.lognormal(4, 1, 300)
    keys = [f"k{i % 3}" for i in range(300)]
    cut = float(start[200])
    later = start > cut
    a = history_features(start, end, keys)
    moved = np.where(later, start + rng.uniform(0, 500, 300), start)  # rewrite every later submission
    b = history_features(moved, np.where(later, moved + 7.0, end), keys)
    known = np.flatnonzero(~later)
    pd.testing.assert_frame_equal(a.iloc[known], b.iloc[known])


def test_conformal_shift_lands_coverage_on_the_quantile() -> None:
    rng = np.random.default_rng(2)
    y = rng.normal(0.0, 1.0, 4_000)
    pred = np.zeros((4_000, 2))
    shifts = conformal_shifts(y[:2_000], pred[:2_000], (0.5, 0.9))
    assert shifts[0] == pytest.approx(0.0, abs=0.08) and shifts[1] == pytest.approx(1.2816, abs=0.1)
    fresh = y[2_000:]
    assert abs(np.mean(fresh <= shifts[0]) - 0.5) < 0.03 and abs(np.mean(fresh <= shifts[1]) - 0.9) < 0.03


def test_conformal_calibration_repairs_an_undertrained_model() -> None:
    # Five boosting rounds leave P90 near the anchor (about the median): the raw P90 covers far less
    # than 90 % of test tasks; the conformal shift from the inner blocks brings it back.
    frame, start, end = _tasks(800, seed=11)
    cfg = DurationConfig(key_cols=("gpus", "queue"), feature_cols=("gpus", "queue"))
    _, evaluation = evaluate_durations(
        frame, start, end, cfg, 0.7, DurationParams(max_rounds=5, early_stopping_rounds=5)
    )
    scores = evaluation.models["xgboost_p50"]
    assert scores["p90_coverage_uncalibrated"] < 0.8
    assert abs(scores["p90_coverage"] - 0.9) <= 0.04 and abs(scores["p50_coverage"] - 0.5) <= 0.05


def test_conformal_shifts_come_from_the_latest_inner_blocks() -> None:
    # A wide spell (σ 1.5 instead of 0.25) covers the oldest of the three inner blocks only (tasks at
    # 49–56 % of all: the training part is the first 70 %, the blocks its last three tenths). The test
    # part is narrow again. Calibrated on all three blocks, the spell widens the P90 shift and P90
    # covers every test task (1.0); calibrated on the latest two, as served, it lands near 0.9 (0.86).
    rng = np.random.default_rng(4)
    n = 3_000
    frame = pd.DataFrame({"gpus": rng.choice([1, 2, 8], n), "queue": rng.choice(["dev", "prod"], n)})
    base = np.where(frame["gpus"] == 8, 20_000.0, np.where(frame["gpus"] == 2, 2_000.0, 200.0))
    start = np.sort(rng.uniform(0, 30 * 86_400, n))
    spell = (np.arange(n) >= int(0.49 * n)) & (np.arange(n) < int(0.56 * n))
    end = start + base * np.exp(rng.normal(0.0, np.where(spell, 1.5, 0.25)))
    cfg = DurationConfig(key_cols=("gpus", "queue"), feature_cols=("gpus", "queue"))
    _, evaluation = evaluate_durations(frame, start, end, cfg, 0.7, FAST)
    scores = evaluation.models["xgboost_p50"]
    assert abs(scores["p90_coverage"] - 0.9) <= 0.05, scores["p90_coverage"]
    assert abs(scores["p50_coverage"] - 0.5) <= 0.05, scores["p50_coverage"]
