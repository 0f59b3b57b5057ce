"""Co-location interference: predict each job's speed when two jobs share one GPU, from solo profiles.

The model is deliberately small and readable, because an operator must be able to say why two tasks
were (not) packed together:

    speed_self = 1 − a · u_other − b · m_other − c · u_self · u_other − d · m_self · m_other

with `u` the solo GPU duty cycle and `m` the solo memory-controller utilisation, both as fractions
(0…1). Fitted by least squares. Validation (Lucid's measured pairs, `traces/lucid-profiles/`) holds
out one model family at a time, so a family is never scored by coefficients that saw it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from whalegen.forecast import metrics


@dataclass(frozen=True)
class SoloProfile:
    gpu_util_pct: float
    gmem_util_pct: float  # memory-controller (bandwidth) utilisation, not memory used
    gmem_mib: float


@dataclass(frozen=True)
class InterferenceModel:
    coef: tuple[float, float, float, float]

    def speed(self, me: SoloProfile, other: SoloProfile) -> float:
        """Predicted throughput of `me` next to `other`, as a share of its solo throughput (0…1]."""
        x = _terms(me, other)
        return float(np.clip(1.0 - x @ np.asarray(self.coef), 0.05, 1.0))

    def fits_memory(self, a: SoloProfile, b: SoloProfile, gpu_mem_mib: float, margin: float = 0.1) -> bool:
        return (a.gmem_mib + b.gmem_mib) * (1.0 + margin) <= gpu_mem_mib


def _terms(me: SoloProfile, other: SoloProfile) -> npt.NDArray[np.float64]:
    us, uo = me.gpu_util_pct / 100.0, other.gpu_util_pct / 100.0
    ms, mo = me.gmem_util_pct / 100.0, other.gmem_util_pct / 100.0
    return np.array([uo, mo, us * uo, ms * mo])


def fit_interference(pairs: Sequence[tuple[SoloProfile, SoloProfile, float]]) -> InterferenceModel:
    """`pairs`: (me, other, measured speed of me). Measured speeds above 1 are noise and count as 1."""
    x = np.array([_terms(me, other) for me, other, _ in pairs])
    y = 1.0 - np.minimum(np.array([s for _, _, s in pairs]), 1.0)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    a, b, c, d = (float(v) for v in coef)
    return InterferenceModel((a, b, c, d))


@dataclass(frozen=True)
class InterferenceEvaluation:
    n_pairs: int
    models: dict[str, dict[str, float]]


def evaluate_interference(
    pairs: Sequence[tuple[SoloProfile, SoloProfile, float]], families: Sequence[tuple[str, str]]
) -> InterferenceEvaluation:
    """Leave-one-family-out: for each family f, fit on pairs without f and predict pairs with f.
    `families[i]` names the two model families of pair i (me, other)."""
    actual = np.array([s for _, _, s in pairs])
    pred = np.full(len(pairs), np.nan)
    mean_base = np.full(len(pairs), np.nan)
    for fam in sorted({f for pair in families for f in pair}):
        test = np.array([fam in pair for pair in families])
        train = [p for p, t in zip(pairs, test, strict=True) if not t]
        if len(train) < 10:
            continue
        model = fit_interference(train)
        for i in (int(j) for j in np.flatnonzero(test)):
            if np.isnan(pred[i]):
                pred[i] = model.speed(pairs[i][0], pairs[i][1])
                mean_base[i] = float(np.mean(np.minimum([s for _, _, s in train], 1.0)))
    ok = ~np.isnan(pred)
    a = actual[ok]
    cands = {"solo_profile_model": pred[ok], "training_mean": mean_base[ok], "no_slowdown": np.ones(ok.sum())}
    models = {
        name: {"mae": metrics.mae(a, p), "spearman": metrics.spearman(a, p), "n": int(ok.sum())}
        for name, p in cands.items()
    }
    return InterferenceEvaluation(int(ok.sum()), models)


# -- the utilisation rule of the goodput replay and the profile-aware placement -----------------------

# Fitted on all of Lucid's pairs (docs/notes/goodput-design.md §3):
# factor = (1 − c) / max(1, summed demand)^k, with the demand each side's SM utilisation alone. It needs
# only what NVML reports, so the production plane can apply it to any profile key with telemetry.
LUCID_CONTENTION = 0.005
LUCID_EXPONENT = 0.6


def utilisation_factor(util_pct: float, others_util_pct: float) -> float:
    """Predicted throughput (shared over alone) of a task at `util_pct` SM utilisation beside neighbours
    whose SM utilisations sum to `others_util_pct`."""
    demand = (util_pct + others_util_pct) / 100.0
    slowdown: float = max(1.0, demand) ** LUCID_EXPONENT
    return min(1.0, (1.0 - LUCID_CONTENTION) / slowdown)


# -- the co-location risk an online service's SLA is checked against ----------------------------------
#
# The rule above predicts the *median* factor of the measured pairs near a demand, and it depends on the
# summed demand only. An SLA is a floor, not a median: at (35 %, 30 %) the rule says 0.995× while 23 % of
# Lucid's measured pairs there ran below 0.90. A service's SLA is therefore checked against a low quantile
# of the measured pairs in its cell (own SM utilisation alone × its neighbours' summed), on a coarse grid
# so that every cell holds 70+ measured sides. The quantile is the SLA budget an operator sets (at most
# 1 % of service-minutes below the SLA): a service shares a GPU only where 99 in 100 measured pairs near
# it kept the SLA. For the usual 0.90 no cell of Lucid's pairs does (2–5 % of the pairs run below 0.90
# even beside a near-idle neighbour), so a 0.90 service never shares; a 0.85 one shares beside light
# neighbours. Measured in the goodput replay (docs/notes/goodput-runs.md, "The co-location risk"): at
# the 10th percentile 1.7–4.2 % of service-minutes violated on the default fleet, at the 1st 0.7–0.95 %.
# Fitted on all of Lucid's pairs by `fit_low_factor_table`; tests/whalegen/goodput/test_colocation_risk.py
# refits it from the traces and checks the committed table.
LOW_FACTOR_QUANTILE = 0.01
LOW_FACTOR_GRID_PCT = 20.0
# Rows: own SM utilisation alone [0, 20), [20, 40), … [80, ∞) %; columns: the neighbours' summed, the same.
LUCID_LOW_FACTOR: tuple[tuple[float, ...], ...] = (
    (0.86, 0.87, 0.85, 0.87, 0.85),
    (0.87, 0.81, 0.79, 0.66, 0.64),
    (0.86, 0.83, 0.81, 0.65, 0.56),
    (0.79, 0.76, 0.73, 0.56, 0.51),
    (0.79, 0.80, 0.63, 0.52, 0.44),
)


def _low_cell(util_pct: float) -> int:
    cells = round(100.0 / LOW_FACTOR_GRID_PCT)
    return min(cells - 1, max(0, int(util_pct // LOW_FACTOR_GRID_PCT)))


def utilisation_low_factor(util_pct: float, others_util_pct: float) -> float:
    """The factor a task at `util_pct` beside neighbours summing `others_util_pct` keeps in 99 % of the
    measured pairs near it (never above the median rule's). What an SLA is checked against."""
    low = LUCID_LOW_FACTOR[_low_cell(util_pct)][_low_cell(others_util_pct)]
    return min(low, utilisation_factor(util_pct, others_util_pct))


def fit_low_factor_table(points: Sequence[tuple[float, float, float]]) -> tuple[tuple[float, ...], ...]:
    """`points`: (own SM utilisation alone %, neighbour's %, own measured factor). The `LOW_FACTOR_QUANTILE`
    nearest-rank quantile per cell, rounded to hundredths; an empty cell takes the cell before it in its
    row (more neighbour demand never helps)."""
    cells = round(100.0 / LOW_FACTOR_GRID_PCT)
    grouped: dict[tuple[int, int], list[float]] = {}
    for own, other, factor in points:
        grouped.setdefault((_low_cell(own), _low_cell(other)), []).append(min(1.0, factor))
    table: list[tuple[float, ...]] = []
    for row in range(cells):
        values: list[float] = []
        for col in range(cells):
            found = sorted(grouped.get((row, col), []))
            if found:
                rank = max(0, math.ceil(LOW_FACTOR_QUANTILE * len(found)) - 1)
                values.append(round(found[rank], 2))
            else:
                values.append(values[-1] if values else 1.0)
        table.append(tuple(values))
    return tuple(table)
