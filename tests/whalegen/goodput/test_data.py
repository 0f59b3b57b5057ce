from __future__ import annotations

from pathlib import Path

import pytest

from whalegen.goodput.data import (
    GAVEL_FILE,
    GavelData,
    JobType,
    LucidConfig,
    LucidPair,
    LucidSolo,
    TraceFileMissing,
    default_traces_dir,
    load_gavel,
    load_lucid_colocate,
    load_lucid_single,
)

RESNET18_16 = JobType("ResNet-18 (batch size 16)", 1)


def test_gavel_loads_three_models_and_83_job_types_of_26_models(gavel: GavelData) -> None:
    assert gavel.gpu_models == ("K80", "P100", "V100M16")
    assert len(gavel.job_types) == 83
    assert len({job.model for job in gavel.job_types}) == 26
    assert {job.num_gpus for job in gavel.job_types} == {1, 2, 4, 8}


def test_gavel_solo_throughput_is_the_files_null_entry(gavel: GavelData) -> None:
    # Values read from the upstream JSON ("null" of ResNet-18 bs16 on one GPU of each worker type).
    assert gavel.solo[("K80", RESNET18_16)] == pytest.approx(4.795294551566172)
    assert gavel.solo[("P100", RESNET18_16)] == pytest.approx(35.869203207990005)
    assert gavel.solo[("V100M16", RESNET18_16)] == pytest.approx(32.353384328946916)


def test_gavel_pairs_are_stored_in_both_orders_swapped(gavel: GavelData) -> None:
    assert gavel.pairs
    for (model, a, b), (mine, theirs) in gavel.pairs.items():
        assert gavel.pairs[(model, b, a)] == (theirs, mine)


def test_gavel_pairs_that_do_not_fit_and_jobs_that_do_not_fit_are_kept_apart(gavel: GavelData) -> None:
    v100_pairs = [key for key in gavel.pairs if key[0] == "V100M16"]
    v100_unfit = [key for key in gavel.unfit if key[0] == "V100M16"]
    # traces/README.md: 636 measured pairs on V100; the rest of the 1,759 entries are [0, 0].
    assert len(v100_pairs) == 636
    assert len(v100_unfit) == 1759 - 636
    assert gavel.solo_unfit == frozenset(("K80", JobType("ResNet-50 (batch size 128)", n)) for n in (2, 4, 8))
    assert all(key not in gavel.solo for key in gavel.solo_unfit)


def test_job_type_family_drops_the_batch_size() -> None:
    assert JobType("ResNet-50 (batch size 64)", 4).family == "ResNet-50"
    assert JobType("A3C", 1).family == "A3C"


def test_lucid_single_has_66_configurations_with_profiles(lucid_single: tuple[LucidSolo, ...]) -> None:
    assert len(lucid_single) == 66
    first = lucid_single[0]
    assert first.config == LucidConfig("BERT", "SQuAD", 32, False)
    assert (first.speed, first.gpu_util_pct, first.gmem_util_pct, first.gmem_mib, first.label) == (
        84.872,
        99.689,
        62.484,
        20162.0,
        2,
    )
    assert {s.label for s in lucid_single} == {0, 1, 2}


def test_lucid_colocate_has_1388_pairs_over_56_configurations(lucid_pairs: tuple[LucidPair, ...]) -> None:
    assert len(lucid_pairs) == 1388
    configs = {p.first for p in lucid_pairs} | {p.second for p in lucid_pairs}
    assert len(configs) == 56
    assert lucid_pairs[0].first == LucidConfig("MobileNetV3", "ImageNet", 32, False)
    assert (lucid_pairs[0].speed_first, lucid_pairs[0].speed_second) == (0.983, 1.034)


@pytest.mark.parametrize(
    "loader",
    [load_gavel, load_lucid_single, load_lucid_colocate],
    ids=["gavel", "lucid single", "lucid pairs"],
)
def test_a_missing_file_is_a_clear_error_naming_it_and_the_variable(loader: object, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "file.csv"
    with pytest.raises(TraceFileMissing) as caught:
        loader(missing)  # type: ignore[operator]
    assert str(missing) in str(caught.value)
    assert "WHALEGEN_TRACES_DIR" in str(caught.value)


def test_traces_dir_comes_from_the_environment_variable_else_beside_the_repository() -> None:
    assert default_traces_dir({"WHALEGEN_TRACES_DIR": "/data/traces"}) == Path("/data/traces")
    repo = Path(__file__).resolve().parents[3]
    assert default_traces_dir({}) == repo.parent / "shared" / "traces"
    assert (default_traces_dir({}) / GAVEL_FILE).name == "simulation_throughputs.json.gz"
