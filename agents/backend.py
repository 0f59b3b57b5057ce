"""Layer C: the agent's narrow GPU seam, and its NVML implementation over the real pynvml wrappers.

`NvmlBackend` is the only code that talks to NVML. On a GPU host pynvml loads the driver's
`libnvidia-ml.so.1`; in tests and in the embedded demo `agents.sim.shim` stands in for that library,
so this very code runs unchanged against the simulator (reference §9.2).

Rules it keeps (reference §1, §4, §8):
- GI profiles are enumerated by *index* and used by *ID* (`info.id`).
- Instances are created with explicit placement only; automatic placement is not exposed.
- NOT_SUPPORTED from telemetry is a state ("N/A in MIG mode"), never a fault.
- Every NVML failure leaves as `BackendError` carrying NVML's numeric code and name.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pynvml

from agents.isolation.cdi import DEFAULT_SPEC_DIRS
from whalegen.gpus.skus import model_from_nvml_name
from whalegen.protocol import GpuEvent, GpuInventory, MigInstance, NvmlFailure, ProcessSample, TelemetrySample

MIB = 1 << 20
WHOLE_DEVICE = 0xFFFFFFFF
XID_FALLEN_OFF_BUS = 79
EVENT_NAMES = {0x1: "ecc_single", 0x2: "ecc_double", 0x8: "xid", 0x100: "mig_config_change"}
WATCHED_EVENTS = 0x1 | 0x2 | 0x8 | 0x100
# The CDI kind NVIDIA Container Toolkit's `nvidia-ctk cdi generate` writes (whole GPUs and MIG devices).
NVIDIA_CDI_KIND = "nvidia.com/gpu"

# NVML return codes the agent reasons about (values from pynvml; reference §2.1).
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
IN_USE = pynvml.NVML_ERROR_IN_USE
INSUFFICIENT_RESOURCES = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
SUCCESS = pynvml.NVML_SUCCESS

_CODE_NAMES = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_")
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}


def code_name(code: int) -> str:
    return "SUCCESS" if code == 0 else _CODE_NAMES.get(code, f"CODE_{code}")


class BackendError(Exception):
    """An NVML call failed; `failure` is the typed record that goes into reports."""

    def __init__(self, op: str, code: int, gpu_uuid: str = "", detail: str = "") -> None:
        self.failure = NvmlFailure(op=op, code=code, name=code_name(code), gpu_uuid=gpu_uuid, detail=detail)
        super().__init__(f"{op} on {gpu_uuid or 'host'}: NVML {self.failure.name} ({code}) {detail}".strip())

    @property
    def code(self) -> int:
        return self.failure.code


@dataclass(frozen=True)
class GiProfileInfo:
    index: int
    profile_id: int
    name: str  # "1g.10gb" (without the "MIG " prefix)
    compute_slices: int
    max_instances: int
    sm_count: int
    mem_mib: int


@dataclass(frozen=True)
class MigState:
    current: bool
    pending: bool


class GpuBackend(Protocol):
    """What the agent needs from a GPU driver. GPUs are addressed by their NVML index."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def driver_version(self) -> str: ...
    def inventory(self) -> list[GpuInventory]: ...
    def mig_state(self, gpu: int) -> MigState | None: ...
    def set_mig_mode(self, gpu: int, enabled: bool) -> int: ...
    def gi_profiles(self, gpu: int) -> list[GiProfileInfo]: ...
    def placements(self, gpu: int, profile_id: int) -> list[tuple[int, int]]: ...
    def remaining_capacity(self, gpu: int, profile_id: int) -> int: ...
    def instances(self, gpu: int) -> list[MigInstance]: ...
    def create_gi(self, gpu: int, profile_id: int, start: int, size: int) -> int: ...
    def create_default_ci(self, gpu: int, gi_id: int) -> int: ...
    def destroy_ci(self, gpu: int, gi_id: int, ci_id: int) -> None: ...
    def destroy_gi(self, gpu: int, gi_id: int) -> None: ...
    def processes(self, gpu: int) -> list[ProcessSample]: ...
    def telemetry(self, gpu: int) -> TelemetrySample: ...
    def compute_mode(self, gpu: int) -> int: ...
    def set_compute_mode(self, gpu: int, mode: int) -> None: ...
    def events(self, timeout_ms: int = 0) -> list[GpuEvent]: ...
    def task_env(self) -> dict[str, str]: ...
    def cdi_device(self, uuid: str) -> str: ...
    def cdi_spec_dirs(self) -> tuple[Path, ...]: ...
    def refresh_cdi(self) -> str | None: ...


