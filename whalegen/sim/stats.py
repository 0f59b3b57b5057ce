"""The summary statistics every replay reports, written once. Pure.

Two percentiles, because the replays' published figures use two definitions and changing either would
change them: `percentile` interpolates linearly between ranks (numpy's default; the scenario, dynamic and
MIG-wait replays), `nearest_rank_percentile` returns a value that was observed (the goodput replay).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean (numpy's pairwise sum, as the replays' published figures were computed); 0.0 for
    no values."""
    return float(np.mean(values)) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0 … 100), linear between ranks; 0.0 for no values."""
    return float(np.percentile(values, q)) if values else 0.0


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def nearest_rank_percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (q in 0 … 100): the smallest value with at least q % at or below it;
    0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
