"""Pool-level series forecasting: idle/pending GPUs, active nodes, arrivals — h minutes ahead.

Protocol (reference/forecasting.md §3.3, §3.5):

* The raw samples are binned on a regular grid (`bin_s`). The default aggregation is the **maximum**
  of each bin, as in Helios' CES node-demand forecaster (10-minute maxima of active nodes): a pool
  sized for the peak of the next bin is the question capacity planning asks. `mean` is offered for
  level-type series; `bin_s` equal to the sampling step keeps the raw samples.
* Every row is a forecast *origin* `o`; its target is the binned value at `o + horizon`. Every feature
  is computed from bins at or before `o`, so each feature is lagged by at least the horizon.
* The model (XGBoost, absolute-error objective) predicts the *change* from the last value, so its
  natural fallback is persistence and one model can serve pools of very different sizes.
* Baselines on the same rows: persistence (value at `o`), same slot yesterday (value at
  `o + horizon − 1 day`, persistence where that bin is missing) and the recent-window mean (mean of the
  bins in `(o − window, o]`).
* The split is by the *target* time: training rows have targets before `split_at`, test rows at or
  after it (and before `test_until` when given).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd
import xgboost as xgb

from whalegen.forecast import metrics
from whalegen.forecast.store import dump_model, load_model, nthread_for

DAY_S = 86_400
WEEK_S = 7 * DAY_S
# Rows used to fit one model at most. Minute-level origins next to each other are nearly the same
# example; a uniform stride over the training window keeps fitting to tens of seconds on 2 cores.
MAX_TRAIN_ROWS = 250_000
# Share of the training window (its latest part) held out to pick the number of boosting rounds.
EARLY_STOP_SHARE = 0.15
# The model serves only if its inner-validation MAE is this much (relative) below the best
# baseline's: a 0.03 % "win" there (Helios, 10-minute bins, 60 min ahead) was a loss on the test week.
MIN_INNER_GAIN = 0.001


class Aggregation(StrEnum):
    MAX = "max"
    MEAN = "mean"
    SUM = "sum"  # counts per bin (arrivals): an empty bin is 0, not missing


@dataclass(frozen=True)
class SeriesConfig:
    horizon_s: int = 3_600
    bin_s: int = 600
    agg: Aggregation = Aggregation.MAX
    window_s: int = 3_600  # recent-window mean baseline: the last hour (reference §2, baseline 5)

    def __post_init__(self) -> None:
        if self.bin_s <= 0 or self.horizon_s <= 0:
            raise ValueError("bin and horizon must be positive")
        if self.horizon_s % self.bin_s:
            raise ValueError(f"horizon {self.horizon_s}s is not a whole number of {self.bin_s}s bins")
        if self.horizon_s > DAY_S:
            raise ValueError("horizons above one day would make 'same slot yesterday' look ahead")

    @property
    def horizon_bins(self) -> int:
        return self.horizon_s // self.bin_s

    def bins(self, seconds: int) -> int:
        return max(1, round(seconds / self.bin_s))


@dataclass(frozen=True)
class XgbParams:
    # Shallow, heavily regularised trees: pool series are step functions whose changes are mostly
    # noise; deeper trees (6–8) fitted the training weeks and lost to persistence on the test week.
    max_rounds: int = 400
    eta: float = 0.1
    max_depth: int = 4
    # Minimum rows per leaf as a share of the training rows (hessian is 1 per row for absolute
    # error), clipped to [10, 200] so small series (weeks of 10-minute bins) still split.
    min_leaf_share: float = 0.001
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    early_stopping_rounds: int = 40


def bin_series(times: pd.Series, values: pd.Series, bin_s: int, agg: Aggregation) -> pd.Series:
    """Regular grid from the first to the last sample; bins without samples are NaN (gaps stay gaps)."""
    frame = pd.DataFrame({"t": pd.to_datetime(times).to_numpy(), "v": pd.to_numeric(values).to_numpy()})
    frame = frame.dropna(subset=["t"]).set_index("t").sort_index()
    binned = frame["v"].resample(f"{bin_s}s").agg(agg.value)
    return binned.astype(np.float64)


def _feature_frame(y: pd.Series, cfg: SeriesConfig, scale: float) -> pd.DataFrame:
    """Features at every origin of the regular series `y`, from bins at or before the origin only."""
    h = cfg.horizon_bins
    last = y
    out: dict[str, pd.Series] = {"last_frac": last / scale, "scale": pd.Series(scale, index=y.index)}
    lag_bins = sorted(
        {cfg.bins(s) for s in (0, 1_200, 1_800, 3_600, 7_200, 10_800, 21_600, 43_200)} | {1, 2, 3}
    )
    for k in lag_bins:
        out[f"lag{k}_minus_last"] = y.shift(k) - last
    for w_s in (3_600, 6 * 3_600, DAY_S):
        w = cfg.bins(w_s)
        roll = y.rolling(w, min_periods=1)
        out[f"mean{w_s}s_minus_last"] = roll.mean() - last
        out[f"max{w_s}s_minus_last"] = roll.max() - last
        out[f"min{w_s}s_minus_last"] = roll.min() - last
        out[f"std{w_s}s"] = roll.std()
    # Seasonal lags at the *target* slot: o + h − period ≤ o because h ≤ one day.
    for name, period_s in (("day", DAY_S), ("week", WEEK_S)):
        p = cfg.bins(period_s)
        at_target = y.shift(p - h)
        out[f"{name}_target_minus_last"] = at_target - last
        out[f"{name}_change"] = at_target - y.shift(p)
    target_time = y.index + pd.Timedelta(seconds=cfg.horizon_s)
    out["target_hour"] = pd.Series(target_time.hour + target_time.minute / 60.0, index=y.index)
    out["target_weekday"] = pd.Series(target_time.day_of_week, index=y.index, dtype=np.float64)
    return pd.DataFrame(out)


def build_rows(y: pd.Series, cfg: SeriesConfig, scale: float) -> pd.DataFrame:
    """One row per origin: features, target, and the three baselines. `y` must be on a regular grid."""
    h = cfg.horizon_bins
    feats = _feature_frame(y, cfg, scale)
    rows = feats.copy()
    rows["origin"] = y.index
    rows["target_time"] = y.index + pd.Timedelta(seconds=cfg.horizon_s)
    rows["last"] = y
    rows["target"] = y.shift(-h)
    yesterday = y.shift(cfg.bins(DAY_S) - h)
    rows["base_persistence"] = y
    rows["base_same_slot_yesterday"] = yesterday.fillna(y)
    rows["base_window_mean"] = y.rolling(cfg.bins(cfg.window_s), min_periods=1).mean().fillna(y)
    return rows.reset_index(drop=True)


BASELINES = ("persistence", "same_slot_yesterday", "window_mean")


@dataclass(eq=False)
class SeriesModel:
    config: SeriesConfig
    feature_names: tuple[str, ...]
    booster: xgb.Booster
    scales: dict[str, float]
    trained_until: str
    n_train: int
    # Counts (GPUs, nodes, jobs) are integers: the MAE-optimal forecast (a conditional median) of an
    # integer quantity is an integer, and rounding stops sMAPE charging 200 % for 0.2 against 0.
    integer_valued: bool = False
    # What serves: "xgboost" (the fitted change model) or a baseline name from BASELINES, chosen on
    # the inner time-ordered validation; `objective` is the fitted model's loss.
    chosen: str = "xgboost"
    objective: str = "reg:absoluteerror"
    inner_mae: dict[str, float] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        cfg = asdict(self.config)
        meta = {
            "chosen": self.chosen,
            "objective": self.objective,
            "inner_mae": self.inner_mae,
            "config": cfg,
            "feature_names": list(self.feature_names),
            "scales": self.scales,
            "trained_until": self.trained_until,
            "n_train": self.n_train,
            "integer_valued": self.integer_valued,
        }
        return dump_model("series", meta, {"delta": self.booster})

    @classmethod
    def from_bytes(cls, blob: bytes) -> SeriesModel:
        env = load_model(blob, "series")
        raw = dict(env.meta["config"])
        raw["agg"] = Aggregation(raw["agg"])
        return cls(
            config=SeriesConfig(**raw),
            feature_names=tuple(env.meta["feature_names"]),
            booster=env.boosters["delta"],
            scales={k: float(v) for k, v in env.meta["scales"].items()},
            trained_until=env.meta["trained_until"],
            n_train=int(env.meta["n_train"]),
            integer_valued=bool(env.meta["integer_valued"]),
            chosen=str(env.meta.get("chosen", "xgboost")),
            objective=str(env.meta.get("objective", "reg:absoluteerror")),
            inner_mae={k: float(v) for k, v in env.meta.get("inner_mae", {}).items()},
        )


def _scale_of(y: pd.Series) -> float:
    """Size of a pool as seen in training: its largest value (a capacity proxy), at least 1."""
    top = float(np.nanmax(y.to_numpy())) if y.notna().any() else 1.0
    return max(1.0, top)


def _booster_params(objective: str, extra: Mapping[str, float], n: int, params: XgbParams) -> dict[str, Any]:
    return {
        "objective": objective,
        **extra,
        "eta": params.eta,
        "max_depth": params.max_depth,
        "min_child_weight": float(np.clip(n * params.min_leaf_share, 10.0, 200.0)),
        "subsample": params.subsample,
        "colsample_bytree": params.colsample_bytree,
        "nthread": nthread_for(n),
        "seed": 0,
    }


def _objectives(delta: np.ndarray, integer_valued: bool) -> list[tuple[str, dict[str, float]]]:
    """Losses tried for the change model. Absolute error is the metric's own loss, but on step series
    most changes are exactly 0 and its gradient vanishes there (the early stop then keeps one round).
    Pseudo-Huber has gradients everywhere; its slope is half a unit for counts (the rounding
    threshold) and a tenth of the typical non-zero change otherwise."""
    moving = np.abs(delta[delta != 0])
    typical = float(np.median(moving)) if moving.size else 1.0
    slope = 0.5 if integer_valued else max(0.1 * typical, 1e-6)
    return [("reg:absoluteerror", {}), ("reg:pseudohubererror", {"huber_slope": slope})]


def _fit(
    x: np.ndarray,
    delta: np.ndarray,
    params: XgbParams,
    objective: str,
    extra: Mapping[str, float],
) -> tuple[xgb.Booster, int, np.ndarray]:
    """Probe on the earlier part of the training window, early-stopped on its latest part; return the
    probe, its rounds and its predicted change on that held-out part."""
    cut = int(len(x) * (1.0 - EARLY_STOP_SHARE))
    booster_params = _booster_params(objective, extra, len(x), params)
    dval = xgb.DMatrix(x[cut:], label=delta[cut:])
    probe = xgb.train(
        booster_params,
        xgb.DMatrix(x[:cut], label=delta[:cut]),
        num_boost_round=params.max_rounds,
        evals=[(dval, "val")],
        early_stopping_rounds=params.early_stopping_rounds,
        verbose_eval=False,
    )
    rounds = int(probe.best_iteration) + 1
    held = np.asarray(probe.predict(dval, iteration_range=(0, rounds)), dtype=np.float64)
    return probe, rounds, held


@dataclass(frozen=True)
class SeriesEvaluation:
    config: SeriesConfig
    split_at: str
    test_until: str | None
    n_train: int
    n_test: int
    rounds: int
    models: dict[str, dict[str, float]]
    per_series: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    chosen: str = "xgboost"
    objective: str = "reg:absoluteerror"
    inner_mae: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "objective": self.objective,
            "inner_mae": self.inner_mae,
            "config": {**asdict(self.config), "agg": self.config.agg.value},
            "split_at": self.split_at,
            "test_until": self.test_until,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "xgboost_rounds": self.rounds,
            "models": self.models,
            "per_series": self.per_series,
        }


def _all_rows(
    series: Mapping[str, pd.Series], cfg: SeriesConfig, scales: Mapping[str, float]
) -> pd.DataFrame:
    parts = []
    for name, y in series.items():
        rows = build_rows(y, cfg, scales[name])
        rows["series"] = name
        parts.append(rows)
    return pd.concat(parts, ignore_index=True)


def train_series(
    series: Mapping[str, pd.Series],
    cfg: SeriesConfig,
    split_at: pd.Timestamp,
    params: XgbParams | None = None,
    *,
    log: bool = False,
) -> SeriesModel:
    """Fit one model over every series (binned, regular grid) on targets strictly before `split_at`."""
    params = params or XgbParams()
    # 1. Scale each pool by what was visible before the split only.
    scales = {name: _scale_of(y[y.index < split_at]) for name, y in series.items()}
    rows = _all_rows(series, cfg, scales)
    # 2. Training rows: known target before the split, known value at the origin.
    train = rows[(rows["target_time"] < split_at) & rows["target"].notna() & rows["last"].notna()]
    train = train.sort_values("target_time", kind="mergesort")
    if len(train) > MAX_TRAIN_ROWS:
        train = train.iloc[:: math.ceil(len(train) / MAX_TRAIN_ROWS)]
    if len(train) < 50:
        raise ValueError(f"only {len(train)} training rows before {split_at}: need at least 50")
    names = tuple(c for c in _feature_frame(next(iter(series.values())).iloc[:1], cfg, 1.0).columns)
    x = train[list(names)].to_numpy(np.float32)
    delta = (train["target"] - train["last"]).to_numpy(np.float32)
    targets = train["target"].to_numpy(np.float64)
    integer_valued = bool(np.all(targets == np.round(targets)))
    if log:
        print(f"forecast: fitting XGBoost on {len(train)} rows × {len(names)} features", file=sys.stderr)
    # 1. Inner validation (the latest EARLY_STOP_SHARE of the training rows, time-ordered): every
    #    candidate loss and every baseline is scored there, with the same rounding as at serving.
    cut = int(len(x) * (1.0 - EARLY_STOP_SHARE))
    held = train.iloc[cut:]
    actual = held["target"].to_numpy(np.float64)
    last = held["last"].to_numpy(np.float64)

    def served(values: np.ndarray) -> np.ndarray:
        return np.round(values) if integer_valued else values

    inner: dict[str, float] = {}
    fitted: dict[str, tuple[str, dict[str, float], int]] = {}
    for objective, extra in _objectives(delta[:cut].astype(np.float64), integer_valued):
        _, rounds, change = _fit(x, delta, params, objective, extra)
        inner[objective] = metrics.mae(actual, served(last + change))
        fitted[objective] = (objective, extra, rounds)
    for base in BASELINES:
        inner[base] = metrics.mae(actual, held[f"base_{base}"].to_numpy(np.float64))
    # 2. The model serves only if a loss beats every baseline there; otherwise the best baseline.
    best_model = min(fitted, key=lambda k: inner[k])
    best_base = min(BASELINES, key=lambda k: inner[k])
    chosen = "xgboost" if inner[best_model] < inner[best_base] * (1.0 - MIN_INNER_GAIN) else best_base
    objective, extra, rounds = fitted[best_model]
    if log:
        scores = ", ".join(f"{k} {v:.4f}" for k, v in inner.items())
        print(
            f"forecast: inner validation MAE on {len(held)} rows: {scores}; serving "
            + (f"xgboost ({objective}, {rounds} rounds)" if chosen == "xgboost" else chosen),
            file=sys.stderr,
        )
    # 3. Refit the chosen loss on the whole training window with the probe's number of rounds.
    booster = xgb.train(
        _booster_params(objective, extra, len(x), params), xgb.DMatrix(x, label=delta), num_boost_round=rounds
    )
    return SeriesModel(
        cfg, names, booster, scales, str(split_at), len(train), integer_valued, chosen, objective, inner
    )


def predict_rows(model: SeriesModel, rows: pd.DataFrame) -> np.ndarray:
    if model.chosen != "xgboost":
        return np.asarray(rows[f"base_{model.chosen}"].to_numpy(np.float64), dtype=np.float64)
    x = rows[list(model.feature_names)].to_numpy(np.float32)
    delta = model.booster.predict(xgb.DMatrix(x))
    forecast = rows["last"].to_numpy(np.float64) + delta
    return np.asarray(np.round(forecast) if model.integer_valued else forecast, dtype=np.float64)


def predict_series(model: SeriesModel, history: pd.Series, name: str | None = None) -> float:
    """Forecast the binned value `horizon` after the last bin of `history` (binned, regular grid).

    `name` picks the pool's training scale; an unseen pool uses its own history's maximum.
    """
    scale = model.scales.get(name, _scale_of(history)) if name is not None else _scale_of(history)
    rows = build_rows(history, model.config, scale).iloc[[-1]]
    if pd.isna(rows["last"].iloc[0]):
        raise ValueError("the last bin of the history is empty: nothing to forecast from")
    return float(predict_rows(model, rows)[0])


def evaluate_series(
    series: Mapping[str, pd.Series],
    cfg: SeriesConfig,
    split_at: pd.Timestamp,
    test_until: pd.Timestamp | None = None,
    params: XgbParams | None = None,
    *,
    log: bool = False,
) -> tuple[SeriesModel, SeriesEvaluation]:
    """Train before `split_at`, score XGBoost and the baselines on the same test rows."""
    model = train_series(series, cfg, split_at, params, log=log)
    rows = _all_rows(series, cfg, model.scales)
    test_mask = (rows["target_time"] >= split_at) & rows["target"].notna() & rows["last"].notna()
    if test_until is not None:
        test_mask &= rows["target_time"] < test_until
    test = rows[test_mask]
    if test.empty:
        raise ValueError(f"no test rows at or after {split_at}")
    predictions = {"xgboost": predict_rows(model, test)}
    for base in BASELINES:
        predictions[base] = test[f"base_{base}"].to_numpy(np.float64)
    actual = test["target"].to_numpy(np.float64)
    models = {name: {**metrics.series_scores(actual, p), "n": len(actual)} for name, p in predictions.items()}
    per_series: dict[str, dict[str, dict[str, float]]] = {}
    names = test["series"].to_numpy()
    for name in series:
        sel = names == name
        if sel.any():
            per_series[name] = {m: metrics.series_scores(actual[sel], p[sel]) for m, p in predictions.items()}
    evaluation = SeriesEvaluation(
        config=cfg,
        split_at=str(split_at),
        test_until=None if test_until is None else str(test_until),
        n_train=model.n_train,
        n_test=len(actual),
        rounds=int(model.booster.num_boosted_rounds()),
        models=models,
        per_series=per_series,
        chosen=model.chosen,
        objective=model.objective,
        inner_mae=model.inner_mae,
    )
    return model, evaluation