# Where the agent writes the spec it regenerates after a MIG change (a runtime directory: a reboot
# clears it, and nvidia-ctk writes it anew then; /etc/cdi stays the operator's).
NVIDIA_CDI_SPEC = Path("/var/run/cdi/nvidia.yaml")


@contextmanager
def _nvml(op: str, gpu_uuid: str = "") -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as error:
        raise BackendError(op, int(error.value), gpu_uuid) from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """GpuBackend over pynvml. Not thread-safe: the agent's loop is its only caller."""

    def __init__(self, extra_task_env: dict[str, str] | None = None) -> None:
        self._extra_task_env = dict(extra_task_env or {})
        self._uuids: dict[int, str] = {}  # remembered so a lost GPU can still be named
        self._event_set: Any = None
        self._registered: set[int] = set()

    # ---- lifecycle -------------------------------------------------------------------------------
    def open(self) -> None:
        with _nvml("nvmlInit"):
            pynvml.nvmlInit()

    def close(self) -> None:
        if self._event_set is not None:
            with _nvml("nvmlEventSetFree"):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with _nvml("nvmlShutdown"):
            pynvml.nvmlShutdown()

    def task_env(self) -> dict[str, str]:
        return dict(self._extra_task_env)

    def cdi_device(self, uuid: str) -> str:
        """A GPU or MIG UUID → its fully-qualified CDI name (what `podman run --device` takes).

        The name nvidia-ctk writes with `--device-name-strategy=uuid`: the host must have run
        `nvidia-ctk cdi generate --device-name-strategy=uuid --output=/etc/cdi/nvidia.yaml` (again after
        a driver upgrade or a change of MIG layout: a new MIG instance has a new UUID). UUIDs, not
        indices: an index names another device after a MIG re-carve or a GPU falling off the bus."""
        return f"{NVIDIA_CDI_KIND}={uuid}"

    def cdi_spec_dirs(self) -> tuple[Path, ...]:
        """Where this host's CDI specs are, lowest priority first (podman reads the same ones)."""
        return DEFAULT_SPEC_DIRS

    def refresh_cdi(self) -> str | None:
        """Write the host's CDI spec anew (a MIG re-carve gives new instances new UUIDs the old spec does
        not name): `nvidia-ctk cdi generate` when the NVIDIA Container Toolkit is installed. None when
        done; else why not, in words."""
        ctk = shutil.which("nvidia-ctk")
        if ctk is None:
            return "nvidia-ctk is not installed (NVIDIA Container Toolkit), so the CDI spec cannot be renewed"
        command = [ctk, "cdi", "generate", "--device-name-strategy=uuid", f"--output={NVIDIA_CDI_SPEC}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"nvidia-ctk cdi generate failed: {error}"
        if done.returncode != 0:
            return f"nvidia-ctk cdi generate failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
        return None

    def driver_version(self) -> str:
        with _nvml("nvmlSystemGetDriverVersion"):
            return _text(pynvml.nvmlSystemGetDriverVersion())

    # ---- handles ---------------------------------------------------------------------------------
    def _handle(self, gpu: int) -> Any:
        with _nvml("nvmlDeviceGetHandleByIndex", self._uuids.get(gpu, "")):
            return pynvml.nvmlDeviceGetHandleByIndex(gpu)

    def uuid(self, gpu: int) -> str:
        handle = self._handle(gpu)
        with _nvml("nvmlDeviceGetUUID", self._uuids.get(gpu, "")):
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        self._uuids[gpu] = uuid
        return uuid

    def _gi_handle(self, gpu: int, gi_id: int) -> Any:
        with _nvml("nvmlDeviceGetGpuInstanceById", self._uuids.get(gpu, "")):
            return pynvml.nvmlDeviceGetGpuInstanceById(self._handle(gpu), gi_id)

    # ---- inventory and MIG -------------------------------------------------------------------------
    def inventory(self) -> list[GpuInventory]:
        with _nvml("nvmlDeviceGetCount"):
            count = pynvml.nvmlDeviceGetCount()
        found = []
        for index in range(count):
            try:
                found.append(self._describe(index))
            except BackendError as error:
                if error.code != GPU_IS_LOST:
                    raise
                uuid = self._uuids.get(index, f"index-{index}")
                found.append(GpuInventory(index, uuid, "", None, 0, "", False, lost=True))
        return found

    def _describe(self, index: int) -> GpuInventory:
        handle = self._handle(index)
        uuid = self.uuid(index)
        with _nvml("nvmlDeviceGetName", uuid):
            name = _text(pynvml.nvmlDeviceGetName(handle))
        with _nvml("nvmlDeviceGetPciInfo", uuid):
            bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        mig = self.mig_state(index)
        mem_mib = self._total_mem_mib(index, handle, mig)
        return GpuInventory(
            index=index,
            uuid=uuid,
            name=name,
            model=model_from_nvml_name(name),
            mem_mib=mem_mib,
            pci_bus_id=bus_id,
            mig_capable=mig is not None,
            mig_current=bool(mig and mig.current),
            mig_pending=bool(mig and mig.pending),
            instances=tuple(self.instances(index)) if mig and mig.current else (),
        )

    def _total_mem_mib(self, index: int, handle: Any, mig: MigState | None) -> int:
        try:
            with _nvml("nvmlDeviceGetMemoryInfo", self._uuids[index]):
                return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        except BackendError as error:
            # In MIG mode the parent's aggregate needs privilege; the size is then not known here.
            if mig and mig.current and error.code == pynvml.NVML_ERROR_NO_PERMISSION:
                return 0
            raise

    def mig_state(self, gpu: int) -> MigState | None:
        """Current/pending MIG mode, or None on GPUs without MIG (NVML's NOT_SUPPORTED)."""
        handle = self._handle(gpu)
        try:
            with _nvml("nvmlDeviceGetMigMode", self._uuids.get(gpu, "")):
                current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except BackendError as error:
            if error.code == NOT_SUPPORTED:
                return None
            raise
        return MigState(current == pynvml.NVML_DEVICE_MIG_ENABLE, pending == pynvml.NVML_DEVICE_MIG_ENABLE)

    def set_mig_mode(self, gpu: int, enabled: bool) -> int:
        """Returns NVML's activationStatus: SUCCESS, IN_USE (busy) or RESET_REQUIRED (passthrough)."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        with _nvml("nvmlDeviceSetMigMode", self._uuids.get(gpu, "")):
            return int(pynvml.nvmlDeviceSetMigMode(self._handle(gpu), mode))

    def gi_profiles(self, gpu: int) -> list[GiProfileInfo]:
        """Walk profile indexes: NOT_SUPPORTED skips one, INVALID_ARGUMENT ends the list (§4.1)."""
        handle = self._handle(gpu)
        uuid = self._uuids.get(gpu, "")
        version = 2
        found = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                with _nvml("nvmlDeviceGetGpuInstanceProfileInfo", uuid):
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, version)
            except BackendError as error:
                if error.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND and version == 2:
                    version = 1  # a driver without the V call: v1 structs carry no name
                    with _nvml("nvmlDeviceGetGpuInstanceProfileInfo", uuid):
                        try:
                            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, version)
                        except pynvml.NVMLError_NotSupported:
                            continue
                elif error.code == NOT_SUPPORTED:
                    continue
                elif error.code == INVALID_ARGUMENT:
                    break
                else:
                    raise
            name = (
                _text(info.name).removeprefix("MIG ")
                if version == 2
                else self._derived_name(gpu, index, info)
            )
            found.append(
                GiProfileInfo(
                    index=index,
                    profile_id=int(info.id),
                    name=name,
                    compute_slices=int(info.sliceCount),
                    max_instances=int(info.instanceCount),
                    sm_count=int(info.multiprocessorCount),
                    mem_mib=int(info.memorySizeMB),
                )
            )
        return found

    def _derived_name(self, gpu: int, index: int, info: Any) -> str:
        """go-nvlib's profile name from a v1 struct (reference §4.1):
        GB = round(ceil(8 · memorySizeMB · 2^20 / totalMem) / 8 · ceil(totalMem / 1 GiB))."""
        with _nvml("nvmlDeviceGetMemoryInfo", self._uuids.get(gpu, "")):
            total = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle(gpu)).total)
        eighths = -(-8 * int(info.memorySizeMB) * MIB // total)
        # Go's math.Round rounds halves away from zero (H200 3g: 70.5 → 71); Python's round() would not.
        gigabytes = int(eighths / 8 * -(-total // (1 << 30)) + 0.5)
        media = "+me" if index == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 else ""
        return f"{int(info.sliceCount)}g.{gigabytes}gb{media}"

    def placements(self, gpu: int, profile_id: int) -> list[tuple[int, int]]:
        """Every allowed (start, size) of a profile, in memory slices; needs a privileged caller."""
        handle = self._handle(gpu)
        count = ctypes.c_uint(0)
        with _nvml("nvmlDeviceGetGpuInstancePossiblePlacements", self._uuids.get(gpu, "")):
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]

    def remaining_capacity(self, gpu: int, profile_id: int) -> int:
        with _nvml("nvmlDeviceGetGpuInstanceRemainingCapacity", self._uuids.get(gpu, "")):
            return int(pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(self._handle(gpu), profile_id))

    def instances(self, gpu: int) -> list[MigInstance]:
        """Every GI with its CIs, MIG device UUIDs and the PIDs that hold them, sorted by placement."""
        handle = self._handle(gpu)
        uuid = self._uuids.get(gpu, "")
        profiles = self.gi_profiles(gpu)
        mig_uuids = self._mig_device_uuids(gpu)
        busy: dict[int, list[int]] = {}
        for proc in self._raw_processes(handle, uuid):
            if proc[2] != WHOLE_DEVICE:
                busy.setdefault(proc[2], []).append(proc[0])
        found = []
        for profile in profiles:
            array = (pynvml.c_nvmlGpuInstance_t * max(1, profile.max_instances))()
            count = ctypes.c_uint(0)
            with _nvml("nvmlDeviceGetGpuInstances", uuid):
                pynvml.nvmlDeviceGetGpuInstances(handle, profile.profile_id, array, ctypes.byref(count))
            for i in range(count.value):
                with _nvml("nvmlGpuInstanceGetInfo", uuid):
                    info = pynvml.nvmlGpuInstanceGetInfo(array[i])
                gi_id = int(info.id)
                cis = self._compute_instance_ids(array[i], profile.compute_slices, uuid)
                ci_id = cis[0] if cis else None
                found.append(
                    MigInstance(
                        gi_id=gi_id,
                        profile_id=int(info.profileId),
                        profile=profile.name,
                        start=int(info.placement.start),
                        size=int(info.placement.size),
                        ci_id=ci_id,
                        mig_uuid=mig_uuids.get((gi_id, ci_id)) if ci_id is not None else None,
                        mem_mib=profile.mem_mib,
                        busy_pids=tuple(sorted(busy.get(gi_id, []))),
                    )
                )
        return sorted(found, key=lambda inst: inst.start)

    def _compute_instance_ids(self, gi_handle: Any, gi_slices: int, uuid: str) -> list[int]:
        ids = []
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                with _nvml("nvmlGpuInstanceGetComputeInstanceProfileInfo", uuid):
                    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi_handle, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
            except BackendError as error:
                if error.code in (NOT_SUPPORTED, INVALID_ARGUMENT):
                    continue
                raise
            array = (pynvml.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            count = ctypes.c_uint(0)
            with _nvml("nvmlGpuInstanceGetComputeInstances", uuid):
                pynvml.nvmlGpuInstanceGetComputeInstances(gi_handle, info.id, array, ctypes.byref(count))
            for i in range(count.value):
                with _nvml("nvmlComputeInstanceGetInfo", uuid):
                    ids.append(int(pynvml.nvmlComputeInstanceGetInfo(array[i]).id))
        return sorted(ids)

    def _mig_device_uuids(self, gpu: int) -> dict[tuple[int, int], str]:
        """(GI ID, CI ID) → MIG-… UUID, re-enumerated every time: MIG handles are not stable (§4.4)."""
        handle = self._handle(gpu)
        uuid = self._uuids.get(gpu, "")
        with _nvml("nvmlDeviceGetMaxMigDeviceCount", uuid):
            count = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        found: dict[tuple[int, int], str] = {}
        for index in range(count):
            try:
                with _nvml("nvmlDeviceGetMigDeviceHandleByIndex", uuid):
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except BackendError as error:
                if error.code == NOT_FOUND:
                    continue
                raise
            with _nvml("nvmlDeviceGetGpuInstanceId", uuid):
                gi_id = pynvml.nvmlDeviceGetGpuInstanceId(mig)
            with _nvml("nvmlDeviceGetComputeInstanceId", uuid):
                ci_id = pynvml.nvmlDeviceGetComputeInstanceId(mig)
            with _nvml("nvmlDeviceGetUUID", uuid):
                found[(int(gi_id), int(ci_id))] = _text(pynvml.nvmlDeviceGetUUID(mig))
        return found

    def create_gi(self, gpu: int, profile_id: int, start: int, size: int) -> int:
        """Create a GI at an explicit placement; returns its GI ID."""
        placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
        uuid = self._uuids.get(gpu, "")
        with _nvml("nvmlDeviceCreateGpuInstanceWithPlacement", uuid):
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                self._handle(gpu), profile_id, ctypes.byref(placement)
            )
        with _nvml("nvmlGpuInstanceGetInfo", uuid):
            return int(pynvml.nvmlGpuInstanceGetInfo(gi).id)

    def create_default_ci(self, gpu: int, gi_id: int) -> int:
        """Create the CI spanning the whole GI (what `nvidia-smi mig -cgi … -C` does)."""
        uuid = self._uuids.get(gpu, "")
        gi = self._gi_handle(gpu, gi_id)
        widest = None
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                with _nvml("nvmlGpuInstanceGetComputeInstanceProfileInfo", uuid):
                    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
            except BackendError as error:
                if error.code in (NOT_SUPPORTED, INVALID_ARGUMENT):
                    continue
                raise
            if widest is None or info.sliceCount > widest.sliceCount:
                widest = info
        if widest is None:
            raise BackendError(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo", NOT_SUPPORTED, uuid, "no CI profile"
            )
        placement = pynvml.c_nvmlComputeInstancePlacement_t(0, int(widest.sliceCount))
        try:
            with _nvml("nvmlGpuInstanceCreateComputeInstanceWithPlacement", uuid):
                ci = pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
                    gi, widest.id, ctypes.byref(placement)
                )
        except BackendError as error:
            if error.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            # Older drivers lack the placement variant for CIs; a whole-GI CI has only one placement.
            with _nvml("nvmlGpuInstanceCreateComputeInstance", uuid):
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, widest.id)
        with _nvml("nvmlComputeInstanceGetInfo", uuid):
            return int(pynvml.nvmlComputeInstanceGetInfo(ci).id)

    def destroy_ci(self, gpu: int, gi_id: int, ci_id: int) -> None:
        uuid = self._uuids.get(gpu, "")
        gi = self._gi_handle(gpu, gi_id)
        with _nvml("nvmlGpuInstanceGetComputeInstanceById", uuid):
            ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
        with _nvml("nvmlComputeInstanceDestroy", uuid):
            pynvml.nvmlComputeInstanceDestroy(ci)

    def destroy_gi(self, gpu: int, gi_id: int) -> None:
        gi = self._gi_handle(gpu, gi_id)
        with _nvml("nvmlGpuInstanceDestroy", self._uuids.get(gpu, "")):
            pynvml.nvmlGpuInstanceDestroy(gi)

    # ---- processes and telemetry ---------------------------------------------------------------------
    def _raw_processes(self, handle: Any, uuid: str) -> list[tuple[int, int | None, int, int, bool]]:
        """(pid, used MiB, GI ID, CI ID, is MPS client). Calls the versioned wrappers: the
        unversioned ones turn an older driver's FUNCTION_NOT_FOUND into a non-NVML exception."""
        rows = []
        for mps, kind in ((False, "ComputeRunningProcesses"), (True, "MPSComputeRunningProcesses")):
            procs = None
            for version in ("_v3", "_v2"):  # _v2 for drivers older than the pinned binding
                op = f"nvmlDeviceGet{kind}{version}"
                try:
                    with _nvml(op, uuid):
                        procs = getattr(pynvml, op)(handle)
                    break
                except BackendError as error:
                    if error.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND and version == "_v3":
                        continue
                    if error.code == NOT_SUPPORTED:
                        break
                    raise
            for proc in procs or []:
                used = None if proc.usedGpuMemory is None else int(proc.usedGpuMemory) // MIB
                rows.append((int(proc.pid), used, int(proc.gpuInstanceId), int(proc.computeInstanceId), mps))
        return rows

    def processes(self, gpu: int) -> list[ProcessSample]:
        handle = self._handle(gpu)
        uuid = self.uuid(gpu)
        mig_uuids = (
            self._mig_device_uuids(gpu) if (self.mig_state(gpu) or MigState(False, False)).current else {}
        )
        samples = []
        for pid, used, gi_id, ci_id, mps in self._raw_processes(handle, uuid):
            device_uuid = mig_uuids.get((gi_id, ci_id), uuid)
            samples.append(
                ProcessSample(pid=pid, gpu_uuid=uuid, device_uuid=device_uuid, used_mib=used, mps=mps)
            )
        return samples

    def telemetry(self, gpu: int) -> TelemetrySample:
        """One sample; metrics NVML refuses with NOT_SUPPORTED are None and named in `not_supported`."""
        handle = self._handle(gpu)
        uuid = self.uuid(gpu)
        missing: list[str] = []

        def read(metric: str, op: str, call: Any, *args: Any) -> Any:
            try:
                with _nvml(op, uuid):
                    return call(handle, *args)
            except BackendError as error:
                if error.code in (NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION):
                    missing.append(metric)
                    return None
                raise

        memory = read("memory", "nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo)
        util = read("utilization", "nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates)
        power = read("power", "nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage)
        limit = read("power_limit", "nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit)
        temp = read("temperature", "nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, 0)
        sm = read("sm_clock", "nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        mem_clock = read(
            "mem_clock", "nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM
        )
        ecc = read(
            "ecc",
            "nvmlDeviceGetTotalEccErrors",
            pynvml.nvmlDeviceGetTotalEccErrors,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_AGGREGATE_ECC,
        )
        return TelemetrySample(
            gpu_uuid=uuid,
            at_s=time.time(),
            mem_used_mib=None if memory is None else int(memory.used) // MIB,
            mem_total_mib=None if memory is None else int(memory.total) // MIB,
            util_gpu_pct=None if util is None else int(util.gpu),
            util_mem_pct=None if util is None else int(util.memory),
            power_w=None if power is None else power / 1000,
            power_limit_w=None if limit is None else limit / 1000,
            temperature_c=temp,
            sm_clock_mhz=sm,
            mem_clock_mhz=mem_clock,
            ecc_uncorrected_aggregate=ecc,
            not_supported=tuple(missing),
        )

    def compute_mode(self, gpu: int) -> int:
        with _nvml("nvmlDeviceGetComputeMode", self._uuids.get(gpu, "")):
            return int(pynvml.nvmlDeviceGetComputeMode(self._handle(gpu)))

    def set_compute_mode(self, gpu: int, mode: int) -> None:
        with _nvml("nvmlDeviceSetComputeMode", self._uuids.get(gpu, "")):
            pynvml.nvmlDeviceSetComputeMode(self._handle(gpu), mode)

    # ---- events --------------------------------------------------------------------------------------
    def _ensure_registered(self) -> None:
        if self._event_set is None:
            with _nvml("nvmlEventSetCreate"):
                self._event_set = pynvml.nvmlEventSetCreate()
        with _nvml("nvmlDeviceGetCount"):
            count = pynvml.nvmlDeviceGetCount()
        for index in range(count):
            if index in self._registered:
                continue
            try:
                handle = self._handle(index)
                self.uuid(index)
                with _nvml("nvmlDeviceGetSupportedEventTypes", self._uuids.get(index, "")):
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                with _nvml("nvmlDeviceRegisterEvents", self._uuids.get(index, "")):
                    pynvml.nvmlDeviceRegisterEvents(handle, WATCHED_EVENTS & supported, self._event_set)
            except BackendError as error:
                # NOT_SUPPORTED is a capability gap, not ill health (HAMi's rule, §8); a lost GPU is
                # reported through inventory. Anything else is a real failure.
                if error.code not in (NOT_SUPPORTED, GPU_IS_LOST):
                    raise
            self._registered.add(index)

    def _uuid_of_handle(self, handle_value: int | None) -> str:
        for index, uuid in self._uuids.items():
            try:
                if ctypes.cast(self._handle(index), ctypes.c_void_p).value == handle_value:
                    return uuid
            except BackendError:
                continue
        return ""

    def events(self, timeout_ms: int = 0) -> list[GpuEvent]:
        """Drain pending Xid/ECC/MIG-change events; waits at most `timeout_ms` for the first."""
        self._ensure_registered()
        found: list[GpuEvent] = []
        wait_ms = timeout_ms
        while True:
            try:
                with _nvml("nvmlEventSetWait"):
                    data = pynvml.nvmlEventSetWait(self._event_set, wait_ms)
            except BackendError as error:
                if error.code == TIMEOUT:
                    return found
                raise
            wait_ms = 0
            gpu_uuid = self._uuid_of_handle(ctypes.cast(data.device, ctypes.c_void_p).value)
            kind = EVENT_NAMES.get(int(data.eventType), f"event_0x{int(data.eventType):x}")
            xid = int(data.eventData) if kind == "xid" else None
            found.append(
                GpuEvent(
                    gpu_uuid=gpu_uuid,
                    kind=kind,
                    at_s=time.time(),
                    xid=xid,
                    gi_id=None if data.gpuInstanceId == WHOLE_DEVICE else int(data.gpuInstanceId),
                    ci_id=None if data.computeInstanceId == WHOLE_DEVICE else int(data.computeInstanceId),
                    fatal=xid == XID_FALLEN_OFF_BUS,
                )
            )
