"""The simulated NVML through the real pynvml wrappers: NVML's rules and error codes, call log, faults."""

from __future__ import annotations

import ast
import ctypes
import inspect
import re
from pathlib import Path

import pynvml
import pytest

from agents import backend as backend_module
from agents.backend import BackendError, NvmlBackend
from agents.sim.backend import simulated_backend
from agents.sim.core import MUTATING, Nvml, SimNvmlError, SimSystem
from agents.sim.shim import NvmlLibShim, install
from agents.sim.spec import SpecError, build_system

ROOT = Path(__file__).resolve().parents[2]


def host(*gpus: dict[str, object], root: bool = True, **node: object) -> SimSystem:
    return build_system({"nodes": [{"name": "t", "root": root, "gpus": list(gpus), **node}]})


def opened(system: SimSystem) -> NvmlBackend:
    backend = simulated_backend(system)
    backend.open()
    return backend


def nvml_code(call, *args) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(pynvml.NVMLError) as caught:
        call(*args)
    return int(caught.value.value)


# ---- Layer B: the shim covers what pynvml calls -----------------------------------------------------
def _pynvml_wrappers_used_by_backend() -> set[str]:
    tree = ast.parse(Path(inspect.getfile(backend_module)).read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "pynvml"
        and node.attr.startswith("nvml")
    }


def _c_symbols(wrapper_name: str, seen: set[str] | None = None) -> set[str]:
    """C symbols a pynvml wrapper fetches, following wrappers that call other wrappers."""
    seen = seen if seen is not None else set()
    if wrapper_name in seen:
        return set()
    seen.add(wrapper_name)
    source = inspect.getsource(getattr(pynvml, wrapper_name))
    symbols = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    for callee in re.findall(r"\b(nvml\w+)\(", source):
        if callee != wrapper_name and callable(getattr(pynvml, callee, None)):
            symbols |= _c_symbols(callee, seen)
    return symbols


def test_the_shim_implements_every_symbol_the_backend_makes_pynvml_call() -> None:
    """Fails loudly when a pynvml upgrade (or a new backend call) needs a symbol the shim lacks."""
    wrappers = _pynvml_wrappers_used_by_backend()
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in wrappers
    needed = set().union(*(_c_symbols(name) for name in wrappers)) | {"nvmlInitWithFlags", "nvmlErrorString"}
    missing = needed - NvmlLibShim(host({"sku": "l40s"})).symbols()
    assert missing == set(), f"pynvml would raise FunctionNotFound for {sorted(missing)}"


def test_pynvml_version_is_the_pinned_one() -> None:
    from importlib.metadata import version

    assert version("nvidia-ml-py") == "13.615.71"


def test_an_older_driver_without_v3_process_symbols_falls_back_to_v2() -> None:
    system = host({"sku": "l40s"})
    backend = opened(system)
    system.add_process(31, 0, used_mib=512)
    pynvml.nvmlLib.hide(
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3"
    )
    pynvml._nvmlGetFunctionPointer_cache.clear()
    assert [(p.pid, p.used_mib) for p in backend.processes(0)] == [(31, 512)]
    calls = [r.function for r in system.log.entries if "RunningProcesses" in r.function]
    assert calls[-2:] == [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    ]


def test_an_older_driver_without_ci_placement_still_gets_its_whole_gi_compute_instance() -> None:
    backend = opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}))
    pynvml.nvmlLib.hide("nvmlGpuInstanceCreateComputeInstanceWithPlacement")
    pynvml._nvmlGetFunctionPointer_cache.clear()
    gi = backend.create_gi(0, 9, 0, 4)
    backend.create_default_ci(0, gi)
    (instance,) = backend.instances(0)
    assert instance.ci_id is not None and instance.mig_uuid is not None


@pytest.mark.parametrize("sku", ["a100-40gb", "a100-80gb", "h100-80gb-sxm", "h200-141gb"])
def test_without_the_v2_profile_call_names_are_derived_like_go_nvlib(sku: str) -> None:
    backend = opened(host({"sku": sku, "mig": "enabled"}))
    named = [(p.profile_id, p.name) for p in backend.gi_profiles(0)]
    pynvml.nvmlLib.hide("nvmlDeviceGetGpuInstanceProfileInfoV")
    pynvml._nvmlGetFunctionPointer_cache.clear()
    assert [(p.profile_id, p.name) for p in backend.gi_profiles(0)] == named


