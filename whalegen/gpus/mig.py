"""MIG GPU-instance profile tables and their placement geometry.

Source: reference/gpu-partitioning.md §4.5. A100, H100 and H200 have 8 memory slices and 7 compute
slices. Placements are counted in *memory* slices: a GI may be created iff its start is in the
profile's list, its memory slices overlap no existing GI, and the profile's instance count is not
reached. Rows carry the provenance of their figures: `observed` (captured `nvidia-smi mig -lgip`) or
`inferred` (H200 placements follow the H100 fractions; 4g.71gb memory and SMs were never captured).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    profile_id: int  # NVML profile ID: what create/placement calls and `nvidia-smi mig -lgip` use
    index: int  # NVML_GPU_INSTANCE_PROFILE_* constant passed to GetGpuInstanceProfileInfo
    name: str  # e.g. "3g.40gb"
    compute_slices: int
    memory_slices: int
    max_instances: int
    starts: tuple[int, ...]  # allowed start memory slice
    mem_mib: int
    sm_count: int | None  # read multiprocessorCount on hardware; None where never captured
    provenance: str = "observed"

    @property
    def gpu_milli(self) -> int:
        """Share of the GPU's compute, in thousandths, as its share of the 7 compute slices."""
        return self.compute_slices * 1000 // COMPUTE_SLICES

    def slice_mask(self, start: int) -> int:
        """Bitmask of the memory slices a GI of this profile occupies when placed at `start`."""
        return ((1 << self.memory_slices) - 1) << start


# (profile ID, index constant, compute slices, memory slices, max instances, starts)
_GEOMETRY: dict[str, tuple[int, int, int, int, int, tuple[int, ...]]] = {
    "1g": (19, 0x0, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": (20, 0x7, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g2": (15, 0x9, 1, 2, 4, (0, 2, 4, 6)),  # the double-memory 1g
    "2g": (14, 0x1, 2, 2, 3, (0, 2, 4)),
    "3g": (9, 0x2, 3, 4, 2, (0, 4)),
    "4g": (5, 0x3, 4, 4, 1, (0,)),
    "7g": (0, 0x4, 7, 8, 1, (0,)),
}


def _table(rows: Iterable[tuple[str, str, int, int | None, str]]) -> tuple[MigProfile, ...]:
    profiles = []
    for key, name, mem_mib, sm_count, provenance in rows:
        pid, index, cs, ms, max_n, starts = _GEOMETRY[key]
        profiles.append(MigProfile(pid, index, name, cs, ms, max_n, starts, mem_mib, sm_count, provenance))
    return tuple(profiles)


MIG_TABLES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _table(
        [
            ("1g", "1g.5gb", 4_864, 14, "observed"),
            ("1g+me", "1g.5gb+me", 4_864, 14, "observed"),
            ("1g2", "1g.10gb", 9_856, 14, "observed"),
            ("2g", "2g.10gb", 9_856, 28, "observed"),
            ("3g", "3g.20gb", 19_968, 42, "observed"),
            ("4g", "4g.20gb", 19_968, 56, "observed"),
            ("7g", "7g.40gb", 40_192, 98, "observed"),
        ]
    ),
    "A100-80GB": _table(
        [
            ("1g", "1g.10gb", 9_728, 14, "observed"),
            ("1g+me", "1g.10gb+me", 9_728, 14, "observed"),
            ("1g2", "1g.20gb", 19_968, 14, "observed"),
            ("2g", "2g.20gb", 19_968, 28, "observed"),
            ("3g", "3g.40gb", 40_192, 42, "observed"),
            ("4g", "4g.40gb", 40_192, 56, "observed"),
            ("7g", "7g.80gb", 80_896, 98, "observed"),
        ]
    ),
    "H100-80GB": _table(
        [
            ("1g", "1g.10gb", 9_984, 16, "observed"),
            ("1g+me", "1g.10gb+me", 9_984, 16, "observed"),
            ("1g2", "1g.20gb", 20_096, 26, "observed"),
            ("2g", "2g.20gb", 20_096, 32, "observed"),
            ("3g", "3g.40gb", 40_448, 60, "observed"),
            ("4g", "4g.40gb", 40_448, 64, "observed"),
            ("7g", "7g.80gb", 81_152, 132, "observed"),
        ]
    ),
    "H200-141GB": _table(
        [
            ("1g", "1g.18gb", 16_384, 16, "inferred"),
            ("1g+me", "1g.18gb+me", 16_384, 16, "inferred"),
            ("1g2", "1g.35gb", 33_280, 26, "inferred"),
            ("2g", "2g.35gb", 33_280, 32, "inferred"),
            ("3g", "3g.71gb", 71_424, 60, "inferred"),
            ("4g", "4g.71gb", 71_424, None, "inferred"),
            ("7g", "7g.141gb", 143_360, 132, "inferred"),
        ]
    ),
}


