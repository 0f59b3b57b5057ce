"""The GPU models WhaleGen knows, with the figures placement uses to tell them apart.

This is the one table a GPU model is described in: its memory, architecture and speed figures live
here and nowhere else. The other GPU tables add only what is theirs and derive the rest from this one:
the MIG profile table (mig.py, keyed by model; a model is MIG-capable iff it has one) and the simulated
NVML's board fixtures (skus.py: device name, PCI ID, clocks, power). A new model is one row here, plus a
MIG table if it has MIG and a fixture if the simulator should play it
(tests/whalegen/gpus/test_one_table.py).

Figures are vendor datasheet values: dense (no sparsity) FP16/BF16 tensor TFLOPS, memory as the driver
reports it where a capture exists (H100 81,559 MiB, H200 143,771 MiB; reference/gpu-partitioning.md
§4.5), otherwise the nominal size. The Alibaba trace's `G1`, `G2`, `G3` are undisclosed internal
models: they are kept opaque (figures unknown, None) rather than guessed.

Dense FP32 (non-tensor) TFLOPS are what the speed rule (whalegen/gpus/speed.py) scales Gavel's jobs by,
taken as FP32 runs, not the tensor figures: P100 PCIe 9.3 (the P100 here is the PCIe card: 18.7 FP16,
732 GB/s); V100 SXM2 15.7; T4 8.1; A10 31.2; A100 SXM4 19.5; H100 SXM5 67; H200 SXM 67; L4 30.3;
L40S 91.6; K80 4.37 per GPU (8.73 per board with GPU Boost).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from whalegen.gpus.mig import MIG_TABLES

# GPU compute is counted in thousandths of a GPU (milli-GPU, the traces' unit): one whole card is this.
WHOLE_GPU_MILLI = 1000


class Vendor(StrEnum):
    NVIDIA = "nvidia"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class GpuModel:
    name: str
    vendor: Vendor
    mem_mib: int | None
    fp16_tflops: float | None  # dense FP16/BF16 tensor throughput
    fp32_tflops: float | None  # dense FP32 (non-tensor) throughput: the speed rule's FLOPS
    mem_bandwidth_gbps: float | None  # GB/s
    # Hopper applies MIG mode at once and forgets it on driver reload; Ampere needs a reset and keeps it.
    architecture: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def opaque(self) -> bool:
        """True for trace-only models whose figures were never disclosed."""
        return self.mem_mib is None

    @property
    def mig_capable(self) -> bool:
        """A model has MIG iff mig.py has its GI-profile table: the table is the one statement of it."""
        return self.name in MIG_TABLES


class UnknownGpuModel(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown GPU model {name!r}; known models: {', '.join(model_names())}")
        self.name = name


_MODELS: tuple[GpuModel, ...] = (
    # name, vendor, MiB, FP16 tensor TFLOPS, FP32 TFLOPS, GB/s, architecture, aliases
    # The Alibaba openb trace (reference: traces/README.md §1).
    GpuModel("P100", Vendor.NVIDIA, 16_384, 18.7, 9.3, 732, "pascal", ("TESLA-P100",)),
    GpuModel("T4", Vendor.NVIDIA, 15_360, 65.0, 8.1, 320, "turing", ("TESLA-T4",)),
    GpuModel("V100M16", Vendor.NVIDIA, 16_384, 125.0, 15.7, 900, "volta", ("V100-16GB",)),
    GpuModel("V100M32", Vendor.NVIDIA, 32_768, 125.0, 15.7, 900, "volta", ("V100-32GB",)),
    # Gavel's `k80` worker (traces/README.md, gavel/) is one GK210 die, which CUDA sees as one GPU, so the
    # figures are per die, half the board's (NVIDIA Tesla K80 datasheet: 24 GB and 480 GB/s per board;
    # nvidia-smi shows 11,441 MiB per GPU). Kepler has no FP16 arithmetic: its FP16 figure is None.
    GpuModel("K80", Vendor.NVIDIA, 11_441, None, 4.37, 240, "kepler", ("TESLA-K80",)),
    GpuModel("A10", Vendor.NVIDIA, 23_028, 125.0, 31.2, 600, "ampere"),
    GpuModel("G1", Vendor.UNKNOWN, None, None, None, None),
    GpuModel("G2", Vendor.UNKNOWN, None, None, None, None),
    GpuModel("G3", Vendor.UNKNOWN, None, None, None, None),
    # Current data-centre models.
    GpuModel("A100-40GB", Vendor.NVIDIA, 40_960, 312.0, 19.5, 1_555, "ampere", ("A100-SXM4-40GB",)),
    GpuModel("A100-80GB", Vendor.NVIDIA, 81_920, 312.0, 19.5, 2_039, "ampere", ("A100-SXM4-80GB",)),
    GpuModel("H100-80GB", Vendor.NVIDIA, 81_559, 989.0, 67.0, 3_350, "hopper", ("H100", "H100-SXM5-80GB")),
    GpuModel("H200-141GB", Vendor.NVIDIA, 143_771, 989.0, 67.0, 4_800, "hopper", ("H200",)),
    GpuModel("L4", Vendor.NVIDIA, 23_034, 121.0, 30.3, 300, "ada"),
    GpuModel("L40S", Vendor.NVIDIA, 46_068, 362.0, 91.6, 864, "ada"),
)

CATALOGUE: dict[str, GpuModel] = {model.name: model for model in _MODELS}
_LOOKUP: dict[str, GpuModel] = {}
for _model in _MODELS:
    for _key in (_model.name, *_model.aliases):
        _LOOKUP[_key.upper()] = _model


def model_names() -> list[str]:
    return [model.name for model in _MODELS]


def get_model(name: str) -> GpuModel:
    """Look a model up by its name or an alias, case-insensitively; raise UnknownGpuModel otherwise."""
    model = _LOOKUP.get(name.strip().upper())
    if model is None:
        raise UnknownGpuModel(name)
    return model


def canonical_model_name(name: str) -> str:
    return get_model(name).name


# The speed rule's FLOPS by model name, for the models that have a figure (derived from the table).
FP32_TFLOPS: dict[str, float] = {m.name: m.fp32_tflops for m in _MODELS if m.fp32_tflops is not None}