def test_a_missing_symbol_surfaces_as_function_not_found_like_an_old_driver() -> None:
    backend = opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}))
    pynvml.nvmlLib.hide("nvmlDeviceCreateGpuInstanceWithPlacement")  # pre-R460
    pynvml._nvmlGetFunctionPointer_cache.clear()
    with pytest.raises(BackendError) as caught:
        backend.create_gi(0, 9, 0, 4)
    assert caught.value.failure.name == "FUNCTION_NOT_FOUND" and caught.value.code == 13


# ---- Layer A rules, seen through the real wrappers ---------------------------------------------------
def test_calls_before_init_are_uninitialized() -> None:
    install(host({"sku": "l40s"}))
    assert pynvml.nvmlLib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())) == Nvml.UNINITIALIZED


def test_mig_mode_on_a_gpu_without_mig_is_not_supported() -> None:
    opened(host({"sku": "l40s"}))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml_code(pynvml.nvmlDeviceGetMigMode, handle) == Nvml.NOT_SUPPORTED
    assert NvmlBackend().mig_state(0) is None


def test_profile_index_is_not_profile_id() -> None:
    backend = opened(host({"sku": "h200-141gb", "mig": "enabled"}))
    by_index = {p.index: (p.profile_id, p.name) for p in backend.gi_profiles(0)}
    assert by_index == {
        0: (19, "1g.18gb"),
        1: (14, "2g.35gb"),
        2: (9, "3g.71gb"),
        3: (5, "4g.71gb"),
        4: (0, "7g.141gb"),
        7: (20, "1g.18gb+me"),
        9: (15, "1g.35gb"),
    }


def test_placements_are_in_memory_slices_and_ignore_occupancy() -> None:
    backend = opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}))
    assert backend.placements(0, 9) == [(0, 4), (4, 4)]
    assert backend.placements(0, 15) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    backend.create_gi(0, 0, 0, 8)
    assert backend.placements(0, 9) == [(0, 4), (4, 4)]
    assert backend.remaining_capacity(0, 9) == 0


@pytest.mark.parametrize(
    ("creates", "code"),
    [
        ([(14, 0, 2), (14, 2, 2), (14, 4, 2), (14, 6, 2)], Nvml.INVALID_ARGUMENT),  # 2g may not start at 6
        ([(9, 0, 4), (9, 4, 4), (19, 0, 1)], Nvml.INSUFFICIENT_RESOURCES),  # 3g + 3g + 1g
        ([(19, 6, 1), (15, 6, 2)], Nvml.INSUFFICIENT_RESOURCES),  # overlap at slice 6
        ([(20, 0, 1), (20, 1, 1)], Nvml.INSUFFICIENT_RESOURCES),  # +me: one instance only
        ([(9, 0, 3)], Nvml.INVALID_ARGUMENT),  # size in compute slices, as go-nvml's mock has it
        ([(42, 0, 1)], Nvml.INVALID_ARGUMENT),  # unknown profile ID
    ],
)
def test_creation_enforces_the_geometry_with_nvmls_codes(
    creates: list[tuple[int, int, int]], code: int
) -> None:
    backend = opened(host({"sku": "a100-40gb", "mig": "enabled"}))
    for profile_id, start, size in creates[:-1]:
        backend.create_gi(0, profile_id, start, size)
    with pytest.raises(BackendError) as caught:
        backend.create_gi(0, *creates[-1])
    assert caught.value.code == code


def test_creating_while_mig_is_only_pending_is_not_supported() -> None:
    """Ampere in a passthrough VM: SetMigMode succeeds, activation says RESET_REQUIRED, mode pends."""
    system = host({"sku": "a100-80gb", "reset_supported": False})
    backend = opened(system)
    assert backend.set_mig_mode(0, True) == Nvml.RESET_REQUIRED
    state = backend.mig_state(0)
    assert state is not None and (state.current, state.pending) == (False, True)
    with pytest.raises(BackendError) as caught:
        backend.create_gi(0, 9, 0, 4)
    assert caught.value.failure.name == "NOT_SUPPORTED"


