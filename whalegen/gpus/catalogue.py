"""The GPU models WhaleGen knows, with the figures placement uses to tell them apart.

Figures are vendor datasheet values: dense (no sparsity) FP16/BF16 tensor TFLOPS, memory as the driver
reports it where a capture exists (H100 81,559 MiB, H200 143,771 MiB; reference/gpu-partitioning.md
§4.5), otherwise the nominal size. The Alibaba trace's `G1`, `G2`, `G3` are undisclosed internal
models: they are kept opaque (figures unknown, None) rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

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
    mem_bandwidth_gbps: float | None  # GB/s
    mig_capable: bool
    # Hopper applies MIG mode at once and forgets it on driver reload; Ampere needs a reset and keeps it.
    architecture: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def opaque(self) -> bool:
        """True for trace-only models whose figures were never disclosed."""
        return self.mem_mib is None


class UnknownGpuModel(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown GPU model {name!r}; known models: {', '.join(model_names())}")
        self.name = name


_MODELS: tuple[GpuModel, ...] = (
    # The Alibaba openb trace (reference: traces/README.md §1).
    GpuModel("P100", Vendor.NVIDIA, 16_384, 18.7, 732, False, "pascal", ("TESLA-P100",)),
    GpuModel("T4", Vendor.NVIDIA, 15_360, 65.0, 320, False, "turing", ("TESLA-T4",)),
    GpuModel("V100M16", Vendor.NVIDIA, 16_384, 125.0, 900, False, "volta", ("V100-16GB",)),
    GpuModel("V100M32", Vendor.NVIDIA, 32_768, 125.0, 900, False, "volta", ("V100-32GB",)),
    # Gavel's `k80` worker (traces/README.md, gavel/) is one GK210 die, which CUDA sees as one GPU, so the
    # figures are per die, half the board's (NVIDIA Tesla K80 datasheet: 24 GB and 480 GB/s per board;
    # nvidia-smi shows 11,441 MiB per GPU). Kepler has no FP16 arithmetic: its FP16 figure is None.
    GpuModel("K80", Vendor.NVIDIA, 11_441, None, 240, False, "kepler", ("TESLA-K80",)),
    GpuModel("A10", Vendor.NVIDIA, 23_028, 125.0, 600, False, "ampere"),
    GpuModel("G1", Vendor.UNKNOWN, None, None, None, False),
    GpuModel("G2", Vendor.UNKNOWN, None, None, None, False),
    GpuModel("G3", Vendor.UNKNOWN, None, None, None, False),
    # Current data-centre models.
    GpuModel("A100-40GB", Vendor.NVIDIA, 40_960, 312.0, 1_555, True, "ampere", ("A100-SXM4-40GB",)),
    GpuModel("A100-80GB", Vendor.NVIDIA, 81_920, 312.0, 2_039, True, "ampere", ("A100-SXM4-80GB",)),
    GpuModel("H100-80GB", Vendor.NVIDIA, 81_559, 989.0, 3_350, True, "hopper", ("H100", "H100-SXM5-80GB")),
    GpuModel("H200-141GB", Vendor.NVIDIA, 143_771, 989.0, 4_800, True, "hopper", ("H200",)),
    GpuModel("L4", Vendor.NVIDIA, 23_034, 121.0, 300, False, "ada"),
    GpuModel("L40S", Vendor.NVIDIA, 46_068, 362.0, 864, False, "ada"),
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


# Dense FP32 (non-tensor) TFLOPS per GPU, from the vendor datasheets: the speed rule (whalegen/gpus/speed.py)
# scales Gavel's jobs, taken as FP32 runs, by these, not by tensor figures.
# P100 PCIe 9.3 (the catalogue's P100 is the PCIe card: 18.7 FP16, 732 GB/s); V100 SXM2 15.7; T4 8.1;
# A10 31.2; A100 SXM4 19.5; H100 SXM5 67; H200 SXM 67; L4 30.3; L40S 91.6; K80 4.37 per GPU (8.73 per
# board with GPU Boost).
FP32_TFLOPS: dict[str, float] = {
    "K80": 4.37,
    "P100": 9.3,
    "T4": 8.1,
    "V100M16": 15.7,
    "V100M32": 15.7,
    "A10": 31.2,
    "A100-40GB": 19.5,
    "A100-80GB": 19.5,
    "H100-80GB": 67.0,
    "H200-141GB": 67.0,
    "L4": 30.3,
    "L40S": 91.6,
}
