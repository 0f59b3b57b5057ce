from __future__ import annotations

import pytest

from whalegen.goodput.data import GavelData, JobType, LucidPair, LucidSolo
from whalegen.goodput.interference import (
    UtilisationFit,
    fit_additive_log,
    fit_utilisation,
    gavel_holdout,
    lucid_holdout,
    lucid_observations,
)

RESNET18 = JobType("ResNet-18 (batch size 64)", 1)
LM = JobType("LM (batch size 20)", 1)
LM_X2 = JobType("LM (batch size 20)", 2)


def test_the_additive_log_fit_reproduces_separable_effects_exactly() -> None:
    sensitivity = {"a": 0.9, "b": 0.6, "c": 1.0}
    pressure = {"a": 0.8, "b": 1.0, "c": 0.5}
    rows = [(x, y, sensitivity[x] * pressure[y]) for x in "abc" for y in "abc" if (x, y) != ("c", "c")]
    fit = fit_additive_log(rows)
    for x, y, factor in rows:
        assert fit.factor(x, y) == pytest.approx(factor, rel=1e-6)
    # The held-out cell (c beside c) follows from the effects: 1.0 × 0.5.
    assert fit.factor("c", "c") == pytest.approx(0.5, rel=1e-6)


def test_the_utilisation_rule_by_hand() -> None:
    fit = UtilisationFit(contention=0.1, exponent=1.0)
    assert fit.factor(40, 50) == pytest.approx(0.9)  # demand 0.9: no oversubscription, contention only
    assert fit.factor(60, 60) == pytest.approx(0.9 / 1.2)
    assert fit.factor(30, 90) == fit.factor(90, 30) == pytest.approx(0.9 / 1.2)  # one demand, both sides


def test_the_utilisation_fit_finds_the_rule_that_made_the_data(lucid_single: tuple[LucidSolo, ...]) -> None:
    truth = UtilisationFit(contention=0.04, exponent=1.5)
    rows = [(a, b, truth.factor(a.gpu_util_pct, b.gpu_util_pct)) for a in lucid_single for b in lucid_single]
    fit = fit_utilisation(rows)
    assert fit.exponent == truth.exponent
    assert fit.contention == pytest.approx(truth.contention)


def test_held_out_interference_error_beats_the_constant_baseline(
    gavel: GavelData, lucid_single: tuple[LucidSolo, ...], lucid_pairs: tuple[LucidPair, ...]
) -> None:
    # Loose regression guards (docs/notes/goodput-design.md has the measured figures).
    for model in gavel.gpu_models:
        holdout = gavel_holdout(gavel, model)
        assert holdout.median_abs_error < holdout.median_abs_error_constant
        assert holdout.median_abs_error < 0.2
    lucid = lucid_holdout(lucid_single, lucid_pairs)
    assert lucid.predictions == 2 * len(lucid_pairs)
    assert lucid.median_abs_error <= lucid.median_abs_error_constant
    assert lucid.median_abs_error < 0.1


def test_lucid_observations_cover_both_sides_capped_at_one(
    lucid_single: tuple[LucidSolo, ...], lucid_pairs: tuple[LucidPair, ...]
) -> None:
    rows = lucid_observations(lucid_single, lucid_pairs)
    assert len(rows) == 2 * len(lucid_pairs)
    assert max(f for _, _, f in rows) == 1.0
    assert min(f for _, _, f in rows) == pytest.approx(0.444)