def test_hopper_applies_mig_mode_at_once_and_forgets_it_on_driver_reload() -> None:
    system = host({"sku": "h100-80gb-sxm"})
    backend = opened(system)
    assert backend.set_mig_mode(0, True) == Nvml.SUCCESS
    assert backend.mig_state(0) == backend_module.MigState(True, True)
    backend.create_gi(0, 9, 0, 4)
    system.reload_driver()
    assert backend.mig_state(0) == backend_module.MigState(False, False)
    ampere = host({"sku": "a100-40gb", "mig": "enabled"})
    ampere.reload_driver()
    assert (ampere.gpus[0].mig_current, ampere.gpus[0].gis) == (1, {})


def test_mig_mode_change_with_a_busy_gpu_stays_pending_with_in_use() -> None:
    system = host({"sku": "h200-141gb"})
    backend = opened(system)
    system.add_process(4242, 0, used_mib=100)
    assert backend.set_mig_mode(0, True) == Nvml.IN_USE
    assert backend.mig_state(0) == backend_module.MigState(False, True)
    system.remove_process(4242)
    system.gpus[0].attached_clients.add("nvidia-dcgm")
    assert backend.set_mig_mode(0, True) == Nvml.IN_USE


def test_non_root_gets_no_permission_unless_the_mig_config_capability_is_granted() -> None:
    backend = opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}, root=False))
    for call, args in (
        (backend.create_gi, (0, 9, 0, 4)),
        (backend.set_mig_mode, (0, False)),
        (backend.placements, (0, 9)),
    ):
        with pytest.raises(BackendError) as caught:
            call(*args)
        assert caught.value.failure.name == "NO_PERMISSION"
    capable = opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}, root=False, mig_config_capability=True))
    assert capable.create_gi(0, 9, 0, 4) >= 1


def test_destroy_refuses_while_compute_instances_or_processes_hold_the_instance() -> None:
    system = host({"sku": "h100-80gb-sxm", "mig": "enabled"})
    backend = opened(system)
    gi = backend.create_gi(0, 9, 0, 4)
    ci = backend.create_default_ci(0, gi)
    with pytest.raises(BackendError) as caught:
        backend.destroy_gi(0, gi)
    assert caught.value.failure.name == "IN_USE"
    system.add_process(99, 0, used_mib=10, gi_id=gi, ci_id=ci)
    with pytest.raises(BackendError) as caught:
        backend.destroy_ci(0, gi, ci)
    assert caught.value.failure.name == "IN_USE"
    system.remove_process(99)
    backend.destroy_ci(0, gi, ci)
    backend.destroy_gi(0, gi)
    with pytest.raises(BackendError) as caught:
        backend.destroy_gi(0, gi)
    assert caught.value.failure.name == "NOT_FOUND"


def test_a_destroyed_instance_handle_stays_dead_even_when_its_id_is_reused() -> None:
    opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}))
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    old = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        device, 9, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 4))
    )
    old_id = pynvml.nvmlGpuInstanceGetInfo(old).id
    pynvml.nvmlGpuInstanceDestroy(old)
    new = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        device, 9, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(4, 4))
    )
    assert pynvml.nvmlGpuInstanceGetInfo(new).id == old_id
    assert nvml_code(pynvml.nvmlGpuInstanceGetInfo, old) == Nvml.INVALID_ARGUMENT


def test_mig_devices_get_uuids_memory_and_stale_handles_after_changes() -> None:
    backend = opened(host({"sku": "h100-80gb-sxm", "mig": "enabled"}))
    for profile_id, start, size in ((9, 4, 4), (14, 0, 2)):
        backend.create_default_ci(0, backend.create_gi(0, profile_id, start, size))
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    first = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(first).value == 1
    assert pynvml.nvmlDeviceGetMemoryInfo(first).total == 20_096 << 20  # the 2g at start 0 comes first
    assert nvml_code(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, device, 2) == Nvml.NOT_FOUND
    instances = backend.instances(0)
    assert [(i.profile, i.start, i.mig_uuid is not None) for i in instances] == [
        ("2g.20gb", 0, True),
        ("3g.40gb", 4, True),
    ]
    backend.create_default_ci(0, backend.create_gi(0, 19, 2, 1))
    assert nvml_code(pynvml.nvmlDeviceGetUUID, first) == Nvml.INVALID_ARGUMENT


