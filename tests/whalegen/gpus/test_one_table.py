"""A GPU model is described once, in the catalogue; every other GPU table derives from it or adds only
its own facts, so one new catalogue row (plus a MIG table or a simulator fixture where those apply) is
everything a new model needs."""

from __future__ import annotations

import pytest

from whalegen.gpus import (
    CATALOGUE,
    MIG_TABLES,
    SKUS,
    MigResetPolicy,
    get_model,
    mig_profiles,
    model_from_nvml_name,
)
from whalegen.gpus.catalogue import FP32_TFLOPS
from whalegen.gpus.speed import gpu_figures

DISCLOSED = [name for name, model in CATALOGUE.items() if not model.opaque]
MIG_CAPABLE = [name for name, model in CATALOGUE.items() if model.mig_capable]


def test_every_mig_table_belongs_to_a_catalogue_model_under_its_canonical_name() -> None:
    for name in MIG_TABLES:
        assert get_model(name).name == name


@pytest.mark.parametrize("name", MIG_CAPABLE)
def test_a_mig_capable_model_has_profiles_and_a_reset_policy_from_its_architecture(name: str) -> None:
    model = CATALOGUE[name]
    assert mig_profiles(name)
    assert MigResetPolicy(model.architecture or "").value == model.architecture


@pytest.mark.parametrize("name", DISCLOSED)
def test_a_disclosed_model_has_every_figure_the_derived_tables_read(name: str) -> None:
    model = CATALOGUE[name]
    assert model.mem_mib and model.mem_mib > 0
    assert model.architecture
    assert FP32_TFLOPS[name] == model.fp32_tflops
    figures = gpu_figures(name)
    assert (figures.fp32_tflops, figures.mem_bandwidth_gbps) == (model.fp32_tflops, model.mem_bandwidth_gbps)


def test_the_speed_table_has_exactly_the_disclosed_models() -> None:
    assert set(FP32_TFLOPS) == set(DISCLOSED)


@pytest.mark.parametrize("key", sorted(SKUS))
def test_a_simulator_fixture_takes_memory_architecture_and_mig_from_its_catalogue_model(key: str) -> None:
    sku = SKUS[key]
    model = get_model(sku.model)
    assert sku.model == model.name
    assert sku.total_mem_mib == model.mem_mib
    assert sku.architecture == model.architecture
    assert sku.mig_capable == model.mig_capable
    assert sku.gi_profiles == mig_profiles(model.name)
    assert model_from_nvml_name(sku.nvml_name) == model.name
