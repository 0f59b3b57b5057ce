from __future__ import annotations

import pytest

from whalegen.goodput.data import GavelData, JobType, LucidPair, LucidSolo
from whalegen.goodput.interference import (
    InterferenceModel,
    Source,
    UtilisationFit,
    fit_additive_log,
    fit_utilisation,
    gavel_holdout,
    lucid_holdout,
    lucid_observations,
    mig_share,
)
from whalegen.gpus.mig import profile_by_name

RESNET18 = JobType("ResNet-18 (batch size 64)", 1)
LM = JobType("LM (batch size 20)", 1)
LM_X2 = JobType("LM (batch size 20)", 2)


def test_a_measured_pair_is_each_sides_shared_over_solo_throughput(gavel: GavelData) -> None:
    model = InterferenceModel(gavel)
    mine, theirs = gavel.pairs[("P100", RESNET18, LM)]
    factor = model.pair(RESNET18, LM, "P100")
    assert factor.source is Source.MEASURED
    assert factor.first == pytest.approx(min(1.0, mine / gavel.solo[("P100", RESNET18)]))
    assert factor.second == pytest.approx(min(1.0, theirs / gavel.solo[("P100", LM)]))


@pytest.mark.parametrize(
    ("a", "b", "gpu"),
    [(RESNET18, LM, "V100M16"), (RESNET18, LM_X2, "K80"), (LM, RESNET18, "H100")],
    ids=["measured on V100", "fitted across GPU counts", "H100 takes V100's measurement"],
)
def test_pair_lookups_are_symmetric(gavel: GavelData, a: JobType, b: JobType, gpu: str) -> None:
    model = InterferenceModel(gavel)
    assert model.pair(a, b, gpu) == model.pair(b, a, gpu).swapped()
    factor = model.pair(a, b, gpu)
    assert 0.0 < factor.first <= 1.0 and 0.0 < factor.second <= 1.0


def test_unmeasured_pairs_are_fitted_and_unmeasured_models_use_v100(gavel: GavelData) -> None:
    model = InterferenceModel(gavel)
    assert model.pair(RESNET18, LM_X2, "V100M16").source is Source.FITTED
    assert model.pair(RESNET18, LM, "H200") == model.pair(RESNET18, LM, "V100M16")


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
    assert fit.pair(30, 90) == fit.pair(90, 30).swapped()


def test_the_utilisation_fit_finds_the_rule_that_made_the_data(lucid_single: tuple[LucidSolo, ...]) -> None:
    truth = UtilisationFit(contention=0.04, exponent=1.5)
    rows = [(a, b, truth.factor(a.gpu_util_pct, b.gpu_util_pct)) for a in lucid_single for b in lucid_single]
    fit = fit_utilisation(rows)
    assert fit.exponent == truth.exponent
    assert fit.contention == pytest.approx(truth.contention)


def test_held_out_interference_error_beats_the_constant_baseline(
    gavel: GavelData, lucid_single: tuple[LucidSolo, ...], lucid_pairs: tuple[LucidPair, ...]
) -> None:
    # Loose regression guards (docs/goodput.md has the measured figures).
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


def test_mig_isolates_but_gives_only_its_slices() -> None:
    share = mig_share(profile_by_name("A100-80GB", "3g.40gb"))
    assert share.interference_factor == 1.0
    assert share.compute_fraction == pytest.approx(3 / 7)
    assert share.bandwidth_fraction == pytest.approx(4 / 8)