def test_telemetry_reports_the_mig_mode_holes_as_not_supported() -> None:
    system = host({"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "h100-80gb-sxm"})
    backend = opened(system)
    mig, whole = backend.telemetry(0), backend.telemetry(1)
    assert mig.util_gpu_pct is None and mig.not_supported == ("utilization",)
    assert whole.util_gpu_pct == 0 and whole.not_supported == ()
    assert mig.power_w == 70.0 and mig.temperature_c == 30 and mig.mem_clock_mhz == 2619
    backend.create_gi(0, 0, 0, 8)
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml_code(pynvml.nvmlDeviceGetRemappedRows, device) == Nvml.NOT_SUPPORTED


def test_processes_carry_gi_and_ci_ids_for_root_only() -> None:
    system = host({"sku": "h100-80gb-sxm", "mig": "enabled"}, root=False, mig_config_capability=True)
    backend = opened(system)
    gi = backend.create_gi(0, 9, 0, 4)
    ci = backend.create_default_ci(0, gi)
    system.add_process(7, 0, used_mib=300, gi_id=gi, ci_id=ci)
    (sample,) = backend.processes(0)
    assert sample.device_uuid == sample.gpu_uuid  # no GI/CI IDs: cannot tell the MIG device
    system.root = True
    (sample,) = backend.processes(0)
    assert sample.device_uuid.startswith("MIG-") and sample.used_mib == 300


def test_xid_79_is_delivered_once_then_every_call_says_gpu_is_lost() -> None:
    system = host({"sku": "h200-141gb", "mig": "enabled"}, {"sku": "l40s"})
    backend = opened(system)
    assert backend.events(0) == []
    system.inject_xid(0, 79)
    (event,) = backend.events(0)
    assert (event.kind, event.xid, event.fatal, event.gpu_uuid) == (
        "xid",
        79,
        True,
        backend.uuid(1) and event.gpu_uuid,
    )
    with pytest.raises(BackendError) as caught:
        backend.telemetry(0)
    assert caught.value.failure.name == "GPU_IS_LOST"
    assert [gpu.lost for gpu in backend.inventory()] == [True, False]


def test_event_wait_times_out_on_the_simulated_clock_instead_of_sleeping() -> None:
    system = host({"sku": "l40s"})
    backend = opened(system)
    before = system.clock.now_s
    assert backend.events(timeout_ms=5000) == []
    assert system.clock.now_s - before == pytest.approx(5.0)


def test_the_fault_plan_forces_codes_and_the_call_log_records_them() -> None:
    system = host({"sku": "h100-80gb-sxm", "mig": "enabled"})
    backend = opened(system)
    system.faults.add("nvmlDeviceCreateGpuInstanceWithPlacement", Nvml.UNKNOWN, times=1)
    mark = system.log.mark()
    with pytest.raises(BackendError) as caught:
        backend.create_gi(0, 9, 0, 4)
    assert caught.value.code == 999
    backend.create_gi(0, 9, 0, 4)  # the fault was used up
    creates = [r for r in system.log.since(mark) if r.function == "nvmlDeviceCreateGpuInstanceWithPlacement"]
    assert [r.code for r in creates] == [999, 0]
    assert all(r.mutating for r in creates) and "nvmlDeviceGetMigMode" not in MUTATING


def test_the_driver_state_file_outlives_the_simulator_object(tmp_path: Path) -> None:
    spec = {"nodes": [{"name": "t", "gpus": [{"sku": "h200-141gb", "mig": "enabled"}]}]}
    first = build_system(spec, state_path=tmp_path / "driver.json")
    backend = opened(first)
    backend.create_default_ci(0, backend.create_gi(0, 9, 4, 4))
    uuid = backend.instances(0)[0].mig_uuid
    second = build_system(spec, state_path=tmp_path / "driver.json")
    assert [
        (gi.profile.name, gi.start, [ci.uuid for ci in gi.cis.values()]) for gi in second.gpus[0].gis.values()
    ] == [("3g.71gb", 4, [uuid])]


def test_specs_are_checked() -> None:
    with pytest.raises(SpecError):
        host({"sku": "l40s", "mig": "enabled"})
    with pytest.raises(SpecError):
        host({"sku": "v100"})
    with pytest.raises(SimNvmlError):
        host({"sku": "l40s"}).device_count()  # not initialised


@pytest.mark.parametrize(
    ("order", "placements", "fails_at"),
    [
        ([19, 14, 5], [6, 4, 0], None),  # MIG guide: 1g → 6, 2g → 4, 4g → 0
        ([19, 19, 14, 9], [6, 5, 2], 3),  # the guide's known issue: the 3g finds no room
    ],
)
def test_automatic_placement_can_follow_the_observed_a100_policy(
    order: list[int], placements: list[int], fails_at: int | None
) -> None:
    """The two §4.6 examples the "1g/2g high, others low" heuristic reproduces (the driver's real
    policy is uncertain; the agent never relies on it)."""
    opened(host({"sku": "a100-40gb", "mig": "enabled"}, auto_placement="observed-a100"))
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    starts = []
    for step, profile_id in enumerate(order):
        if step == fails_at:
            assert (
                nvml_code(pynvml.nvmlDeviceCreateGpuInstance, device, profile_id)
                == Nvml.INSUFFICIENT_RESOURCES
            )
            break
        starts.append(
            pynvml.nvmlGpuInstanceGetInfo(
                pynvml.nvmlDeviceCreateGpuInstance(device, profile_id)
            ).placement.start
        )
    assert starts == placements


def test_utilisation_sums_what_each_declared_process_keeps_busy(tmp_path: Path) -> None:
    """A fake-CUDA program declares its SM share: one holding memory at 0 % leaves the GPU idle (the idle
    task of `whalegen demo`); another at 20 % makes it 20 %; an undeclared share counts 35 %."""
    import json
    import os

    system = build_system({"nodes": [{"name": "t", "gpus": [{"sku": "h100-80gb-sxm"}]}]}, proc_dir=tmp_path)
    backend = opened(system)
    uuid = system.gpus[0].uuid

    def declare(pid: int, **fields: object) -> None:
        (tmp_path / f"{pid}.json").write_text(json.dumps({"device_uuid": uuid, "used_mib": 2048, **fields}))

    declare(os.getpid(), sm_pct=0)
    assert backend.telemetry(0).util_gpu_pct == 0
    declare(os.getppid(), sm_pct=20)
    assert backend.telemetry(0).util_gpu_pct == 20
    declare(os.getppid())
    assert backend.telemetry(0).util_gpu_pct == 35


def test_memory_utilisation_is_memory_controller_busy_time_not_memory_used(tmp_path: Path) -> None:
    """NVML's `utilization.memory` is the share of time device memory was read or written: each declared
    process's `mem_pct` summed (by default half its SM share), whatever memory the processes hold; a MIG
    GPU reports neither rate (NOT_SUPPORTED)."""
    import json
    import os

    spec = {
        "nodes": [
            {"name": "t", "gpus": [{"sku": "h100-80gb-sxm"}, {"sku": "h100-80gb-sxm", "mig": "enabled"}]}
        ]
    }
    system = build_system(spec, proc_dir=tmp_path)
    backend = opened(system)
    uuid = system.gpus[0].uuid

    def declare(pid: int, **fields: object) -> None:
        (tmp_path / f"{pid}.json").write_text(json.dumps({"device_uuid": uuid, "used_mib": 70_000, **fields}))

    declare(os.getpid(), sm_pct=90, mem_pct=81)  # a decode loop: the DRAM busy whenever kernels run
    sample = backend.telemetry(0)
    assert (sample.util_gpu_pct, sample.util_mem_pct, sample.mem_used_mib) == (90, 81, 70_000)
    declare(os.getpid(), sm_pct=90, mem_pct=9)  # a GEMM: the same memory held, the DRAM mostly quiet
    assert (backend.telemetry(0).util_gpu_pct, backend.telemetry(0).util_mem_pct) == (90, 9)
    declare(os.getpid(), sm_pct=60)
    assert backend.telemetry(0).util_mem_pct == 30
    declare(os.getppid(), sm_pct=60, mem_pct=80)  # two processes: the sum, at most 100
    assert (backend.telemetry(0).util_gpu_pct, backend.telemetry(0).util_mem_pct) == (100, 100)
    mig = backend.telemetry(1)
    assert mig.util_mem_pct is None and mig.not_supported == ("utilization",)
