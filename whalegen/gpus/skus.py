"""Per-SKU fixtures: what a simulated NVML needs to impersonate one GPU model.

A fixture holds only the board facts NVML reports (device name string, PCI device ID, SMs, clocks,
power); the model's memory, architecture and MIG table come from the catalogue (catalogue.py, the one
table a GPU model is described in) and mig.py, so a fixture cannot disagree with them. Figures come from
reference/gpu-partitioning.md and vendor datasheets; each fixture says where its MIG geometry comes
from in `provenance`. Replace inferred values with captured ones when `scripts/gpu-check` has run on
the hardware (§10).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from whalegen.gpus.catalogue import GpuModel, UnknownGpuModel, get_model
from whalegen.gpus.mig import CiProfile, MigProfile, ci_profiles, mig_profiles


class MigResetPolicy(StrEnum):
    # Hopper applies a MIG-mode change at once and forgets it on driver reload; Ampere needs a GPU
    # reset to activate it and keeps it in the InfoROM (§3). The values are the catalogue's architecture
    # names: a MIG-capable model's policy is its architecture's.
    HOPPER = "hopper"
    AMPERE = "ampere"


@dataclass(frozen=True)
class SkuFixture:
    key: str  # fixture name used in simulator specs, e.g. "h100-80gb-sxm"
    model: str  # canonical catalogue name
    nvml_name: str  # what nvmlDeviceGetName returns
    pci_device_id: int
    sm_count: int
    max_sm_clock_mhz: int
    mem_clock_mhz: int
    power_limit_w: int
    idle_power_w: int
    provenance: str

    @property
    def catalogue_model(self) -> GpuModel:
        return get_model(self.model)

    @property
    def architecture(self) -> str:
        return self.catalogue_model.architecture or ""

    @property
    def total_mem_mib(self) -> int:
        return self.catalogue_model.mem_mib or 0

    @property
    def mig_reset_policy(self) -> MigResetPolicy | None:
        """None: no MIG on this SKU."""
        return MigResetPolicy(self.architecture) if self.catalogue_model.mig_capable else None

    @property
    def mig_capable(self) -> bool:
        return self.mig_reset_policy is not None

    @property
    def gi_profiles(self) -> tuple[MigProfile, ...]:
        return mig_profiles(self.model) if self.mig_capable else ()

    def ci_profiles_for(self, gi_profile_id: int) -> tuple[CiProfile, ...]:
        for profile in self.gi_profiles:
            if profile.profile_id == gi_profile_id:
                return ci_profiles(profile)
        return ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "model": self.model,
            "nvml_name": self.nvml_name,
            "architecture": self.architecture,
            "total_mem_mib": self.total_mem_mib,
            "mig_reset_policy": self.mig_reset_policy.value if self.mig_reset_policy else None,
            "pci_device_id": f"0x{self.pci_device_id:04X}",
            "sm_count": self.sm_count,
            "max_sm_clock_mhz": self.max_sm_clock_mhz,
            "mem_clock_mhz": self.mem_clock_mhz,
            "power_limit_w": self.power_limit_w,
            "idle_power_w": self.idle_power_w,
            "provenance": self.provenance,
            "gi_profiles": [
                {
                    "id": p.profile_id,
                    "index": p.index,
                    "name": p.name,
                    "compute_slices": p.compute_slices,
                    "memory_slices": p.memory_slices,
                    "max_instances": p.max_instances,
                    "starts": list(p.starts),
                    "mem_mib": p.mem_mib,
                    "sm_count": p.sm_count,
                    "provenance": p.provenance,
                    "ci_profiles": [
                        {"id": c.profile_id, "name": c.name, "starts": list(c.starts)} for c in ci_profiles(p)
                    ],
                }
                for p in self.gi_profiles
            ],
        }


SKUS: dict[str, SkuFixture] = {
    sku.key: sku
    for sku in (
        SkuFixture(
            "a100-40gb",
            "A100-40GB",
            "NVIDIA A100-SXM4-40GB",
            0x20B0,
            108,
            1410,
            1215,
            400,
            55,
            "MIG guide -lgip (seen); placements observed",
        ),
        SkuFixture(
            "a100-80gb",
            "A100-80GB",
            "NVIDIA A100-SXM4-80GB",
            0x20B2,
            108,
            1410,
            1593,
            400,
            60,
            "captured -lgip (observed)",
        ),
        SkuFixture(
            "h100-80gb-sxm",
            "H100-80GB",
            "NVIDIA H100 80GB HBM3",
            0x2330,
            132,
            1980,
            2619,
            700,
            70,
            "captured -lgip/-lgipp (observed)",
        ),
        SkuFixture(
            "h200-141gb",
            "H200-141GB",
            "NVIDIA H200",
            0x2335,
            132,
            1980,
            3201,
            700,
            75,
            "IDs/GiB observed; placements inferred from H100 fractions",
        ),
        SkuFixture(
            "l40s",
            "L40S",
            "NVIDIA L40S",
            0x26B9,
            142,
            2520,
            9001,
            350,
            35,
            "datasheet; no MIG",
        ),
    )
}


def get_sku(key: str) -> SkuFixture:
    try:
        return SKUS[key.strip().lower()]
    except KeyError:
        raise LookupError(f"unknown SKU fixture {key!r}; known: {', '.join(SKUS)}") from None


def model_from_nvml_name(nvml_name: str) -> str | None:
    """Map NVML's device name ("NVIDIA H100 80GB HBM3") to a catalogue model name, or None."""
    for sku in SKUS.values():
        if sku.nvml_name == nvml_name:
            return sku.model
    bare = nvml_name.removeprefix("NVIDIA").strip()
    candidates = [bare, bare.replace(" ", "-")]
    # Board names carry form factor and memory in varying order; try the common shapes.
    if "H100" in bare:
        candidates.append("H100-80GB" if "80GB" in bare or "HBM3" in bare else "H100")
    if "H200" in bare:
        candidates.append("H200-141GB")
    if "A100" in bare:
        candidates.append("A100-80GB" if "80GB" in bare else "A100-40GB")
    for name in candidates:
        try:
            return get_model(name).name
        except UnknownGpuModel:
            continue
    return None
