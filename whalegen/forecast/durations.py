"""Task duration at submission: P50 and P90 of the run time, from the request and the key's history.

Protocol (reference/forecasting.md §1.1, §3.1):

* Target: log(seconds), floored at 1 s. XGBoost with the quantile objective fits P50 and P90 in one
  model; P90 is lifted to P50 where the two cross, so P50 ≤ P90 always holds.
* Features are what the plane knows when the task is submitted: request columns (numbers as they are,
  text as category codes learned on the training part), the submission's hour and weekday, and the
  history of the task's key (the `key_cols`, e.g. tenant + profile key; on openb the request shape)
  made only of tasks that had **finished** by the submission time, plus how many tasks of the key
  were submitted in the previous hour (a burst of identical tasks is known at submission).
* Split by submission time. A training task must also have finished before the split: a running task's
  duration is not known to the plane then.
* Baselines: the global median of the training durations (baseline 2) and the key's history mean
  (baseline 4: mean seconds of the key's finished tasks, falling back to the global mean), plus the
  key's last-10 mean (baseline 3 with the key standing in for the user).
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import xgboost as xgb

from whalegen.forecast import metrics
from whalegen.forecast.store import dump_model, load_model, nthread_for

QUANTILES = (0.5, 0.9)
LAST_N = 10  # Alibaba's simulator uses the last 10 tasks (dur_mva), reference §2 baseline 3
BURST_WINDOW_S = 3_600
# Inner validation: the latest INNER_FOLDS blocks of INNER_FOLD_SHARE of the training tasks each.
INNER_FOLDS = 3
INNER_FOLD_SHARE = 0.1
# The conformal shifts come from the latest CALIBRATION_FOLDS of those blocks: durations drift (openb's
# running pods' median lifetime halves across the 0.7 split), and the oldest block's residuals pulled P50
# coverage off target (docs/forecasting.md §4.2).
CALIBRATION_FOLDS = 2

HISTORY_FEATURES = (
    "key_count",
    "key_mean_log",
    "key_last_log",
    "key_last10_mean_log",
    "key_std_log",
    "key_submitted_last_hour",
    "since_key_submit_s",
    "global_mean_log",
    "global_recent_mean_log",
    "key_running",
    "key_last10_median_log",
    "key_last3_mean_log",
    "key_ewm_log",
    "key_latest_submitted_log",
    "since_key_finish_s",
    "key_submitted_last_10s",
    "key_submitted_last_min",
    "key_submitted_last_10min",
    "key_burst_position",
    "key_oldest_running_age_s",
    "key_newest_running_age_s",
    "key_last10_std_log",
    # Known at submission, added for bursty traces (issue 16): identical submissions at the same
    # instant (one batch), the key's finishes in the last hour, and the key's running siblings that
    # have already outlived the key's recent typical duration (a censored hint that durations grew).
    "key_same_instant",
    "key_finished_last_hour",
    "key_running_over_ewm",
    "key_running_median_age_log",
)
# Submission calendar features: kept in the matrix (older envelopes name them) but not fitted by
# default: trace epochs are often undisclosed (openb), and on openb they fitted noise (docs §4.2).
CALENDAR_FEATURES = ("hour", "weekday")
# Rule predictors the fitted model may be blended with (log-seconds columns of the history).
BLEND_BASELINES = ("key_ewm_log", "key_last10_mean_log")
BLEND_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
# Recency weight of the key's exponentially weighted mean (per finish): the last task weighs 0.3.
EWM_ALPHA = 0.3
# Submissions of one key closer than this belong to one burst (identical pods submitted together).
BURST_GAP_S = 60.0
GLOBAL_RECENT_N = 50  # finishes of any key: tracks drift in the whole pool's durations


@dataclass(frozen=True)
class DurationConfig:
    key_cols: tuple[str, ...] = ()
    feature_cols: tuple[str, ...] = ()
    quantiles: tuple[float, ...] = QUANTILES


@dataclass(frozen=True)
class DurationParams:
    eta: float = 0.05
    max_depth: int = 3
    min_child_weight: float = 10.0
    max_rounds: int = 1_000
    early_stopping_rounds: int = 50


@dataclass
class _KeyState:
    count: int = 0
    sum_log: float = 0.0
    sum_sq_log: float = 0.0
    sum_s: float = 0.0
    last_log: float = math.nan
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=LAST_N))
    submits: deque[float] = field(default_factory=deque)
    running: int = 0  # submitted, not yet finished
    ewm_log: float = math.nan
    last_finish_s: float = math.nan
    latest_start_s: float = -math.inf  # submission time of the latest-submitted finished task
    latest_start_log: float = math.nan
    burst_position: int = 0
    running_starts: dict[int, float] = field(default_factory=dict)
    finishes: deque[float] = field(default_factory=deque)  # finish times within the last hour


def history_features(start_s: np.ndarray, end_s: np.ndarray, keys: Sequence[Any]) -> pd.DataFrame:
    """Leak-free key history for every task, in the order given.

    A task's history holds the tasks of the same key whose `end_s` ≤ its `start_s` (a zero-length
    task counts as finished just after the submissions at its own instant). Tasks with a NaN
    end (still running, or new submissions) never enter any history. Besides the features it returns
    the baseline inputs `key_mean_s` and `global_mean_s` (mean seconds, NaN before the first finish).
    """
    n = len(start_s)
    names = [*HISTORY_FEATURES, "key_mean_s", "global_mean_s"]
    same_instant = _same_instant(start_s, keys)
    col = {name: j for j, name in enumerate(names)}
    # 1. One event stream.
    times, kinds, idx, order = _events(start_s, end_s)
    out = np.full((n, len(names)), np.nan)
    states: dict[Any, _KeyState] = {}
    plane = _GlobalState()
    # 2. Walk the events; a submission reads the state, a finish updates it.
    for e in order:
        i = int(idx[e])
        if times[e] == np.inf:
            break  # only never-finished tasks remain
        state = states.setdefault(keys[i], _KeyState())
        if kinds[e] != 1:
            _finish(state, plane, i, start_s[i], end_s[i])
            continue
        t = start_s[i]
        row = out[i]
        _submission_row(row, col, state, plane, t)
        row[col["key_same_instant"]] = same_instant[i]
        state.submits.append(t)
        state.running += 1
        state.running_starts[i] = t
    return pd.DataFrame(out, columns=names)


@dataclass
class _GlobalState:
    """Every key's finishes together: what a task of a key without history falls back on."""

    count: int = 0
    sum_log: float = 0.0
    sum_s: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=GLOBAL_RECENT_N))


