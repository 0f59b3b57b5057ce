"""Contract tests on a real NVIDIA GPU (`-m gpu`): the NvmlBackend against the driver, read-only.

Deselected in the normal run (`scripts/test` passes `-m "not gpu"`); on a host without NVML they skip
with that reason. A failure here means a simulator fixture disagrees with hardware: fix the fixture.
"""

from __future__ import annotations

import ctypes.util

import pytest

from agents.backend import NvmlBackend
from whalegen.gpus import mig_profiles

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is None, reason="no NVML on this host"),
]


@pytest.fixture
def backend():  # type: ignore[no-untyped-def]
    real = NvmlBackend()
    real.open()
    yield real
    real.close()


def test_inventory_names_every_gpu_with_a_uuid_and_memory(backend: NvmlBackend) -> None:
    inventory = backend.inventory()
    assert inventory and all(g.uuid.startswith("GPU-") and g.mem_mib > 0 for g in inventory if not g.lost)


def test_profile_index_to_id_and_placements_match_the_fixtures(backend: NvmlBackend) -> None:
    checked = 0
    for gpu in backend.inventory():
        if not (gpu.mig_current and gpu.model and mig_profiles(gpu.model)):
            continue
        ours = {p.index: p for p in mig_profiles(gpu.model)}
        for info in backend.gi_profiles(gpu.index):
            assert info.profile_id == ours[info.index].profile_id, info
            starts = [start for start, _ in backend.placements(gpu.index, info.profile_id)]
            assert starts == list(ours[info.index].starts), info
            checked += 1
    if checked == 0:
        pytest.skip("no MIG-enabled GPU of a catalogued model here")


def test_telemetry_never_raises_and_names_mig_holes(backend: NvmlBackend) -> None:
    for gpu in backend.inventory():
        if gpu.lost:
            continue
        sample = backend.telemetry(gpu.index)
        if gpu.mig_current:
            assert sample.util_gpu_pct is None and "utilization" in sample.not_supported
        else:
            assert sample.util_gpu_pct is not None
        backend.processes(gpu.index)
        if gpu.mig_current:
            assert all(
                i.mig_uuid is None or i.mig_uuid.startswith("MIG-") for i in backend.instances(gpu.index)
            )
