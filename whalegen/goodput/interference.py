"""Co-location interference fits: the slowdown of each side when two jobs share a GPU (MPS or time slice).

A *factor* is a job's throughput while sharing over its throughput alone (1.0: no slowdown), capped at 1
(values above it in the measurements are noise; traces/README.md §4.2). Two fits, with their held-out
errors (docs/notes/goodput-design.md §3):

1. Per-job effects (Gavel): log factor(a beside b) = sensitivity[a] + pressure[b], one sensitivity and
   one pressure per model and batch size, fitted by least squares (backfitting) on the measured pairs of
   a GPU model (`fit_additive_log`, `gavel_holdout`).
2. Utilisation (Lucid), for work known only by its profile: factor = (1 − c) / max(1, (u_a + u_b) / 100)
   ** k with u the SM utilisation alone; the GPU is oversubscribed when the two demands add past 100 %,
   and `c` is the contention left below it (`fit_utilisation`, `lucid_holdout`). The goodput replay
   derives a job type's SM utilisation through it; the policies' SLA predictor is the same rule.

Since issue #41 item 1 the replay's co-location *truth* is neither fit but the measured Lucid pairs
themselves (whalegen.goodput.truth.MeasuredPairs).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from whalegen.goodput.data import GavelData, JobType, LucidPair, LucidSolo

_BACKFIT_ROUNDS = 60


def _cap(value: float) -> float:
    return min(1.0, max(0.0, value))


@dataclass(frozen=True)
class AdditiveLogFit:
    """log factor(a beside b) = sensitivity[a] + pressure[b]; keys are Gavel models with batch size."""

    sensitivity: Mapping[str, float]
    pressure: Mapping[str, float]

    def factor(self, job: str, beside: str) -> float:
        return _cap(math.exp(self.sensitivity.get(job, 0.0) + self.pressure.get(beside, 0.0)))


def fit_additive_log(observations: Sequence[tuple[str, str, float]]) -> AdditiveLogFit:
    """Least squares of log factor on job + neighbour effects, by alternating means (backfitting).

    The split between the two effects has one free constant (a + k, b − k); predictions do not depend
    on it. Factors must be in (0, 1].
    """
    if not observations:
        raise ValueError("no observations to fit")
    logs = [(job, beside, math.log(f)) for job, beside, f in observations]
    sensitivity: dict[str, float] = {}
    pressure: dict[str, float] = {}
    for _ in range(_BACKFIT_ROUNDS):
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for job, beside, y in logs:
            sums[job] = sums.get(job, 0.0) + y - pressure.get(beside, 0.0)
            counts[job] = counts.get(job, 0) + 1
        sensitivity = {k: sums[k] / counts[k] for k in sums}
        sums, counts = {}, {}
        for job, beside, y in logs:
            sums[beside] = sums.get(beside, 0.0) + y - sensitivity.get(job, 0.0)
            counts[beside] = counts.get(beside, 0) + 1
        pressure = {k: sums[k] / counts[k] for k in sums}
    return AdditiveLogFit(sensitivity, pressure)


def gavel_observations(gavel: GavelData, model: str) -> list[tuple[JobType, JobType, float]]:
    """(job, beside, factor) for every ordered measured pair on `model`, factors capped at 1."""
    return [
        (a, b, _cap(mine / gavel.solo[(m, a)]))
        for (m, a, b), (mine, _) in sorted(gavel.pairs.items())
        if m == model and (m, a) in gavel.solo
    ]


@dataclass(frozen=True)
class UtilisationFit:
    """factor = (1 − contention) / max(1, (u_self + u_other) / 100) ** exponent (module docstring, 3)."""

    contention: float
    exponent: float

    def factor(self, util_pct: float, other_util_pct: float) -> float:
        demand = (util_pct + other_util_pct) / 100.0
        return _cap((1.0 - self.contention) / max(1.0, demand) ** self.exponent)


def lucid_observations(
    single: Iterable[LucidSolo], pairs: Iterable[LucidPair]
) -> list[tuple[LucidSolo, LucidSolo, float]]:
    """(job alone, neighbour alone, job's factor) for both sides of every Lucid pair, capped at 1."""
    solo = {s.config: s for s in single}
    rows = []
    for pair in pairs:
        a, b = solo[pair.first], solo[pair.second]
        rows.append((a, b, _cap(pair.speed_first)))
        rows.append((b, a, _cap(pair.speed_second)))
    return rows


# Exponents tried by the utilisation fit; for each, the best contention is exact (a weighted median).
_EXPONENT_GRID = tuple(i / 10 for i in range(0, 21))


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    ordered = sorted(zip(values, weights, strict=True))
    half = sum(weights) / 2
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= half:
            return value
    return ordered[-1][0]


def fit_utilisation(observations: Sequence[tuple[LucidSolo, LucidSolo, float]]) -> UtilisationFit:
    """Minimise the mean absolute error of the factor over the exponent grid and the contention.

    For a fixed exponent the prediction is (1 − c) · g with g = max(1, demand) ** −k, and
    Σ |(1 − c) g − f| = Σ g |(1 − c) − f / g| is least at the g-weighted median of f / g.
    """
    if not observations:
        raise ValueError("no observations to fit")
    demands = [max(1.0, (a.gpu_util_pct + b.gpu_util_pct) / 100.0) for a, b, _ in observations]
    factors = [f for _, _, f in observations]
    best: tuple[float, UtilisationFit] | None = None
    for exponent in _EXPONENT_GRID:
        gains = [d**-exponent for d in demands]
        level = _weighted_median([f / g for f, g in zip(factors, gains, strict=True)], gains)
        fit = UtilisationFit(min(1.0, max(0.0, 1.0 - level)), exponent)
        loss = sum(abs(fit.factor(a.gpu_util_pct, b.gpu_util_pct) - f) for a, b, f in observations)
        if best is None or loss < best[0]:
            best = (loss, fit)
    assert best is not None
    return best[1]


# --- Held-out error --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InterferenceHoldout:
    data: str  # what was held out, in words
    predictions: int
    median_abs_error: float
    p90_abs_error: float
    max_abs_error: float
    median_abs_error_constant: float  # baseline: the training median factor for every pair
    median_abs_error_none: float  # baseline: no interference (factor 1)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(
    label: str, errors: list[float], constant: list[float], none: list[float]
) -> InterferenceHoldout:
    return InterferenceHoldout(
        label,
        len(errors),
        _median(errors),
        _quantile(errors, 0.9),
        max(errors),
        _median(constant),
        _median(none),
    )


