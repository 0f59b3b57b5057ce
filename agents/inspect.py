"""Read-only description of a host's GPUs: what `whalegen agent inspect` and `scripts/gpu-check` print.

Makes no mutating NVML call. Each section that NVML refuses is recorded as the typed failure
instead of aborting the whole description (a GPU without MIG answers NOT_SUPPORTED, a non-root user
NO_PERMISSION for placements).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from agents.backend import BackendError, NvmlBackend


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BackendError as error:
        return {"error": error.failure.to_dict()}


def _telemetry(backend: NvmlBackend, index: int) -> dict[str, Any]:
    return backend.telemetry(index).to_dict()


def _processes(backend: NvmlBackend, index: int) -> list[dict[str, Any]]:
    return [p.to_dict() for p in backend.processes(index)]


def _mig_profiles(backend: NvmlBackend, index: int) -> list[dict[str, Any]]:
    rows = []
    for info in backend.gi_profiles(index):
        rows.append(
            {
                "index": info.index,
                "id": info.profile_id,
                "name": info.name,
                "compute_slices": info.compute_slices,
                "max_instances": info.max_instances,
                "sm_count": info.sm_count,
                "mem_mib": info.mem_mib,
                "placements": _try(partial(backend.placements, index, info.profile_id)),
                "remaining_capacity": _try(partial(backend.remaining_capacity, index, info.profile_id)),
            }
        )
    return rows


def inspect_host(backend: NvmlBackend) -> dict[str, Any]:
    gpus = []
    for gpu in backend.inventory():
        entry: dict[str, Any] = {"inventory": gpu.to_dict()}
        if not gpu.lost:
            entry["telemetry"] = _try(partial(_telemetry, backend, gpu.index))
            entry["processes"] = _try(partial(_processes, backend, gpu.index))
            entry["compute_mode"] = _try(partial(backend.compute_mode, gpu.index))
            if gpu.mig_capable and gpu.mig_current:
                entry["mig_profiles"] = _try(partial(_mig_profiles, backend, gpu.index))
        gpus.append(entry)
    return {"ok": True, "driver_version": backend.driver_version(), "gpus": gpus}
