"""Scores shared by every forecaster (reference/forecasting.md §3).

All functions take plain numpy arrays of equal length and return Python floats, so the results go
straight into JSON and into the model registry's metrics column.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Relative-error buckets of reference/forecasting.md §3.1 and the Helios estimator's bar for them.
DURATION_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0, 10.0)
HELIOS_BUCKET_BAR: tuple[float, ...] = (0.10, 0.50, 0.70, 0.90)


def _pair(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    a = np.asarray(actual, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if a.shape != p.shape:
        raise ValueError(f"actual {a.shape} and predicted {p.shape} differ in shape")
    return a, p


def mae(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    a, p = _pair(actual, predicted)
    return float(np.mean(np.abs(a - p))) if a.size else float("nan")


def smape(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Symmetric MAPE in percent, 0…200. A point where both values are 0 is a perfect forecast (0 %),
    not a division by zero: idle-GPU series sit at 0 for hours."""
    a, p = _pair(actual, predicted)
    if not a.size:
        return float("nan")
    denom = np.abs(a) + np.abs(p)
    ratio = np.divide(2.0 * np.abs(a - p), denom, out=np.zeros_like(a), where=denom > 0)
    return float(100.0 * np.mean(ratio))


def r2(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    a, p = _pair(actual, predicted)
    if not a.size:
        return float("nan")
    total = float(np.sum((a - a.mean()) ** 2))
    if total == 0.0:
        return float("nan")
    return 1.0 - float(np.sum((a - p) ** 2)) / total


def spearman(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Spearman rank correlation with average ranks for ties (no scipy in the plane's dependencies)."""
    a, p = _pair(actual, predicted)
    if a.size < 2:
        return float("nan")
    ra, rp = _average_ranks(a), _average_ranks(p)
    if ra.std() == 0.0 or rp.std() == 0.0:
        return float("nan")
    return float(np.corrcoef(ra, rp)[0, 1])


def _average_ranks(values: FloatArray) -> FloatArray:
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Tie groups: start of each run of equal values; every member gets the mean of the run's ranks.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], values.size]
    mean_rank = (starts + ends - 1) / 2.0
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def relative_error_buckets(
    actual: npt.ArrayLike, predicted: npt.ArrayLike, bounds: tuple[float, ...] = DURATION_BUCKETS
) -> dict[str, float]:
    """Share of items with |pred − actual| / actual ≤ bound, keyed `within_10pct`, `within_50pct`…"""
    a, p = _pair(actual, predicted)
    rel = np.abs(p - a) / np.maximum(np.abs(a), 1e-12)
    return {
        f"within_{round(b * 100)}pct": float(np.mean(rel <= b)) if a.size else float("nan") for b in bounds
    }


def log_mae(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """MAE of natural-log values; both sides are floored at 1 (one second, one MiB) first."""
    a, p = _pair(actual, predicted)
    return mae(np.log(np.maximum(a, 1.0)), np.log(np.maximum(p, 1.0)))


def median_ape(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    a, p = _pair(actual, predicted)
    return float(100.0 * np.median(np.abs(p - a) / np.maximum(np.abs(a), 1e-12))) if a.size else float("nan")


def pinball(actual: npt.ArrayLike, predicted: npt.ArrayLike, quantile: float) -> float:
    a, p = _pair(actual, predicted)
    diff = a - p
    return float(np.mean(np.maximum(quantile * diff, (quantile - 1.0) * diff))) if a.size else float("nan")


def under_prediction_rate(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Share of items whose actual value exceeds the prediction (for memory: the OOM risk)."""
    a, p = _pair(actual, predicted)
    return float(np.mean(a > p)) if a.size else float("nan")


def series_scores(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> dict[str, float]:
    return {"mae": mae(actual, predicted), "smape": smape(actual, predicted), "r2": r2(actual, predicted)}
