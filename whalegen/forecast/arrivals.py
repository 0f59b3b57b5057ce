"""Arrivals per pool and task shape over the next hour, in 10-minute bins.

This is the forecast shape mix the placement policy can weigh fragmentation against instead of the
static history (ARCHITECTURE §4): `forecast_arrivals` returns the expected number of arrivals of every
shape in each of the next `steps` bins.

Protocol:

* Arrivals (submission times) are counted per bin and per *shape class*: the `max_shapes` most
  frequent shapes of the training period, the rest pooled as `other`.
* A row is (origin bin boundary `o`, shape `s`, step `k` = 1…steps); its target is the count of `s`
  in bin `o + k`. Features use bins before `o` only: recent counts of the shape and of all shapes,
  the shape's count in the same slot one day and one week earlier (`o + k − period` ≤ `o`), its
  training mean rate, the step and the target's hour.
* XGBoost with a Poisson objective predicts the expected count. Baselines on the same cells:
  persistence (last bin's count), the last hour's mean, the same slot yesterday, and the training
  mean rate of the shape.
* Scores: RMSE, Poisson deviance and MAE of counts per cell, MAE of the hour's total, and the
  total-variation distance between the predicted and actual shape mix of the hour (the quantity the
  fragmentation score consumes).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import xgboost as xgb

from whalegen.forecast import metrics
from whalegen.forecast.store import dump_model, load_model, nthread_for

OTHER = "other"
MAX_TRAIN_ROWS = 300_000
FEATURES = (
    "last",
    "sum_1h",
    "sum_6h",
    "sum_1d",
    "yesterday",
    "last_week",
    "all_1h",
    "all_1d",
    "train_rate",
    "step",
    "target_hour",
)


@dataclass(frozen=True)
class ArrivalConfig:
    bin_s: int = 600
    steps: int = 6  # the next hour in 10-minute bins
    max_shapes: int = 15


def shape_labels(frame: pd.DataFrame, shape_cols: Sequence[str]) -> pd.Series:
    """One readable label per task, e.g. `num_gpu=1|gpu_milli=460`."""
    parts = [frame[c].astype(str).radd(f"{c}=") for c in shape_cols]
    label = parts[0]
    for p in parts[1:]:
        label = label + "|" + p
    return label


def arrival_counts(
    times_s: np.ndarray, labels: Sequence[str], shapes: Sequence[str], bin_s: int
) -> pd.DataFrame:
    """(bins × shapes) counts on a regular grid from the first to the last arrival; labels outside
    `shapes` count as `other` (which `shapes` must then contain)."""
    t = np.asarray(times_s, dtype=np.float64)
    known = set(shapes)
    lab = np.array([s if s in known else OTHER for s in labels], dtype=object)
    start = math.floor(t.min() / bin_s) * bin_s
    bins = ((t - start) // bin_s).astype(np.int64)
    n_bins = int(bins.max()) + 1
    out = np.zeros((n_bins, len(shapes)), dtype=np.float64)
    col = {s: j for j, s in enumerate(shapes)}
    np.add.at(out, (bins, np.array([col[s] for s in lab])), 1.0)
    return pd.DataFrame(out, columns=list(shapes), index=start + np.arange(n_bins) * bin_s)


def _rolling_sum(c: np.ndarray, w: int) -> np.ndarray:
    """Sum of bins (o − w, o] for every o (rows), NaN where fewer than w bins exist."""
    cs = np.vstack([np.zeros((1, c.shape[1])), np.cumsum(c, axis=0)])
    out = np.full(c.shape, np.nan)
    out[w - 1 :] = cs[w:] - cs[:-w]
    return out


def _shifted(c: np.ndarray, lag: int) -> np.ndarray:
    """Value at row o − lag (lag ≥ 0), NaN before the start."""
    out = np.full(c.shape, np.nan)
    if lag < len(c):
        out[lag:] = c[: len(c) - lag]
    return out


def arrival_rows(
    counts: pd.DataFrame, cfg: ArrivalConfig, train_rate: np.ndarray, origins: np.ndarray
) -> pd.DataFrame:
    """Rows for the given origin positions (row index of the last complete bin)."""
    c = counts.to_numpy(np.float64)
    day, week, hour = (round(s / cfg.bin_s) for s in (86_400, 604_800, 3_600))
    per_origin = {
        "last": c,
        "sum_1h": _rolling_sum(c, hour),
        "sum_6h": _rolling_sum(c, 6 * hour),
        "sum_1d": _rolling_sum(c, day),
    }
    all_c = c.sum(axis=1, keepdims=True)
    all_1h = np.repeat(_rolling_sum(all_c, hour), c.shape[1], axis=1)
    all_1d = np.repeat(_rolling_sum(all_c, day), c.shape[1], axis=1)
    n_s = c.shape[1]
    parts = []
    for k in range(1, cfg.steps + 1):
        target_rows = origins + k
        block: dict[str, np.ndarray] = {name: v[origins].ravel() for name, v in per_origin.items()}
        # Same slot a day / a week before the *target* bin: row o + k − period, which is ≤ o.
        block["yesterday"] = _shifted(c, day - k)[origins].ravel()
        block["last_week"] = _shifted(c, week - k)[origins].ravel()
        block["all_1h"] = all_1h[origins].ravel()
        block["all_1d"] = all_1d[origins].ravel()
        block["train_rate"] = np.tile(train_rate, len(origins))
        block["step"] = np.full(len(origins) * n_s, float(k))
        target_t = counts.index.to_numpy()[np.minimum(target_rows, len(c) - 1)] + 0.0
        block["target_hour"] = np.repeat((target_t % 86_400) / 3_600.0, n_s)
        block["origin"] = np.repeat(origins, n_s)
        block["shape"] = np.tile(np.arange(n_s), len(origins))
        inside = target_rows < len(c)
        target = np.full((len(origins), n_s), np.nan)
        target[inside] = c[target_rows[inside]]
        block["target"] = target.ravel()
        parts.append(pd.DataFrame(block))
    return pd.concat(parts, ignore_index=True)


@dataclass(eq=False)
class ArrivalModel:
    config: ArrivalConfig
    shapes: tuple[str, ...]
    train_rate: tuple[float, ...]
    booster: xgb.Booster

    def to_bytes(self) -> bytes:
        meta = {
            "config": asdict(self.config),
            "shapes": list(self.shapes),
            "train_rate": list(self.train_rate),
        }
        return dump_model("arrivals", meta, {"poisson": self.booster})

    @classmethod
    def from_bytes(cls, blob: bytes) -> ArrivalModel:
        env = load_model(blob, "arrivals")
        m = env.meta
        return cls(
            ArrivalConfig(**m["config"]), tuple(m["shapes"]), tuple(m["train_rate"]), env.boosters["poisson"]
        )

    def predict_rows(self, rows: pd.DataFrame) -> np.ndarray:
        out = self.booster.predict(xgb.DMatrix(rows[list(FEATURES)].to_numpy(np.float32)))
        return np.asarray(out, dtype=np.float64)


def choose_shapes(labels: Sequence[str], max_shapes: int) -> tuple[str, ...]:
    top = pd.Series(list(labels)).value_counts(sort=True)
    return (*top.index[:max_shapes].tolist(), OTHER)


def train_arrivals(
    times_s: np.ndarray,
    labels: Sequence[str],
    cfg: ArrivalConfig,
    split_s: float,
    *,
    rounds: int = 300,
    log: bool = False,
) -> ArrivalModel:
    """Fit on arrivals before `split_s` (every target bin of a training row ends before the split)."""
    t = np.asarray(times_s, dtype=np.float64)
    before = t < split_s
    shapes = choose_shapes([lab for lab, b in zip(labels, before, strict=True) if b], cfg.max_shapes)
    counts = arrival_counts(
        t[before], [lab for lab, b in zip(labels, before, strict=True) if b], shapes, cfg.bin_s
    )
    rate = counts.to_numpy().mean(axis=0)
    origins = np.arange(len(counts) - cfg.steps)
    stride = max(1, math.ceil(len(origins) * len(shapes) * cfg.steps / MAX_TRAIN_ROWS))
    rows = arrival_rows(counts, cfg, rate, origins[::stride])
    rows = rows[rows["target"].notna()]
    params: dict[str, Any] = {
        "objective": "count:poisson",
        "eta": 0.05,
        "max_depth": 5,
        "min_child_weight": 5.0,
        "subsample": 0.8,
        "nthread": nthread_for(len(rows)),
        "seed": 0,
    }
    if log:
        print(f"forecast: arrivals model on {len(rows)} rows, {len(shapes)} shape classes", file=sys.stderr)
    booster = xgb.train(
        params, xgb.DMatrix(rows[list(FEATURES)].to_numpy(np.float32), label=rows["target"]), rounds
    )
    return ArrivalModel(cfg, shapes, tuple(float(r) for r in rate), booster)


def forecast_arrivals(
    model: ArrivalModel, times_s: np.ndarray, labels: Sequence[str], now_s: float
) -> pd.DataFrame:
    """Expected arrivals per shape (columns) in each of the next `steps` bins after `now_s` (rows,
    labelled by bin start), from the arrivals seen before `now_s`. `now_s` is floored to a bin edge."""
    cfg = model.config
    t = np.asarray(times_s, dtype=np.float64)
    seen = t < now_s
    edge = math.floor(now_s / cfg.bin_s) * cfg.bin_s
    # Pad so the grid ends with the last complete bin before `edge`, even after a quiet spell.
    t_all = np.r_[t[seen], edge - 0.5]
    lab_all = [*(lab for lab, s in zip(labels, seen, strict=True) if s), OTHER]
    counts = arrival_counts(t_all, lab_all, model.shapes, cfg.bin_s)
    counts.iloc[-1, -1] -= 1.0  # remove the padding arrival
    rows = arrival_rows(counts, cfg, np.asarray(model.train_rate), np.array([len(counts) - 1]))
    expected = model.predict_rows(rows).reshape(cfg.steps, len(model.shapes))
    index = edge + np.arange(cfg.steps) * cfg.bin_s
    return pd.DataFrame(expected, columns=list(model.shapes), index=index)


def poisson_deviance(actual: np.ndarray, expected: np.ndarray) -> float:
    """Mean Poisson deviance; predictions are floored at 1e-6 so a zero forecast of a non-zero count
    costs a large but finite amount."""
    mu = np.maximum(expected, 1e-6)
    term = np.where(actual > 0, actual * np.log(np.maximum(actual, 1e-12) / mu), 0.0)
    return float(np.mean(2.0 * (term - (actual - mu))))


def _mix_distance(pred: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Total-variation distance between shape mixes per origin (rows: origins, cols: shapes); origins
    with no actual arrivals are NaN (there is no mix to match)."""
    p = pred / np.maximum(pred.sum(axis=1, keepdims=True), 1e-12)
    a_tot = actual.sum(axis=1, keepdims=True)
    a = actual / np.maximum(a_tot, 1e-12)
    d = 0.5 * np.abs(p - a).sum(axis=1)
    return np.where(a_tot[:, 0] > 0, d, np.nan)


