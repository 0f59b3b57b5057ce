"""GPU catalogue (models, memory, TFLOPS, bandwidth), MIG geometry tables and SKU fixtures. Pure."""

from whalegen.gpus.catalogue import CATALOGUE, GpuModel, UnknownGpuModel, get_model, model_names
from whalegen.gpus.mig import (
    MIG_TABLES,
    CiProfile,
    MigProfile,
    ci_profiles,
    full_ci_profile,
    mig_profiles,
    profile_by_id,
    profile_by_name,
)
from whalegen.gpus.skus import SKUS, MigResetPolicy, SkuFixture, get_sku, model_from_nvml_name

__all__ = [
    "CATALOGUE",
    "MIG_TABLES",
    "SKUS",
    "CiProfile",
    "GpuModel",
    "MigProfile",
    "MigResetPolicy",
    "SkuFixture",
    "UnknownGpuModel",
    "ci_profiles",
    "full_ci_profile",
    "get_model",
    "get_sku",
    "mig_profiles",
    "model_from_nvml_name",
    "model_names",
    "profile_by_id",
    "profile_by_name",
]