def mig_profiles(model_name: str) -> tuple[MigProfile, ...]:
    """The GI profiles of a MIG-capable model (canonical name); empty for models without MIG."""
    return MIG_TABLES.get(model_name, ())


def profile_by_name(model_name: str, profile_name: str) -> MigProfile:
    for profile in mig_profiles(model_name):
        if profile.name == profile_name:
            return profile
    known = ", ".join(p.name for p in mig_profiles(model_name)) or "none"
    raise LookupError(f"{model_name} has no MIG profile {profile_name!r} (known: {known})")


def profile_by_id(model_name: str, profile_id: int) -> MigProfile:
    for profile in mig_profiles(model_name):
        if profile.profile_id == profile_id:
            return profile
    raise LookupError(f"{model_name} has no MIG profile with ID {profile_id}")


@dataclass(frozen=True)
class CiProfile:
    """A compute-instance profile inside a GI profile. Placements count *compute* slices of the GI.

    CI profile IDs equal their NVML_COMPUTE_INSTANCE_PROFILE_* index (observed in `nvidia-smi`:
    `-cci 0` gives 1c). The start lists mirror the GI placement rules in compute-slice space
    (1c anywhere, 2c on even starts, 3c at 0 and 4 of a 7g); they are inferred, not captured (§10.1).
    """

    profile_id: int
    index: int
    compute_slices: int
    max_instances: int
    starts: tuple[int, ...]
    gi_compute_slices: int
    provenance: str = "inferred"

    @property
    def name(self) -> str:
        # go-nvlib drops the "<C>c." prefix when the CI spans the whole GI (§4.1).
        if self.compute_slices == self.gi_compute_slices:
            return f"{self.gi_compute_slices}g"
        return f"{self.compute_slices}c.{self.gi_compute_slices}g"

    def slice_mask(self, start: int) -> int:
        return ((1 << self.compute_slices) - 1) << start


# CI index constant by compute-slice size (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE).
_CI_INDEX_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}
# GI compute slices → {CI compute slices → allowed starts (compute slices)}.
_CI_GEOMETRY: dict[int, dict[int, tuple[int, ...]]] = {
    7: {1: (0, 1, 2, 3, 4, 5, 6), 2: (0, 2, 4), 3: (0, 4), 4: (0,), 7: (0,)},
    4: {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)},
    3: {1: (0, 1, 2), 2: (0,), 3: (0,)},
    2: {1: (0, 1), 2: (0,)},
    1: {1: (0,)},
}


def ci_profiles(gi_profile: MigProfile) -> tuple[CiProfile, ...]:
    """The compute-instance profiles a GI of this profile offers, smallest first."""
    rows = _CI_GEOMETRY[gi_profile.compute_slices]
    return tuple(
        CiProfile(
            profile_id=_CI_INDEX_BY_SLICES[size],
            index=_CI_INDEX_BY_SLICES[size],
            compute_slices=size,
            max_instances=len(starts),
            starts=starts,
            gi_compute_slices=gi_profile.compute_slices,
        )
        for size, starts in sorted(rows.items())
    )


def full_ci_profile(gi_profile: MigProfile) -> CiProfile:
    """The CI that spans the whole GI: what `nvidia-smi mig -cgi … -C` creates by default."""
    return ci_profiles(gi_profile)[-1]