@dataclass(frozen=True)
class ArrivalEvaluation:
    split_s: float
    shapes: tuple[str, ...]
    n_test_origins: int
    models: dict[str, dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "shapes": list(self.shapes)}


def evaluate_arrivals(
    times_s: np.ndarray,
    labels: Sequence[str],
    cfg: ArrivalConfig,
    split_frac: float = 0.7,
    *,
    rounds: int = 300,
    log: bool = False,
) -> tuple[ArrivalModel, ArrivalEvaluation]:
    """Split at the `split_frac` quantile of arrival times; test origins are the bin edges after it."""
    t = np.asarray(times_s, dtype=np.float64)
    split_s = float(np.quantile(t, split_frac))
    split_s = math.ceil(split_s / cfg.bin_s) * cfg.bin_s
    model = train_arrivals(t, labels, cfg, split_s, rounds=rounds, log=log)
    counts = arrival_counts(t, labels, model.shapes, cfg.bin_s)
    first_test = int(np.searchsorted(counts.index.to_numpy(), split_s)) - 1
    origins = np.arange(max(first_test, 0), len(counts) - cfg.steps)
    rows = arrival_rows(counts, cfg, np.asarray(model.train_rate), origins)
    actual = rows["target"].to_numpy()
    preds = {
        "xgboost": model.predict_rows(rows),
        "persistence": rows["last"].to_numpy(),
        "last_hour_mean": rows["sum_1h"].to_numpy() / round(3_600 / cfg.bin_s),
        "same_slot_yesterday": np.nan_to_num(rows["yesterday"].to_numpy(), nan=0.0),
        "training_rate": rows["train_rate"].to_numpy(),
    }
    n_o, n_s = len(origins), len(model.shapes)
    models: dict[str, dict[str, float]] = {}
    for name, p in preds.items():
        p = np.nan_to_num(p, nan=0.0)
        # rows are ordered step-major: (step, origin, shape)
        hour_p = p.reshape(cfg.steps, n_o, n_s).sum(axis=0)
        hour_a = actual.reshape(cfg.steps, n_o, n_s).sum(axis=0)
        models[name] = {
            "cell_mae": metrics.mae(actual, p),
            # Expected counts are means: RMSE and Poisson deviance score a mean, MAE rewards the
            # median, which is 0 for most (shape, bin) cells.
            "cell_rmse": float(np.sqrt(np.mean((actual - p) ** 2))),
            "poisson_deviance": poisson_deviance(actual, p),
            "hour_total_mae": metrics.mae(hour_a.sum(axis=1), hour_p.sum(axis=1)),
            "mix_tv_distance": float(np.nanmean(_mix_distance(hour_p, hour_a))),
            "n_cells": len(actual),
        }
    return model, ArrivalEvaluation(split_s, model.shapes, n_o, models)


def expected_shape_mix(forecast: pd.DataFrame) -> dict[str, float]:
    """Share of each shape class among the arrivals expected over the whole forecast (sums to 1), the
    input the fragmentation score weighs placements with; empty when no arrival is expected."""
    totals = forecast.sum(axis=0)
    grand = float(totals.sum())
    if grand <= 0:
        return {}
    return {str(shape): float(v) / grand for shape, v in totals.items()}
