"""Layer B of the simulated NVML: a stand-in for `libnvidia-ml.so` that the real pynvml wrappers call.

Installed as `pynvml.nvmlLib` (with pynvml's function-pointer cache cleared) before `nvmlInit`, it
makes pynvml skip loading the driver library and call these attributes as if they were C
functions (reference §9.2). Each one unpacks ctypes arguments, asks the simulator (Layer A), writes
results through the `byref()` out parameters and returns an NVML return code. Handles travel as
small integers stored in pointer-typed out parameters. A symbol this class lacks raises
AttributeError, which pynvml reports as NVMLError_FunctionNotFound — what an older driver does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from agents.sim.core import Nvml, SimNvmlError, SimSystem

GI_PROFILE_INFO_V2 = 0x02000098  # nvmlGpuInstanceProfileInfo_v2: the real library checks it
CI_PROFILE_INFO_V2 = 0x02000088
_POINTER_SIZE = ctypes.sizeof(ctypes.c_void_p)

_ERROR_NAMES = {
    Nvml.UNINITIALIZED: b"Uninitialized",
    Nvml.INVALID_ARGUMENT: b"Invalid Argument",
    Nvml.NOT_SUPPORTED: b"Not Supported",
    Nvml.NO_PERMISSION: b"Insufficient Permissions",
    Nvml.NOT_FOUND: b"Not Found",
    Nvml.INSUFFICIENT_SIZE: b"Insufficient Size",
    Nvml.TIMEOUT: b"Timeout",
    Nvml.GPU_IS_LOST: b"GPU is lost",
    Nvml.RESET_REQUIRED: b"GPU requires restart",
    Nvml.IN_USE: b"In use by another client",
    Nvml.INSUFFICIENT_RESOURCES: b"Insufficient resources",
    Nvml.VERSION_MISMATCH: b"Version mismatch",
}


def _target(ref: Any) -> Any:
    """The ctypes object behind a byref() argument (or the object itself)."""
    return getattr(ref, "_obj", ref)


def _handle_in(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return ctypes.cast(value, ctypes.c_void_p).value or 0


def _value_in(value: Any) -> int:
    return int(value.value) if hasattr(value, "value") else int(value)


def _put(ref: Any, value: Any) -> None:
    if ref is None:
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null output pointer")
    _target(ref).value = value


def _put_handle_at(address: int, handle: int) -> None:
    ctypes.c_void_p.from_address(address).value = handle


def _put_handle(ref: Any, handle: int) -> None:
    if ref is None:
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null output pointer")
    _put_handle_at(ctypes.addressof(_target(ref)), handle)


def _put_handle_field(struct: Any, name: str, handle: int) -> None:
    _put_handle_at(ctypes.addressof(struct) + getattr(type(struct), name).offset, handle)


def _fill_array(
    array_ref: Any,
    count_ref: Any,
    rows: list[Any],
    write: Callable[[Any, int, Any], None],
    *,
    null_is_query: bool = False,
    count_is_output_only: bool = False,
) -> None:
    """NVML's two-call pattern: a null array asks for the count; a short one gets INSUFFICIENT_SIZE.

    Placement calls document a null array as a plain count query (SUCCESS); the process lists answer
    it with INSUFFICIENT_SIZE when there is something to list, which is what pynvml's wrapper expects.
    The instance lists take an array sized by the profile's instanceCount and only write the count.
    """
    if count_ref is None:
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null count pointer")
    count = _target(count_ref)
    if array_ref is None:
        count.value = len(rows)
        if rows and not null_is_query:
            raise SimNvmlError(Nvml.INSUFFICIENT_SIZE)
        return
    if count.value < len(rows) and not count_is_output_only:
        count.value = len(rows)
        raise SimNvmlError(Nvml.INSUFFICIENT_SIZE)
    array = _target(array_ref)
    for i, row in enumerate(rows):
        write(array, i, row)
    count.value = len(rows)


def _pointer_array_writer(array: Any, i: int, handle: int) -> None:
    _put_handle_at(ctypes.addressof(array) + i * _POINTER_SIZE, handle)


def _placement_writer(array: Any, i: int, row: tuple[int, int]) -> None:
    array[i].start, array[i].size = row


def _process_writer(array: Any, i: int, row: tuple[int, int, int, int]) -> None:
    array[i].pid, array[i].usedGpuMemory, array[i].gpuInstanceId, array[i].computeInstanceId = row


def _as_nvml_function(method: Callable[..., None]) -> Callable[..., int]:
    def symbol(*args: Any) -> int:
        try:
            method(*args)
        except SimNvmlError as error:
            return int(error.code)
        return 0

    symbol.__name__ = method.__name__
    return symbol


class NvmlLibShim:
    """The C symbols pynvml calls, backed by one SimSystem."""

    def __init__(self, system: SimSystem) -> None:
        self.system = system
        self._hidden: set[str] = set()
        # Plain functions, not bound methods: pynvml sets attributes on some (`fn.restype = …`).
        for name in dir(type(self)):
            if name.startswith("nvml") and name != "nvmlErrorString":
                setattr(self, name, _as_nvml_function(getattr(self, name)))
        error_string = type(self).nvmlErrorString

        def nvmlErrorString(result: Any) -> bytes:
            return error_string(self, result)

        self.nvmlErrorString = nvmlErrorString  # type: ignore[method-assign]

    def symbols(self) -> set[str]:
        return {name for name in dir(type(self)) if name.startswith("nvml")} - self._hidden

    def hide(self, *names: str) -> None:
        """Behave like an older driver that lacks these symbols (pynvml: FUNCTION_NOT_FOUND)."""
        self._hidden.update(names)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "_hidden"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # ---- init and system ----
    def nvmlInitWithFlags(self, flags: Any) -> None:
        self.system.init(_value_in(flags))

    def nvmlShutdown(self) -> None:
        self.system.shutdown()

    def nvmlErrorString(self, result: Any) -> bytes:
        code = _value_in(result)
        try:
            return _ERROR_NAMES.get(Nvml(code), b"Unknown Error")
        except ValueError:
            return b"Unknown Error"

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> None:
        version = self.system.driver().encode()
        if len(version) >= _value_in(size):
            raise SimNvmlError(Nvml.INSUFFICIENT_SIZE)
        buffer.value = version

    # ---- devices ----
    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> None:
        _put(count_ref, self.system.device_count())

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device_ref: Any) -> None:
        _put_handle(device_ref, self.system.handle_by_index(_value_in(index)))

    def nvmlDeviceGetName(self, device: Any, buffer: Any, size: Any) -> None:
        buffer.value = self.system.name(_handle_in(device)).encode()[: _value_in(size) - 1]

    def nvmlDeviceGetUUID(self, device: Any, buffer: Any, size: Any) -> None:
        buffer.value = self.system.device_uuid(_handle_in(device)).encode()[: _value_in(size) - 1]

    def nvmlDeviceGetPciInfo_v3(self, device: Any, info_ref: Any) -> None:
        bus_id, device_id = self.system.pci_info(_handle_in(device))
        info = _target(info_ref)
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id.encode()
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = device_id

    def nvmlDeviceGetMemoryInfo(self, device: Any, memory_ref: Any) -> None:
        memory = _target(memory_ref)
        memory.total, memory.free, memory.used = self.system.memory_info(_handle_in(device))

    def nvmlDeviceGetMemoryInfo_v2(self, device: Any, memory_ref: Any) -> None:
        memory = _target(memory_ref)
        memory.total, memory.free, memory.used = self.system.memory_info(_handle_in(device))
        memory.reserved = 0

    # ---- MIG mode and GPU instances ----
    def nvmlDeviceGetMigMode(self, device: Any, current_ref: Any, pending_ref: Any) -> None:
        current, pending = self.system.get_mig_mode(_handle_in(device))
        _put(current_ref, current)
        _put(pending_ref, pending)

    def nvmlDeviceSetMigMode(self, device: Any, mode: Any, status_ref: Any) -> None:
        _put(status_ref, self.system.set_mig_mode(_handle_in(device), _value_in(mode)))

    def _gi_profile_info(self, device: Any, index: Any, info_ref: Any, *, v2: bool) -> None:
        info = _target(info_ref)
        if v2 and info.version != GI_PROFILE_INFO_V2:
            raise SimNvmlError(Nvml.VERSION_MISMATCH)
        profile = self.system.gi_profile_info(_handle_in(device), _value_in(index))
        info.id = profile.profile_id
        info.isP2pSupported = 0
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_instances
        info.multiprocessorCount = profile.sm_count or 0
        # Engines scale with the compute slices (the 7g carries all of them); +me adds the media ones.
        info.copyEngineCount = max(1, profile.compute_slices)
        media = 1 if profile.name.endswith("+me") or profile.compute_slices == 7 else 0
        info.decoderCount = profile.compute_slices // 2 if not media else max(1, profile.compute_slices)
        info.encoderCount = 0
        info.jpegCount = media
        info.ofaCount = media
        info.memorySizeMB = profile.mem_mib
        if v2:
            info.name = f"MIG {profile.name}".encode()

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, device: Any, index: Any, info_ref: Any) -> None:
        self._gi_profile_info(device, index, info_ref, v2=True)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, index: Any, info_ref: Any) -> None:
        self._gi_profile_info(device, index, info_ref, v2=False)

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, device: Any, profile_id: Any, placements_ref: Any, count_ref: Any
    ) -> None:
        rows = self.system.gi_possible_placements(_handle_in(device), _value_in(profile_id))
        _fill_array(placements_ref, count_ref, rows, _placement_writer, null_is_query=True)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profile_id: Any, count_ref: Any) -> None:
        _put(count_ref, self.system.gi_remaining_capacity(_handle_in(device), _value_in(profile_id)))

    def nvmlDeviceCreateGpuInstance(self, device: Any, profile_id: Any, instance_ref: Any) -> None:
        _put_handle(instance_ref, self.system.create_gi(_handle_in(device), _value_in(profile_id)))

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profile_id: Any, placement_ref: Any, instance_ref: Any
    ) -> None:
        if placement_ref is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null placement pointer")
        placement = _target(placement_ref)
        handle = self.system.create_gi_with_placement(
            _handle_in(device), _value_in(profile_id), int(placement.start), int(placement.size)
        )
        _put_handle(instance_ref, handle)

    def nvmlDeviceGetGpuInstances(self, device: Any, profile_id: Any, array_ref: Any, count_ref: Any) -> None:
        handles = self.system.gpu_instances(_handle_in(device), _value_in(profile_id))
        if array_ref is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null instance array")
        _fill_array(array_ref, count_ref, handles, _pointer_array_writer, count_is_output_only=True)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gi_id: Any, instance_ref: Any) -> None:
        _put_handle(instance_ref, self.system.gpu_instance_by_id(_handle_in(device), _value_in(gi_id)))

    def nvmlGpuInstanceGetInfo(self, instance: Any, info_ref: Any) -> None:
        device, gi_id, profile_id, start, size = self.system.gi_info(_handle_in(instance))
        info = _target(info_ref)
        _put_handle_field(info, "device", device)
        info.id, info.profileId = gi_id, profile_id
        info.placement.start, info.placement.size = start, size

    def nvmlGpuInstanceDestroy(self, instance: Any) -> None:
        self.system.gi_destroy(_handle_in(instance))

    # ---- compute instances ----
    def _ci_profile_info(self, instance: Any, index: Any, engine: Any, info_ref: Any, *, v2: bool) -> None:
        info = _target(info_ref)
        if v2 and info.version != CI_PROFILE_INFO_V2:
            raise SimNvmlError(Nvml.VERSION_MISMATCH)
        profile, gi = self.system.ci_profile_info(_handle_in(instance), _value_in(index), _value_in(engine))
        info.id = profile.profile_id
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_instances
        gi_sms = gi.profile.sm_count or 0
        info.multiprocessorCount = gi_sms * profile.compute_slices // gi.profile.compute_slices
        info.sharedCopyEngineCount = max(1, gi.profile.compute_slices)
        info.sharedDecoderCount = gi.profile.compute_slices // 2
        info.sharedEncoderCount = info.sharedJpegCount = info.sharedOfaCount = 0
        if v2:
            info.name = f"MIG {profile.name}".encode()

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, instance: Any, index: Any, engine_profile: Any, info_ref: Any
    ) -> None:
        self._ci_profile_info(instance, index, engine_profile, info_ref, v2=True)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, instance: Any, index: Any, engine_profile: Any, info_ref: Any
    ) -> None:
        self._ci_profile_info(instance, index, engine_profile, info_ref, v2=False)

    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        self, instance: Any, profile_id: Any, placements_ref: Any, count_ref: Any
    ) -> None:
        rows = self.system.ci_possible_placements(_handle_in(instance), _value_in(profile_id))
        _fill_array(placements_ref, count_ref, rows, _placement_writer, null_is_query=True)

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, instance: Any, profile_id: Any, count_ref: Any
    ) -> None:
        _put(count_ref, self.system.ci_remaining_capacity(_handle_in(instance), _value_in(profile_id)))

    def nvmlGpuInstanceCreateComputeInstance(self, instance: Any, profile_id: Any, ci_ref: Any) -> None:
        _put_handle(ci_ref, self.system.create_ci(_handle_in(instance), _value_in(profile_id)))

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, instance: Any, profile_id: Any, placement_ref: Any, ci_ref: Any
    ) -> None:
        if placement_ref is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null placement pointer")
        placement = _target(placement_ref)
        handle = self.system.create_ci_with_placement(
            _handle_in(instance), _value_in(profile_id), int(placement.start), int(placement.size)
        )
        _put_handle(ci_ref, handle)

    def nvmlGpuInstanceGetComputeInstances(
        self, instance: Any, profile_id: Any, array_ref: Any, count_ref: Any
    ) -> None:
        handles = self.system.compute_instances(_handle_in(instance), _value_in(profile_id))
        if array_ref is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "null instance array")
        _fill_array(array_ref, count_ref, handles, _pointer_array_writer, count_is_output_only=True)

    def nvmlGpuInstanceGetComputeInstanceById(self, instance: Any, ci_id: Any, ci_ref: Any) -> None:
        _put_handle(ci_ref, self.system.compute_instance_by_id(_handle_in(instance), _value_in(ci_id)))

    def nvmlComputeInstanceGetInfo_v2(self, ci: Any, info_ref: Any) -> None:
        device, gi, ci_id, profile_id, start, size = self.system.ci_info(_handle_in(ci))
        info = _target(info_ref)
        _put_handle_field(info, "device", device)
        _put_handle_field(info, "gpuInstance", gi)
        info.id, info.profileId = ci_id, profile_id
        info.placement.start, info.placement.size = start, size

    def nvmlComputeInstanceDestroy(self, ci: Any) -> None:
        self.system.ci_destroy(_handle_in(ci))

    # ---- MIG device handles ----
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any, count_ref: Any) -> None:
        _put(count_ref, self.system.max_mig_device_count(_handle_in(device)))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: Any, mig_ref: Any) -> None:
        _put_handle(mig_ref, self.system.mig_device_by_index(_handle_in(device), _value_in(index)))

    def nvmlDeviceIsMigDeviceHandle(self, device: Any, flag_ref: Any) -> None:
        _put(flag_ref, int(self.system.is_mig_device(_handle_in(device))))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig: Any, device_ref: Any) -> None:
        _put_handle(device_ref, self.system.parent_of(_handle_in(mig)))

    def nvmlDeviceGetGpuInstanceId(self, device: Any, id_ref: Any) -> None:
        _put(id_ref, self.system.mig_gi_id(_handle_in(device)))

    def nvmlDeviceGetComputeInstanceId(self, device: Any, id_ref: Any) -> None:
        _put(id_ref, self.system.mig_ci_id(_handle_in(device)))

    # ---- processes and telemetry ----
    def _processes(self, device: Any, count_ref: Any, array_ref: Any, *, mps: bool) -> None:
        read = self.system.mps_processes if mps else self.system.compute_processes
        _fill_array(array_ref, count_ref, read(_handle_in(device)), _process_writer)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, device: Any, count_ref: Any, array_ref: Any) -> None:
        self._processes(device, count_ref, array_ref, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, device: Any, count_ref: Any, array_ref: Any) -> None:
        self._processes(device, count_ref, array_ref, mps=True)

    # The _v2 process structs have the same layout in this binding (c_nvmlProcessInfo_v3_t is _v2_t).
    def nvmlDeviceGetComputeRunningProcesses_v2(self, device: Any, count_ref: Any, array_ref: Any) -> None:
        self._processes(device, count_ref, array_ref, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, device: Any, count_ref: Any, array_ref: Any) -> None:
        self._processes(device, count_ref, array_ref, mps=True)

    def nvmlDeviceGetUtilizationRates(self, device: Any, util_ref: Any) -> None:
        util = _target(util_ref)
        util.gpu, util.memory = self.system.utilization(_handle_in(device))

    def nvmlDeviceGetClockInfo(self, device: Any, clock_type: Any, clock_ref: Any) -> None:
        _put(clock_ref, self.system.clock_info(_handle_in(device), _value_in(clock_type)))

    def nvmlDeviceGetPowerUsage(self, device: Any, power_ref: Any) -> None:
        _put(power_ref, self.system.power_usage_mw(_handle_in(device)))

    def nvmlDeviceGetEnforcedPowerLimit(self, device: Any, limit_ref: Any) -> None:
        _put(limit_ref, self.system.power_limit_mw(_handle_in(device)))

    def nvmlDeviceGetTemperature(self, device: Any, sensor: Any, temp_ref: Any) -> None:
        _put(temp_ref, self.system.temperature_c(_handle_in(device), _value_in(sensor)))

    def nvmlDeviceGetTotalEccErrors(
        self, device: Any, error_type: Any, counter_type: Any, count_ref: Any
    ) -> None:
        count = self.system.total_ecc_errors(
            _handle_in(device), _value_in(error_type), _value_in(counter_type)
        )
        _put(count_ref, count)

    def nvmlDeviceGetRemappedRows(self, device: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> None:
        for ref, value in zip(
            (corr, unc, pending, failure), self.system.remapped_rows(_handle_in(device)), strict=True
        ):
            _put(ref, value)

    def nvmlDeviceGetComputeMode(self, device: Any, mode_ref: Any) -> None:
        _put(mode_ref, self.system.get_compute_mode(_handle_in(device)))

    def nvmlDeviceSetComputeMode(self, device: Any, mode: Any) -> None:
        self.system.set_compute_mode(_handle_in(device), _value_in(mode))

    # ---- events ----
    def nvmlEventSetCreate(self, set_ref: Any) -> None:
        _put_handle(set_ref, self.system.event_set_create())

    def nvmlDeviceGetSupportedEventTypes(self, device: Any, types_ref: Any) -> None:
        _put(types_ref, self.system.supported_event_types(_handle_in(device)))

    def nvmlDeviceRegisterEvents(self, device: Any, event_types: Any, event_set: Any) -> None:
        self.system.register_events(_handle_in(device), _value_in(event_types), _handle_in(event_set))

    def nvmlEventSetWait_v2(self, event_set: Any, data_ref: Any, timeout_ms: Any) -> None:
        device, event_type, event_data, gi_id, ci_id = self.system.event_wait(
            _handle_in(event_set), _value_in(timeout_ms)
        )
        data = _target(data_ref)
        _put_handle_field(data, "device", device)
        data.eventType, data.eventData = event_type, event_data
        data.gpuInstanceId, data.computeInstanceId = gi_id, ci_id

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.system.event_set_free(_handle_in(event_set))


def install(system: SimSystem) -> NvmlLibShim:
    """Make the real pynvml talk to `system`. Call before nvmlInit; one simulator per process."""
    import pynvml

    shim = NvmlLibShim(system)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = shim
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return shim


def uninstall() -> None:
    import pynvml

    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