def gavel_holdout(gavel: GavelData, model: str, folds: int = 5, seed: int = 0) -> InterferenceHoldout:
    """K-fold over unordered measured pairs on `model`: fit on the rest, predict both sides of each."""
    observations = gavel_observations(gavel, model)
    unordered = sorted({tuple(sorted((a, b))) for a, b, _ in observations})
    random.Random(seed).shuffle(unordered)
    errors: list[float] = []
    constant: list[float] = []
    none: list[float] = []
    for k in range(folds):
        test = set(unordered[k::folds])
        train = [o for o in observations if tuple(sorted((o[0], o[1]))) not in test]
        fit = fit_additive_log([(a.model, b.model, f) for a, b, f in train])
        median = _median([f for _, _, f in train])
        for a, b, f in observations:
            if tuple(sorted((a, b))) in test:
                errors.append(abs(fit.factor(a.model, b.model) - f))
                constant.append(abs(median - f))
                none.append(abs(1.0 - f))
    return _summary(f"Gavel {model}, {folds}-fold over pairs", errors, constant, none)


def lucid_holdout(single: Sequence[LucidSolo], pairs: Sequence[LucidPair]) -> InterferenceHoldout:
    """Leave one Lucid model out: fit on pairs without it, predict its side of every pair it is in."""
    observations = lucid_observations(single, pairs)
    errors: list[float] = []
    constant: list[float] = []
    none: list[float] = []
    for model in sorted({a.config.model for a, _, _ in observations}):
        train = [o for o in observations if model not in (o[0].config.model, o[1].config.model)]
        fit = fit_utilisation(train)
        median = _median([f for _, _, f in train])
        for a, b, f in observations:
            if a.config.model == model:
                errors.append(abs(fit.factor(a.gpu_util_pct, b.gpu_util_pct) - f))
                constant.append(abs(median - f))
                none.append(abs(1.0 - f))
    return _summary("Lucid, leave one model out", errors, constant, none)