def _same_instant(start_s: np.ndarray, keys: Sequence[Any]) -> np.ndarray:
    """Per task, how many tasks of its key were submitted at its instant: identical submissions arriving
    at one instant are one batch, known together at submission."""
    if not len(start_s):
        return np.zeros(0)
    sizes: np.ndarray = (
        pd.DataFrame({"k": pd.Series(list(keys), dtype=object).astype(str), "t": start_s})
        .groupby(["k", "t"], dropna=False)["t"]
        .transform("size")
        .to_numpy(np.float64)
    )
    return sizes


def _events(start_s: np.ndarray, end_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every task's finish and submission as one stream: times, kinds (0 and 2 finish, 1 submits), task
    indexes, and the order to walk them in. Finishes sort before submissions at the same instant
    (finished = known), except a zero-length task's own finish, which must not precede its own
    submission; a task that never finished ends at infinity."""
    n = len(start_s)
    ends = np.where(np.isnan(end_s), np.inf, end_s)
    times = np.concatenate([ends, start_s])
    finish_kind = np.where(ends <= start_s, 2, 0).astype(np.int8)
    kinds = np.concatenate([finish_kind, np.ones(n, dtype=np.int8)])
    idx = np.concatenate([np.arange(n), np.arange(n)])
    return times, kinds, idx, np.lexsort((kinds, times))


def _finish(state: _KeyState, plane: _GlobalState, i: int, start_s: float, end_s: float) -> None:
    """Task `i` of the key finished: its duration enters the key's and the global history."""
    dur_s = max(end_s - start_s, 1.0)
    log_d = math.log(dur_s)
    state.count += 1
    state.sum_log += log_d
    state.sum_sq_log += log_d * log_d
    state.sum_s += dur_s
    state.last_log = log_d
    state.recent.append(log_d)
    state.running -= 1
    state.running_starts.pop(i, None)
    state.ewm_log = (
        log_d if math.isnan(state.ewm_log) else EWM_ALPHA * log_d + (1 - EWM_ALPHA) * state.ewm_log
    )
    state.last_finish_s = end_s
    state.finishes.append(end_s)
    if start_s >= state.latest_start_s:
        state.latest_start_s, state.latest_start_log = start_s, log_d
    plane.recent.append(log_d)
    plane.count, plane.sum_log, plane.sum_s = plane.count + 1, plane.sum_log + log_d, plane.sum_s + dur_s


def _submission_row(
    row: np.ndarray, col: dict[str, int], state: _KeyState, plane: _GlobalState, t: float
) -> None:
    """A task of the key is submitted at `t`: fill its row from the history as it stands (the task's own
    submission is added afterwards). Submissions and finishes older than an hour leave the windows."""
    while state.submits and state.submits[0] < t - BURST_WINDOW_S:
        state.submits.popleft()
    row[col["key_count"]] = state.count
    if state.count:
        _key_finished_row(row, col, state, t)
    row[col["key_submitted_last_hour"]] = len(state.submits)
    row[col["since_key_submit_s"]] = t - state.submits[-1] if state.submits else np.nan
    recent = np.asarray(state.submits, dtype=np.float64)
    row[col["key_submitted_last_10s"]] = int(np.sum(recent >= t - 10.0))
    row[col["key_submitted_last_min"]] = int(np.sum(recent >= t - 60.0))
    row[col["key_submitted_last_10min"]] = int(np.sum(recent >= t - 600.0))
    in_burst = bool(state.submits) and t - state.submits[-1] <= BURST_GAP_S
    state.burst_position = state.burst_position + 1 if in_burst else 0
    row[col["key_burst_position"]] = state.burst_position
    while state.finishes and state.finishes[0] < t - BURST_WINDOW_S:
        state.finishes.popleft()
    row[col["key_finished_last_hour"]] = len(state.finishes)
    if state.running_starts:
        ages = t - np.fromiter(state.running_starts.values(), dtype=np.float64)
        row[col["key_oldest_running_age_s"]] = float(ages.max())
        row[col["key_newest_running_age_s"]] = float(ages.min())
        row[col["key_running_median_age_log"]] = math.log(max(float(np.median(ages)), 1.0))
        if state.count:
            row[col["key_running_over_ewm"]] = int(np.sum(ages > math.exp(state.ewm_log)))
    if plane.count:
        row[col["global_mean_log"]] = plane.sum_log / plane.count
        row[col["global_recent_mean_log"]] = float(np.mean(plane.recent))
        row[col["global_mean_s"]] = plane.sum_s / plane.count
    row[col["key_running"]] = state.running


def _key_finished_row(row: np.ndarray, col: dict[str, int], state: _KeyState, t: float) -> None:
    """The features of a key with finished tasks: their log-duration statistics and the latest finish."""
    mean = state.sum_log / state.count
    row[col["key_mean_log"]] = mean
    row[col["key_last_log"]] = state.last_log
    row[col["key_last10_mean_log"]] = float(np.mean(state.recent))
    row[col["key_last10_median_log"]] = float(np.median(state.recent))
    row[col["key_last10_std_log"]] = float(np.std(state.recent))
    row[col["key_last3_mean_log"]] = float(np.mean(list(state.recent)[-3:]))
    row[col["key_ewm_log"]] = state.ewm_log
    row[col["key_latest_submitted_log"]] = state.latest_start_log
    row[col["since_key_finish_s"]] = t - state.last_finish_s
    row[col["key_std_log"]] = math.sqrt(max(state.sum_sq_log / state.count - mean * mean, 0.0))
    row[col["key_mean_s"]] = state.sum_s / state.count


def _calendar(start_s: np.ndarray) -> pd.DataFrame:
    # Traces count seconds from an undisclosed origin; hour and weekday are then relative, but a daily
    # or weekly cycle still shows as a fixed phase.
    return pd.DataFrame({"hour": (start_s % 86_400) / 3_600.0, "weekday": (start_s // 86_400) % 7})


@dataclass(eq=False)
class DurationModel:
    config: DurationConfig
    feature_names: tuple[str, ...]
    categories: dict[str, list[str]]
    booster: xgb.Booster
    global_median_s: float
    n_train: int
    # Final P50 (log) = w · model + (1 − w) · rule, both chosen on the inner time-ordered validation
    # (w = 0 falls back to the rule; w = 1 is the model alone). Quantiles above P50 shift with it.
    blend_weight: float = 1.0
    blend_baseline: str = "key_last10_mean_log"
    # Split-conformal shift per quantile (log-seconds), from the time-ordered inner blocks: served
    # quantile q = fitted q + shift_q, so that a share q of the held-out tasks lay at or below it.
    conformal_log: tuple[float, ...] = ()

    @property
    def chosen(self) -> str:
        if self.blend_weight >= 1.0:
            return "xgboost"
        if self.blend_weight <= 0.0:
            return f"baseline {self.blend_baseline}"
        return f"blend {self.blend_weight:g} xgboost + {1 - self.blend_weight:g} {self.blend_baseline}"

    def to_bytes(self) -> bytes:
        meta = {
            "blend_weight": self.blend_weight,
            "blend_baseline": self.blend_baseline,
            "conformal_log": list(self.conformal_log),
            "key_cols": list(self.config.key_cols),
            "feature_cols": list(self.config.feature_cols),
            "quantiles": list(self.config.quantiles),
            "feature_names": list(self.feature_names),
            "categories": self.categories,
            "global_median_s": self.global_median_s,
            "n_train": self.n_train,
        }
        return dump_model("duration", meta, {"quantiles": self.booster})

    @classmethod
    def from_bytes(cls, blob: bytes) -> DurationModel:
        env = load_model(blob, "duration")
        m = env.meta
        cfg = DurationConfig(tuple(m["key_cols"]), tuple(m["feature_cols"]), tuple(m["quantiles"]))
        return cls(
            cfg,
            tuple(m["feature_names"]),
            {k: list(v) for k, v in m["categories"].items()},
            env.boosters["quantiles"],
            float(m["global_median_s"]),
            int(m["n_train"]),
            float(m.get("blend_weight", 1.0)),
            str(m.get("blend_baseline", "key_last10_mean_log")),
            tuple(float(v) for v in m.get("conformal_log", [])),
        )


def task_keys(frame: pd.DataFrame, key_cols: Sequence[str]) -> list[Any]:
    if not key_cols:
        return [()] * len(frame)
    return list(frame[list(key_cols)].astype(str).itertuples(index=False, name=None))


def _request_features(
    frame: pd.DataFrame, cols: Sequence[str], categories: dict[str, list[str]]
) -> pd.DataFrame:
    out = {}
    for c in cols:
        if c in categories:
            lookup = {v: i for i, v in enumerate(categories[c])}
            out[c] = frame[c].astype(str).map(lookup).astype(np.float64)
        else:
            out[c] = pd.to_numeric(frame[c], errors="coerce").astype(np.float64)
    return pd.DataFrame(out, index=frame.index)


def _categories_of(frame: pd.DataFrame, cols: Sequence[str]) -> dict[str, list[str]]:
    return {
        c: sorted(frame[c].astype(str).unique().tolist())
        for c in cols
        if not pd.api.types.is_numeric_dtype(frame[c])
    }


def _matrix(
    frame: pd.DataFrame,
    hist: pd.DataFrame,
    start_s: np.ndarray,
    cfg: DurationConfig,
    cats: dict[str, list[str]],
) -> pd.DataFrame:
    req_cols = list(dict.fromkeys([*cfg.feature_cols, *cfg.key_cols]))
    parts = [
        _request_features(frame, req_cols, cats).reset_index(drop=True),
        _calendar(start_s),
        hist[list(HISTORY_FEATURES)].reset_index(drop=True),
    ]
    return pd.concat(parts, axis=1)


def rule_log(x: pd.DataFrame, column: str, fallback_s: float) -> np.ndarray:
    """A key-history rule in log-seconds: `column` of the key, else the pool's recent mean, else the
    training median."""
    rule = x[column].fillna(x["global_recent_mean_log"]).fillna(math.log(fallback_s))
    return np.asarray(rule.to_numpy(np.float64))


def anchor_log(x: pd.DataFrame, fallback_s: float) -> np.ndarray:
    """Where the model starts from, in log-seconds: the key's recency-weighted mean (the best single
    rule on openb), else the pool's recent mean, else the training median. The trees learn
    corrections to it, so a key with history is never predicted worse than its own recent record
    unless the training data says so."""
    return rule_log(x, "key_ewm_log", fallback_s)


def _dmatrix(
    x: pd.DataFrame, names: Sequence[str], fallback_s: float, n_q: int, y: np.ndarray | None = None
) -> xgb.DMatrix:
    margin = np.repeat(anchor_log(x, fallback_s)[:, None], n_q, axis=1)
    data = x[list(names)].to_numpy(np.float32)
    return xgb.DMatrix(data, label=y, base_margin=margin, nthread=nthread_for(len(data)))


def _fit_quantiles(
    x: pd.DataFrame,
    y_log: np.ndarray,
    quantiles: Sequence[float],
    fallback_s: float,
    hp: DurationParams,
    log: bool,
) -> tuple[xgb.Booster, float, str, tuple[float, ...]]:
    """Fit the quantiles; return the booster, the blend (weight, rule) chosen on the inner split and
    the conformal shift of each quantile calibrated on the same held-out blocks."""
    params: dict[str, Any] = {
        "objective": "reg:quantileerror",
        "quantile_alpha": np.asarray(quantiles),
        "eta": hp.eta,
        "max_depth": hp.max_depth,
        "min_child_weight": hp.min_child_weight,
        "subsample": 0.8,
        "colsample_bytree": 0.8,
        "nthread": nthread_for(len(x)),
        "seed": 0,
    }
    names, n_q = list(x.columns), len(quantiles)
    # 1. Rolling-origin inner validation on the latest training tasks (time-ordered): each fold fits
    #    on everything before its block and picks its rounds on the block. One block alone (3 days
    #    of openb) chose the blend on noise; pooled blocks are steadier.
    rounds_seen: list[int] = []
    inner_pred: list[np.ndarray] = []
    inner_idx: list[np.ndarray] = []
    n = len(x)
    for k in range(INNER_FOLDS, 0, -1):
        lo, hi = int(n * (1.0 - k * INNER_FOLD_SHARE)), int(n * (1.0 - (k - 1) * INNER_FOLD_SHARE))
        if lo < 20 or hi - lo < 5:
            continue
        probe = xgb.train(
            params,
            _dmatrix(x.iloc[:lo], names, fallback_s, n_q, y_log[:lo]),
            num_boost_round=hp.max_rounds,
            evals=[(_dmatrix(x.iloc[lo:hi], names, fallback_s, n_q, y_log[lo:hi]), "val")],
            early_stopping_rounds=hp.early_stopping_rounds,
            verbose_eval=False,
        )
        r = int(probe.best_iteration) + 1
        rounds_seen.append(r)
        got = probe.predict(_dmatrix(x.iloc[lo:hi], names, fallback_s, n_q), iteration_range=(0, r))
        inner_pred.append(np.asarray(got, dtype=np.float64).reshape(hi - lo, -1))
        inner_idx.append(np.arange(lo, hi))
    if not rounds_seen:
        raise ValueError(f"only {n} training tasks: too few for an inner validation")
    rounds = int(np.median(rounds_seen))
    # 2. Blend with a key-history rule: the weight and rule with the lowest pooled log-MAE on the
    #    held-out blocks (ties go to the lower weight). The model has to earn its weight.
    held = np.concatenate(inner_idx)
    val, inner_q, y_val = x.iloc[held], np.concatenate(inner_pred), y_log[held]
    inner = inner_q[:, 0]
    best = (math.inf, 1.0, BLEND_BASELINES[0])
    for rule in BLEND_BASELINES:
        base = rule_log(val, rule, fallback_s)
        for w in BLEND_WEIGHTS:
            err = float(np.mean(np.abs(w * inner + (1.0 - w) * base - y_val)))
            if err < best[0] - 1e-9:
                best = (err, w, rule)
    _, weight, rule = best
    # 3. Conformal calibration of every served quantile on the latest held-out blocks.
    served = _blend(inner_q, val, weight, rule, fallback_s)
    recent = sum(len(i) for i in inner_idx[-CALIBRATION_FOLDS:])
    shifts = conformal_shifts(y_val[-recent:], served[-recent:], quantiles)
    if log:
        print(
            f"forecast: duration model, {rounds} rounds (folds: {rounds_seen}) on {len(held)} held-out "
            f"tasks; blend weight {weight:g} with {rule} (inner log-MAE {best[0]:.4f}); conformal "
            f"shifts on the latest {recent} tasks "
            + ", ".join(f"P{q * 100:g} {c:+.3f}" for q, c in zip(quantiles, shifts, strict=True)),
            file=sys.stderr,
        )
    # 4. Refit on every training task.
    booster = xgb.train(params, _dmatrix(x, names, fallback_s, n_q, y_log), num_boost_round=rounds)
    return booster, weight, rule, shifts


def conformal_shifts(
    y_log: np.ndarray, pred_log: np.ndarray, quantiles: Sequence[float]
) -> tuple[float, ...]:
    """Split-conformal shift per quantile: the smallest c with at least ⌈(n + 1) q⌉ of the n held-out
    residuals y − pred_q at or below c, so that P(y ≤ pred_q + c) ≥ q for a new exchangeable task."""
    n = len(y_log)
    out = []
    for j, q in enumerate(quantiles):
        residual = np.sort(y_log - pred_log[:, j])
        rank = min(max(math.ceil((n + 1) * q), 1), n)
        out.append(float(residual[rank - 1]))
    return tuple(out)


def _blend(raw: np.ndarray, x: pd.DataFrame, weight: float, rule: str, fallback_s: float) -> np.ndarray:
    """Served log-quantiles before calibration: P50 = w · model + (1 − w) · rule, the others shift with it."""
    if weight >= 1.0:
        return raw
    shift = (1.0 - weight) * (rule_log(x, rule, fallback_s) - raw[:, 0])
    return np.asarray(raw + shift[:, None], dtype=np.float64)


def predict_quantiles_s(model: DurationModel, x: pd.DataFrame) -> np.ndarray:
    """(n, q) predicted seconds; columns sorted so a higher quantile is never below a lower one."""
    n_q = len(model.config.quantiles)
    d = _dmatrix(x, model.feature_names, model.global_median_s, n_q)
    raw = np.asarray(model.booster.predict(d), dtype=np.float64).reshape(len(x), -1)
    raw = _blend(raw, x, model.blend_weight, model.blend_baseline, model.global_median_s)
    if model.conformal_log:
        raw = raw + np.asarray(model.conformal_log)[None, :]
    return np.asarray(np.exp(np.maximum.accumulate(raw, axis=1)), dtype=np.float64)


def train_durations(
    frame: pd.DataFrame,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cfg: DurationConfig,
    split_s: float,
    hp: DurationParams | None = None,
    *,
    log: bool = False,
) -> tuple[DurationModel, pd.DataFrame]:
    """Fit on tasks submitted and finished before `split_s`. Returns the model and the full feature
    matrix of every task (history built with only the finishes known at each submission)."""
    keys = task_keys(frame, cfg.key_cols)
    hist = history_features(start_s, end_s, keys)
    train_mask = (start_s < split_s) & (end_s <= split_s)
    cats = _categories_of(frame[train_mask], [c for c in dict.fromkeys([*cfg.feature_cols, *cfg.key_cols])])
    x_all = _matrix(frame, hist, start_s, cfg, cats)
    order = np.argsort(start_s[train_mask], kind="mergesort")
    fitted = [c for c in x_all.columns if c not in CALENDAR_FEATURES]
    x = x_all[train_mask].iloc[order].reset_index(drop=True)[fitted]
    dur = np.maximum(end_s[train_mask] - start_s[train_mask], 1.0)[order]
    if len(x) < 50:
        raise ValueError(f"only {len(x)} finished tasks before the split: need at least 50")
    median_s = float(np.median(dur))
    booster, weight, rule, shifts = _fit_quantiles(
        x, np.log(dur), cfg.quantiles, median_s, hp or DurationParams(), log
    )
    model = DurationModel(cfg, tuple(fitted), cats, booster, median_s, len(x), weight, rule, shifts)
    return model, pd.concat([x_all, hist[["key_mean_s", "global_mean_s"]]], axis=1)


def predict_durations(
    model: DurationModel,
    tasks: pd.DataFrame,
    tasks_start_s: np.ndarray,
    finished: pd.DataFrame,
    finished_start_s: np.ndarray,
    finished_end_s: np.ndarray,
) -> np.ndarray:
    """P50/P90 seconds ((n, 2)) for new `tasks`, with key history from the `finished` tasks."""
    cfg = model.config
    both = pd.concat([finished, tasks], ignore_index=True)
    start = np.concatenate([finished_start_s, tasks_start_s]).astype(np.float64)
    end = np.concatenate([finished_end_s, np.full(len(tasks), np.nan)]).astype(np.float64)
    hist = history_features(start, end, task_keys(both, cfg.key_cols))
    x = _matrix(both, hist, start, cfg, model.categories).iloc[len(finished) :]
    return predict_quantiles_s(model, x.reset_index(drop=True))


def duration_scores(actual_s: np.ndarray, p50_s: np.ndarray) -> dict[str, float]:
    return {
        **metrics.relative_error_buckets(actual_s, p50_s),
        "log_mae": metrics.log_mae(actual_s, p50_s),
        "median_ape_pct": metrics.median_ape(actual_s, p50_s),
        "spearman": metrics.spearman(actual_s, p50_s),
    }


@dataclass(frozen=True)
class DurationEvaluation:
    split_s: float
    n_train: int
    n_test: int
    models: dict[str, dict[str, float]]
    cold_start: dict[str, dict[str, float]]
    chosen: str = "xgboost"
    # Hindsight diagnostics, not forecasts: what a predictor that knew each key's test-period median
    # (or the duration of the key's previous submission, finished or not) would score.
    oracles: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "oracles": self.oracles,
            "split_s": self.split_s,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "models": self.models,
            "cold_start_keys": self.cold_start,
            "helios_bar": dict(
                zip(
                    [f"within_{round(b * 100)}pct" for b in metrics.DURATION_BUCKETS],
                    metrics.HELIOS_BUCKET_BAR,
                    strict=True,
                )
            ),
        }


def evaluate_durations(
    frame: pd.DataFrame,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cfg: DurationConfig,
    split_frac: float = 0.7,
    hp: DurationParams | None = None,
    *,
    log: bool = False,
) -> tuple[DurationModel, DurationEvaluation]:
    """Split by submission time at the `split_frac` quantile of tasks; score on the later tasks."""
    start_s = np.asarray(start_s, dtype=np.float64)
    end_s = np.asarray(end_s, dtype=np.float64)
    # The split is a quantile of the tasks that have a submission time (a NaN start is no task).
    known = np.sort(start_s[np.isfinite(start_s)], kind="mergesort")
    if len(known) < 2:
        raise ValueError(f"only {len(known)} tasks with a submission time: nothing to split")
    split_s = float(known[min(int(len(known) * split_frac), len(known) - 1)])
    model, feats = train_durations(frame, start_s, end_s, cfg, split_s, hp, log=log)
    test = (start_s >= split_s) & ~np.isnan(end_s)
    actual = np.maximum(end_s[test] - start_s[test], 1.0)
    pred = predict_quantiles_s(model, feats[test].reset_index(drop=True))
    fallback = feats["global_mean_s"].fillna(model.global_median_s)[test].to_numpy()
    key_mean = feats["key_mean_s"][test].fillna(pd.Series(fallback, index=feats[test].index)).to_numpy()
    key_last10 = np.exp(feats["key_last10_mean_log"][test].to_numpy())
    key_last10 = np.where(np.isnan(key_last10), model.global_median_s, key_last10)

    def rule_s(column: str) -> np.ndarray:
        values = np.exp(feats[column][test].to_numpy())
        return np.where(np.isnan(values), model.global_median_s, values)

    preds = {
        "xgboost_p50": pred[:, 0],
        "global_median": np.full(len(actual), model.global_median_s),
        "key_history_mean": key_mean,
        "key_last10_geomean": key_last10,
        "key_last10_median": rule_s("key_last10_median_log"),
        "key_recent_ewm": rule_s("key_ewm_log"),
    }
    models = {name: duration_scores(actual, p) for name, p in preds.items()}
    models["xgboost_p50"]["p90_coverage"] = float(np.mean(actual <= pred[:, -1]))
    models["xgboost_p50"]["p50_coverage"] = float(np.mean(actual <= pred[:, 0]))
    # The same model before its conformal shift: what the calibration changed.
    raw = predict_quantiles_s(replace(model, conformal_log=()), feats[test].reset_index(drop=True))
    models["xgboost_p50"]["p90_coverage_uncalibrated"] = float(np.mean(actual <= raw[:, -1]))
    models["xgboost_p50"]["p50_coverage_uncalibrated"] = float(np.mean(actual <= raw[:, 0]))
    models["xgboost_p50"]["blend_weight"] = model.blend_weight
    cold = feats["key_count"][test].to_numpy() == 0
    cold_scores = {
        name: {**duration_scores(actual[cold], p[cold]), "n": int(cold.sum())} for name, p in preds.items()
    }
    for scores in models.values():
        scores["n"] = len(actual)
    oracles = _oracles(
        actual, start_s[test], [k for k, t in zip(task_keys(frame, cfg.key_cols), test, strict=True) if t]
    )
    return model, DurationEvaluation(
        split_s, model.n_train, len(actual), models, cold_scores, model.chosen, oracles
    )


def _oracles(actual_s: np.ndarray, start_s: np.ndarray, keys: Sequence[Any]) -> dict[str, dict[str, float]]:
    """Upper references for what key history can give on the test tasks, using their *actual*
    durations: the key's median over the test period, and the previous test submission of the key."""
    frame = pd.DataFrame({"key": list(keys), "t": start_s, "d": actual_s}).sort_values("t", kind="mergesort")
    median = frame.groupby("key")["d"].transform("median").to_numpy()
    previous = frame.groupby("key")["d"].shift(1)
    has_prev = previous.notna().to_numpy()
    out = {"key_test_median": {**duration_scores(frame["d"].to_numpy(), median), "n": len(frame)}}
    if has_prev.any():
        d = frame["d"].to_numpy()[has_prev]
        out["key_previous_task"] = {
            **duration_scores(d, previous.to_numpy()[has_prev]),
            "n": int(has_prev.sum()),
        }
    return out
