"""GPU catalogue (models, memory, TFLOPS, bandwidth) and MIG geometry tables. Pure: stdlib only."""

from whalegen.gpus.catalogue import CATALOGUE, GpuModel, UnknownGpuModel, get_model, model_names
from whalegen.gpus.mig import MIG_TABLES, MigProfile, mig_profiles

__all__ = [
    "CATALOGUE",
    "MIG_TABLES",
    "GpuModel",
    "MigProfile",
    "UnknownGpuModel",
    "get_model",
    "mig_profiles",
    "model_names",
]
