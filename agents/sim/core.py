"""Layer A of the simulated NVML: a pure-Python model of a GPU host's driver (reference §9.2).

`SimSystem` holds the GPUs of one host and answers NVML's questions with NVML's own rules and error
codes: MIG mode (Hopper vs Ampere), GPU/compute instances over the memory-/compute-slice geometry,
processes holding instances, root vs non-root, events (Xid 79 makes a GPU lost), telemetry with the
MIG-mode holes. Every entry point is named after the C function it stands for, goes through a fault
plan, and lands in a call log, so tests can assert "zero mutating calls" and script failures.

Handles are small integers, as the ABI shim (Layer B) stores them in pointer-typed out parameters.
A destroyed instance's handle stays dead even when its ID is reused, as on a real driver.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

from whalegen.gpus.mig import CiProfile, MigProfile, ci_profiles
from whalegen.gpus.mig_plan import Placement, remaining_capacity
from whalegen.gpus.skus import MigResetPolicy, SkuFixture

MIB = 1 << 20
WHOLE_DEVICE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId meaning "not a MIG instance"
GI_PROFILE_INDEX_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT in nvidia-ml-py 13.615.71
CI_PROFILE_INDEX_COUNT = 0x9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
XID_GPU_FALLEN_OFF_BUS = 79
# File timestamps come from the kernel's coarse clock (a tick of 1-10 ms): a directory whose last change
# is at least this old cannot take a new file under the same mtime.
EMPTY_PROC_DIR_SETTLED_NS = 100_000_000


class Nvml(IntEnum):
    """NVML return codes (values from pynvml; reference §2.1)."""

    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    TIMEOUT = 10
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    IN_USE = 19
    INSUFFICIENT_RESOURCES = 23
    VERSION_MISMATCH = 25
    UNKNOWN = 999


class Event(IntEnum):
    SINGLE_BIT_ECC = 0x1
    DOUBLE_BIT_ECC = 0x2
    XID_CRITICAL = 0x8
    MIG_CONFIG_CHANGE = 0x100


class SimNvmlError(Exception):
    def __init__(self, code: Nvml, detail: str = "") -> None:
        super().__init__(f"{code.name} ({int(code)}){': ' + detail if detail else ''}")
        self.code = code
        self.detail = detail


# Calls that change driver state; an idempotent reconcile makes none of them on its second pass.
MUTATING = frozenset(
    {
        "nvmlDeviceSetMigMode",
        "nvmlDeviceCreateGpuInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
        "nvmlComputeInstanceDestroy",
        "nvmlDeviceSetComputeMode",
    }
)


@dataclass(frozen=True)
class CallRecord:
    seq: int
    t_s: float  # simulator clock
    function: str
    args: tuple[Any, ...]
    code: int

    @property
    def mutating(self) -> bool:
        return self.function in MUTATING


class CallLog:
    """Every NVML call the simulator answered, in order; optionally mirrored to a JSON-lines file."""

    def __init__(self, sink: Path | None = None) -> None:
        self.entries: list[CallRecord] = []
        self._sink = sink
        self._sink_fd: int | None = None

    def append(self, record: CallRecord) -> None:
        self.entries.append(record)
        if self._sink is not None:
            row = {"seq": record.seq, "t_s": record.t_s, "function": record.function, "code": record.code}
            line = json.dumps(row | {"args": [repr(a) for a in record.args]}) + "\n"
            # One write(2) per line on a descriptor opened once, in append mode: a reader in another
            # process (a test watching a live agent) sees each call as it happens, as before, and an
            # open and close per call (two thirds of an idle simulated agent's NVML cost) is gone.
            os.write(self._fd(), line.encode())

    def _fd(self) -> int:
        """The sink, opened at the first call (the file appears then, as it always did) and closed when
        this log is collected: a test process builds many simulators."""
        if self._sink_fd is None:
            assert self._sink is not None
            fd = os.open(self._sink, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            weakref.finalize(self, os.close, fd)
            self._sink_fd = fd
        return self._sink_fd

    def mark(self) -> int:
        return len(self.entries)

    def since(self, mark: int) -> list[CallRecord]:
        return self.entries[mark:]

    def mutating_since(self, mark: int) -> list[CallRecord]:
        return [r for r in self.since(mark) if r.mutating]


@dataclass
class Fault:
    code: Nvml | None = None  # forced return code; None with latency only
    times: int = 1  # how many calls it affects; -1 for every call
    latency_s: float = 0.0  # advances the simulator clock before answering
    gpu: int | None = None  # only calls about this GPU index (None: any)


class FaultPlan:
    """Per-function queue of forced outcomes, consumed in order (retry and back-off tests)."""

    def __init__(self) -> None:
        self._faults: dict[str, deque[Fault]] = {}

    def add(
        self,
        function: str,
        code: Nvml | None = None,
        *,
        times: int = 1,
        latency_s: float = 0.0,
        gpu: int | None = None,
    ) -> None:
        self._faults.setdefault(function, deque()).append(Fault(code, times, latency_s, gpu))

    def take(self, function: str, gpu: int | None) -> Fault | None:
        queue = self._faults.get(function)
        if not queue:
            return None
        fault = queue[0]
        if fault.gpu is not None and fault.gpu != gpu:
            return None
        if fault.times > 0:
            fault.times -= 1
            if fault.times == 0:
                queue.popleft()
        return fault


class SimClock:
    """Deterministic time: it moves only when told to (or when an event wait times out)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class SimCi:
    id: int
    serial: int
    profile: CiProfile
    start: int
    uuid: str


@dataclass
class SimGi:
    id: int
    serial: int
    profile: MigProfile
    start: int
    cis: dict[int, SimCi] = field(default_factory=dict)


@dataclass
class SimProcess:
    pid: int
    gpu: int
    gi_id: int | None
    ci_id: int | None
    used_mib: int
    mps: bool = False
    external: bool = False  # declared by a real process through the proc directory
    # The share of the GPU's SMs it keeps busy (what NVML's utilisation rate sums over processes); a
    # process that holds memory and launches nothing declares 0.
    sm_pct: int = 35
    # The share of time it keeps the device memory read or written (what NVML's memory utilisation rate
    # sums over processes: memory-controller busy time, not memory used). None: half its SM share, a
    # balanced kernel mix; a bandwidth-bound task declares about its SM share, a compute-bound one little.
    mem_pct: int | None = None

    @property
    def mem_busy_pct(self) -> int:
        return self.sm_pct // 2 if self.mem_pct is None else self.mem_pct


@dataclass
class SimGpu:
    index: int
    sku: SkuFixture
    uuid: str
    pci_bus_id: str
    reset_supported: bool = True  # False: passthrough VM, the platform cannot reset the GPU
    mig_query_mode_independent: bool = False  # field 199: profile queries work with MIG disabled
    mig_current: int = 0
    mig_pending: int = 0
    compute_mode: int = 0
    lost: bool = False
    attached_clients: set[str] = field(default_factory=set)  # monitoring daemons that block resets
    gis: dict[int, SimGi] = field(default_factory=dict)
    ecc_volatile: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})  # type → count
    ecc_aggregate: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    topology_gen: int = 0  # bumped on every GI/CI change: MIG device handles go stale

    @property
    def used_mask(self) -> int:
        mask = 0
        for gi in self.gis.values():
            mask |= gi.profile.slice_mask(gi.start)
        return mask

    def placed(self) -> list[Placement]:
        return [Placement(gi.profile.profile_id, gi.start) for gi in self.gis.values()]

    def mig_devices(self) -> list[tuple[SimGi, SimCi]]:
        """MIG devices in NVML's stable order: by GI placement, then CI placement."""
        pairs = [(gi, ci) for gi in self.gis.values() for ci in gi.cis.values()]
        return sorted(pairs, key=lambda pair: (pair[0].start, pair[1].start))


@dataclass
class SimEventSet:
    registrations: dict[int, int] = field(default_factory=dict)  # GPU index → event mask
    queue: deque[tuple[int, int, int, int, int]] = field(default_factory=deque)  # gpu, type, data, gi, ci


AutoPlacement = Callable[[MigProfile, int], int | None]


def lowest_first(profile: MigProfile, used_mask: int) -> int | None:
    for start in profile.starts:
        if not profile.slice_mask(start) & used_mask:
            return start
    return None


def observed_a100(profile: MigProfile, used_mask: int) -> int | None:
    """1g/2g take the highest free start, everything else the lowest: reproduces §4.6's examples."""
    starts = profile.starts
    if profile.compute_slices <= 2:
        starts = tuple(reversed(starts))
    for start in starts:
        if not profile.slice_mask(start) & used_mask:
            return start
    return None


AUTO_PLACEMENTS: dict[str, AutoPlacement] = {"lowest-first": lowest_first, "observed-a100": observed_a100}

F = TypeVar("F", bound=Callable[..., Any])


def nvml_function(name: str) -> Callable[[F], F]:
    """Route a method through the fault plan, the init check and the call log under NVML's name."""

    def decorate(method: F) -> F:
        @wraps(method)
        def wrapper(self: SimSystem, *args: Any) -> Any:
            return self._invoke(name, method, args)

        wrapper.nvml_name = name  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def gpu_uuid(seed: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"whalegen-sim/{seed}/{index}"))


class SimSystem:
    """One simulated host: driver, GPUs, processes, events. Not thread-safe (NVML calls are serial)."""

    def __init__(
        self,
        gpus: Iterable[SimGpu],
        *,
        driver_version: str = "570.124.06",
        root: bool = True,
        mig_config_capability: bool = False,
        auto_placement: str | AutoPlacement = "lowest-first",
        clock: SimClock | None = None,
        call_log: CallLog | None = None,
        control_dir: Path | None = None,
        proc_dir: Path | None = None,
        state_path: Path | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.root = root
        self.mig_config_capability = mig_config_capability  # /proc/driver/nvidia/capabilities/mig/config
        self.auto_placement = (
            AUTO_PLACEMENTS[auto_placement] if isinstance(auto_placement, str) else auto_placement
        )
        self.clock = clock or SimClock()
        self.log = call_log or CallLog()
        self.faults = FaultPlan()
        self.control_dir = control_dir
        self.proc_dir = proc_dir
        self.init_count = 0
        self.processes: dict[int, SimProcess] = {}
        self._handles: dict[int, tuple[Any, ...]] = {}
        self._handle_of: dict[tuple[Any, ...], int] = {}
        self._serial = 0
        self._event_sets: dict[int, SimEventSet] = {}
        self._control_checked_at = 0.0
        self._proc_dir_empty_since_ns: int | None = None  # see _sync_external_processes
        # The driver outlives the agent: with a state path, instances, modes and lost GPUs survive an
        # agent restart the way they survive one on a real host.
        self.state_path = state_path
        if state_path is not None and state_path.exists():
            self.restore(json.loads(state_path.read_text()))

    # ---- plumbing -------------------------------------------------------------------------------
    def _invoke(self, name: str, method: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self._poll_control()
        gpu_index = self._gpu_index_of(args[0]) if args and isinstance(args[0], int) else None
        fault = self.faults.take(name, gpu_index)
        try:
            if fault is not None:
                self.clock.advance(fault.latency_s)
                if fault.code is not None:
                    raise SimNvmlError(fault.code, "injected by the fault plan")
            if self.init_count == 0 and name not in {"nvmlInitWithFlags", "nvmlErrorString"}:
                raise SimNvmlError(Nvml.UNINITIALIZED)
            result = method(self, *args)
        except SimNvmlError as error:
            self._record(name, args, int(error.code))
            raise
        self._record(name, args, 0)
        if name in MUTATING:
            self._persist()
        return result

    # ---- the driver state file -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "serial": self._serial,
            "gpus": [
                {
                    "mig_current": gpu.mig_current,
                    "mig_pending": gpu.mig_pending,
                    "compute_mode": gpu.compute_mode,
                    "lost": gpu.lost,
                    "gis": [
                        {
                            "id": gi.id,
                            "serial": gi.serial,
                            "profile_id": gi.profile.profile_id,
                            "start": gi.start,
                            "cis": [
                                {
                                    "id": ci.id,
                                    "serial": ci.serial,
                                    "slices": ci.profile.compute_slices,
                                    "start": ci.start,
                                    "uuid": ci.uuid,
                                }
                                for ci in gi.cis.values()
                            ],
                        }
                        for gi in gpu.gis.values()
                    ],
                }
                for gpu in self.gpus
            ],
        }

    def restore(self, data: dict[str, Any]) -> None:
        self._serial = int(data["serial"])
        for gpu, saved in zip(self.gpus, data["gpus"], strict=False):
            gpu.mig_current, gpu.mig_pending = saved["mig_current"], saved["mig_pending"]
            gpu.compute_mode, gpu.lost = saved["compute_mode"], saved["lost"]
            gpu.gis = {}
            for row in saved["gis"]:
                profile = next(p for p in gpu.sku.gi_profiles if p.profile_id == row["profile_id"])
                gi = SimGi(row["id"], row["serial"], profile, row["start"])
                by_slices = {c.compute_slices: c for c in ci_profiles(profile)}
                for ci in row["cis"]:
                    gi.cis[ci["id"]] = SimCi(
                        ci["id"], ci["serial"], by_slices[ci["slices"]], ci["start"], ci["uuid"]
                    )
                gpu.gis[gi.id] = gi

    def _persist(self) -> None:
        if self.state_path is not None:
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.snapshot()))
            tmp.replace(self.state_path)

    def _record(self, name: str, args: tuple[Any, ...], code: int) -> None:
        self.log.append(CallRecord(len(self.log.entries), self.clock.now_s, name, args, code))

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _handle(self, key: tuple[Any, ...]) -> int:
        if key not in self._handle_of:
            number = len(self._handles) + 1  # 0 would be a NULL pointer
            self._handles[number] = key
            self._handle_of[key] = number
        return self._handle_of[key]

    def _key(self, handle: int) -> tuple[Any, ...]:
        key = self._handles.get(handle)
        if key is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"unknown handle {handle}")
        return key

    def _gpu_index_of(self, handle: int) -> int | None:
        key = self._handles.get(handle)
        return key[1] if key is not None and key[0] in {"gpu", "gi", "ci", "mig"} else None

    def _live_gpu(self, index: int) -> SimGpu:
        gpu = self.gpus[index]
        if gpu.lost:
            raise SimNvmlError(Nvml.GPU_IS_LOST, f"GPU {index} fell off the bus")
        return gpu

    def _resolve(self, handle: int) -> tuple[SimGpu, SimGi | None, SimCi | None]:
        """A GPU or MIG-device handle → (gpu, gi, ci); gi/ci None for the parent GPU."""
        key = self._key(handle)
        if key[0] == "gpu":
            return self._live_gpu(key[1]), None, None
        if key[0] == "mig":
            gpu = self._live_gpu(key[1])
            _, _, gen, gi_serial, ci_serial = key
            if gen != gpu.topology_gen:
                raise SimNvmlError(Nvml.INVALID_ARGUMENT, "stale MIG device handle")
            gi, ci = self._find_ci(gpu, gi_serial, ci_serial)
            return gpu, gi, ci
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a device handle")

    def _device(self, handle: int) -> SimGpu:
        gpu, gi, _ = self._resolve(handle)
        if gi is not None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "MIG device handle where a GPU is required")
        return gpu

    def _gi(self, handle: int) -> tuple[SimGpu, SimGi]:
        key = self._key(handle)
        if key[0] != "gi":
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a GPU-instance handle")
        gpu = self._live_gpu(key[1])
        for gi in gpu.gis.values():
            if gi.serial == key[2]:
                return gpu, gi
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, "GPU instance was destroyed")

    def _find_ci(self, gpu: SimGpu, gi_serial: int, ci_serial: int) -> tuple[SimGi, SimCi]:
        for gi in gpu.gis.values():
            if gi.serial == gi_serial:
                for ci in gi.cis.values():
                    if ci.serial == ci_serial:
                        return gi, ci
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, "compute instance was destroyed")

    def _ci(self, handle: int) -> tuple[SimGpu, SimGi, SimCi]:
        key = self._key(handle)
        if key[0] != "ci":
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a compute-instance handle")
        gpu = self._live_gpu(key[1])
        gi, ci = self._find_ci(gpu, key[2], key[3])
        return gpu, gi, ci

    def _require_manage(self, gpu: SimGpu) -> None:
        # Root may always manage; with MIG enabled, read access to the mig/config capability lets
        # non-root processes manage instances too (§3).
        if not self.root and not (self.mig_config_capability and gpu.mig_current):
            raise SimNvmlError(Nvml.NO_PERMISSION)

    def _require_mig(self, gpu: SimGpu) -> None:
        if not gpu.sku.mig_capable:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, f"{gpu.sku.model} has no MIG")
        if not gpu.mig_current:
            # A merely pending mode counts as not enabled (§2.1).
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "MIG mode is not enabled")

    def _processes_on(
        self, gpu: SimGpu, gi: SimGi | None = None, ci: SimCi | None = None
    ) -> list[SimProcess]:
        self._sync_external_processes()
        found = []
        for proc in self.processes.values():
            if proc.gpu != gpu.index:
                continue
            if gi is not None and proc.gi_id != gi.id:
                continue
            if ci is not None and proc.ci_id != ci.id:
                continue
            found.append(proc)
        return sorted(found, key=lambda p: p.pid)

    def _topology_changed(self, gpu: SimGpu) -> None:
        gpu.topology_gen += 1
        self._push_event(gpu.index, Event.MIG_CONFIG_CHANGE, 0, WHOLE_DEVICE, WHOLE_DEVICE)

    def _push_event(self, gpu_index: int, event_type: int, data: int, gi_id: int, ci_id: int) -> None:
        for event_set in self._event_sets.values():
            if event_set.registrations.get(gpu_index, 0) & event_type:
                event_set.queue.append((gpu_index, event_type, data, gi_id, ci_id))

    # ---- external processes and the control inbox ------------------------------------------------
    def _sync_external_processes(self) -> None:
        """Adopt processes declared by real (fake-CUDA) programs: `<proc_dir>/<pid>.json`.

        Each file holds {"device_uuid": GPU-… or MIG-…, "used_mib": N, "mps": bool, "sm_pct": P, "mem_pct": M}
        (`mem_pct` optional). A file whose process has exited is dropped, as the driver forgets a context when
        its process dies.
        """
        for pid in [p for p, proc in self.processes.items() if proc.external]:
            del self.processes[pid]
        if self.proc_dir is None:
            return
        listed_ns = time.time_ns()
        try:
            changed_ns = self.proc_dir.stat().st_mtime_ns
        except OSError:
            return
        if changed_ns == self._proc_dir_empty_since_ns:
            return  # still empty: a program declaring itself creates a file, which moves the mtime
        declared = False
        for path in self.proc_dir.glob("*.json"):
            declared = True
            try:
                pid = int(path.stem)
                os.kill(pid, 0)
                data = json.loads(path.read_text())
            except (ValueError, ProcessLookupError, PermissionError, OSError):
                continue
            located = self.locate_uuid(str(data.get("device_uuid", "")))
            if located is None:
                continue
            gpu_index, gi_id, ci_id = located
            self.processes[pid] = SimProcess(
                pid,
                gpu_index,
                gi_id,
                ci_id,
                int(data.get("used_mib", 0)),
                bool(data.get("mps")),
                external=True,
                sm_pct=int(data.get("sm_pct", 35)),
                mem_pct=None if data.get("mem_pct") is None else int(data["mem_pct"]),
            )
        # An empty directory is remembered by its mtime (idle agents ask for processes ~30 times a
        # heartbeat), but only once its last change is older than a coarse timestamp tick: a file created
        # within the same tick as that change would carry the same mtime and go unseen.
        settled = listed_ns - changed_ns > EMPTY_PROC_DIR_SETTLED_NS
        self._proc_dir_empty_since_ns = changed_ns if not declared and settled else None

    def locate_uuid(self, device_uuid: str) -> tuple[int, int | None, int | None] | None:
        for gpu in self.gpus:
            if gpu.uuid == device_uuid:
                return gpu.index, None, None
            for gi, ci in gpu.mig_devices():
                if ci.uuid == device_uuid:
                    return gpu.index, gi.id, ci.id
        return None

    def _poll_control(self) -> None:
        """Apply scenario commands dropped as JSON files into `control_dir` (tests of a live agent)."""
        if self.control_dir is None:
            return
        now = time.monotonic()
        if now - self._control_checked_at < 0.1:
            return
        self._control_checked_at = now
        for path in sorted(self.control_dir.glob("*.json")):
            try:
                command = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            path.unlink(missing_ok=True)
            self.apply_command(command)

    def apply_command(self, command: dict[str, Any]) -> None:
        op = command["op"]
        if op == "inject_xid":
            self.inject_xid(int(command["gpu"]), int(command["xid"]), command.get("gi"), command.get("ci"))
        elif op == "fail":
            self.faults.add(command["function"], Nvml[command["code"]], times=int(command.get("times", 1)))
        elif op == "attach_client":
            self.gpus[int(command["gpu"])].attached_clients.add(str(command["name"]))
        elif op == "reload_driver":
            self.reload_driver()
        else:
            raise ValueError(f"unknown simulator command {op!r}")

    # ---- scenario controls (not NVML calls, not logged) ------------------------------------------
    def add_process(
        self,
        pid: int,
        gpu: int,
        *,
        used_mib: int,
        gi_id: int | None = None,
        ci_id: int | None = None,
        mps: bool = False,
    ) -> None:
        self.processes[pid] = SimProcess(pid, gpu, gi_id, ci_id, used_mib, mps)

    def remove_process(self, pid: int) -> None:
        self.processes.pop(pid, None)

    def inject_xid(self, gpu: int, xid: int, gi_id: int | None = None, ci_id: int | None = None) -> None:
        self._push_event(
            gpu,
            Event.XID_CRITICAL,
            xid,
            WHOLE_DEVICE if gi_id is None else gi_id,
            WHOLE_DEVICE if ci_id is None else ci_id,
        )
        if xid == XID_GPU_FALLEN_OFF_BUS:
            self.gpus[gpu].lost = True
            self._persist()

    def reset(self, index: int) -> None:
        """What `nvidia-smi -r -i` does: refuse while busy, else clear instances and apply pending mode."""
        gpu = self._live_gpu(index)
        if self._processes_on(gpu) or gpu.attached_clients:
            raise SimNvmlError(Nvml.IN_USE, "processes or monitoring clients hold the GPU")
        if not gpu.reset_supported:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "the platform cannot reset this GPU")
        gpu.gis.clear()
        gpu.mig_current = gpu.mig_pending
        gpu.ecc_volatile = {0: 0, 1: 0}
        self._topology_changed(gpu)

    def reload_driver(self) -> None:
        """Driver reload or reboot: instances vanish; Hopper forgets MIG mode, Ampere keeps it."""
        self.processes.clear()
        for gpu in self.gpus:
            gpu.gis.clear()
            gpu.lost = False
            if gpu.sku.mig_reset_policy is MigResetPolicy.HOPPER:
                gpu.mig_current = gpu.mig_pending = 0
            else:
                gpu.mig_current = gpu.mig_pending
            gpu.topology_gen += 1

    # ---- init, system, device ---------------------------------------------------------------------
    @nvml_function("nvmlInitWithFlags")
    def init(self, flags: int = 0) -> None:
        self.init_count += 1

    @nvml_function("nvmlShutdown")
    def shutdown(self) -> None:
        self.init_count -= 1

    @nvml_function("nvmlSystemGetDriverVersion")
    def driver(self) -> str:
        return self.driver_version

    @nvml_function("nvmlDeviceGetCount_v2")
    def device_count(self) -> int:
        return len(self.gpus)

    @nvml_function("nvmlDeviceGetHandleByIndex_v2")
    def handle_by_index(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"no GPU {index}")
        return self._handle(("gpu", index))

    @nvml_function("nvmlDeviceGetName")
    def name(self, handle: int) -> str:
        gpu, gi, _ = self._resolve(handle)
        return gpu.sku.nvml_name if gi is None else f"{gpu.sku.nvml_name} MIG {gi.profile.name}"

    @nvml_function("nvmlDeviceGetUUID")
    def device_uuid(self, handle: int) -> str:
        gpu, _, ci = self._resolve(handle)
        return gpu.uuid if ci is None else ci.uuid

    @nvml_function("nvmlDeviceGetPciInfo_v3")
    def pci_info(self, handle: int) -> tuple[str, int]:
        gpu = self._device(handle)
        # pciDeviceId carries the vendor ID (0x10DE) in its low 16 bits.
        return gpu.pci_bus_id, (gpu.sku.pci_device_id << 16) | 0x10DE

    @nvml_function("nvmlDeviceGetMemoryInfo")
    def memory_info(self, handle: int) -> tuple[int, int, int]:
        """(total, free, used) in bytes; a MIG handle reports its GI's memory."""
        gpu, gi, _ = self._resolve(handle)
        if gi is None:
            if gpu.mig_current and not self.root:
                raise SimNvmlError(Nvml.NO_PERMISSION, "aggregate MIG memory needs a privileged caller")
            total = gpu.sku.total_mem_mib
            used = sum(p.used_mib for p in self._processes_on(gpu))
        else:
            total = gi.profile.mem_mib
            used = sum(p.used_mib for p in self._processes_on(gpu, gi))
        used = min(used, total)
        return total * MIB, (total - used) * MIB, used * MIB

    # ---- MIG mode --------------------------------------------------------------------------------
    @nvml_function("nvmlDeviceGetMigMode")
    def get_mig_mode(self, handle: int) -> tuple[int, int]:
        gpu = self._device(handle)
        if not gpu.sku.mig_capable:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, f"{gpu.sku.model} has no MIG")
        return gpu.mig_current, gpu.mig_pending

    @nvml_function("nvmlDeviceSetMigMode")
    def set_mig_mode(self, handle: int, mode: int) -> int:
        """Returns activationStatus, an NVML code: the call can succeed while activation fails (§3)."""
        gpu = self._device(handle)
        if not gpu.sku.mig_capable:
            raise SimNvmlError(Nvml.NOT_SUPPORTED)
        if not self.root:
            raise SimNvmlError(Nvml.NO_PERMISSION)
        if mode not in (0, 1):
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"MIG mode {mode}")
        gpu.mig_pending = mode
        if mode == gpu.mig_current:
            return int(Nvml.SUCCESS)
        busy = bool(self._processes_on(gpu) or gpu.attached_clients)
        # Instances still present block the change [uncertain: mig-parted always clears first].
        if gpu.gis or busy:
            return int(Nvml.IN_USE)
        if gpu.sku.mig_reset_policy is MigResetPolicy.AMPERE and not gpu.reset_supported:
            return int(Nvml.RESET_REQUIRED)
        gpu.mig_current = mode
        self._topology_changed(gpu)
        return int(Nvml.SUCCESS)

    # ---- GPU instances ---------------------------------------------------------------------------
    def _gi_profile_by_id(self, gpu: SimGpu, profile_id: int) -> MigProfile:
        for profile in gpu.sku.gi_profiles:
            if profile.profile_id == profile_id:
                return profile
        raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"no GI profile ID {profile_id} on {gpu.sku.model}")

    @nvml_function("nvmlDeviceGetGpuInstanceProfileInfoV")
    def gi_profile_info(self, handle: int, index: int) -> MigProfile:
        gpu = self._device(handle)
        if not 0 <= index < GI_PROFILE_INDEX_COUNT:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"profile index {index}")
        if not gpu.sku.mig_capable or not (gpu.mig_current or gpu.mig_query_mode_independent):
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "MIG mode is not enabled")
        for profile in gpu.sku.gi_profiles:
            if profile.index == index:
                return profile
        raise SimNvmlError(Nvml.NOT_SUPPORTED, f"profile index {index} absent on {gpu.sku.model}")

    @nvml_function("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    def gi_possible_placements(self, handle: int, profile_id: int) -> list[tuple[int, int]]:
        """Every placement of the profile, whatever the occupancy and even with MIG disabled (§4.2)."""
        gpu = self._device(handle)
        if not gpu.sku.mig_capable:
            raise SimNvmlError(Nvml.NOT_SUPPORTED)
        if not self.root:
            raise SimNvmlError(Nvml.NO_PERMISSION)
        profile = self._gi_profile_by_id(gpu, profile_id)
        return [(start, profile.memory_slices) for start in profile.starts]

    @nvml_function("nvmlDeviceGetGpuInstanceRemainingCapacity")
    def gi_remaining_capacity(self, handle: int, profile_id: int) -> int:
        gpu = self._device(handle)
        self._require_mig(gpu)
        self._gi_profile_by_id(gpu, profile_id)
        return remaining_capacity(gpu.sku.gi_profiles, gpu.placed(), profile_id)

    def _create_gi(self, gpu: SimGpu, profile_id: int, start: int | None, size: int | None) -> int:
        self._require_mig(gpu)
        self._require_manage(gpu)
        profile = self._gi_profile_by_id(gpu, profile_id)
        if start is None:
            start = self.auto_placement(profile, gpu.used_mask)
            if start is None:
                raise SimNvmlError(Nvml.INSUFFICIENT_RESOURCES, "no free placement")
        elif start not in profile.starts or size != profile.memory_slices:
            # [uncertain] the driver may say INSUFFICIENT_RESOURCES here (§10.3).
            raise SimNvmlError(
                Nvml.INVALID_ARGUMENT, f"placement {start}:{size} not allowed for {profile.name}"
            )
        existing = sum(1 for gi in gpu.gis.values() if gi.profile.profile_id == profile_id)
        if existing >= profile.max_instances:
            raise SimNvmlError(
                Nvml.INSUFFICIENT_RESOURCES, f"{profile.name} already has {existing} instances"
            )
        if profile.slice_mask(start) & gpu.used_mask:
            raise SimNvmlError(Nvml.INSUFFICIENT_RESOURCES, f"memory slices of {start}:{size} are occupied")
        gi_id = next(i for i in range(1, 64) if i not in gpu.gis)  # a driver-like pool, not the placement
        gpu.gis[gi_id] = SimGi(gi_id, self._next_serial(), profile, start)
        self._topology_changed(gpu)
        return self._handle(("gi", gpu.index, gpu.gis[gi_id].serial))

    @nvml_function("nvmlDeviceCreateGpuInstance")
    def create_gi(self, handle: int, profile_id: int) -> int:
        return self._create_gi(self._device(handle), profile_id, None, None)

    @nvml_function("nvmlDeviceCreateGpuInstanceWithPlacement")
    def create_gi_with_placement(self, handle: int, profile_id: int, start: int, size: int) -> int:
        return self._create_gi(self._device(handle), profile_id, start, size)

    @nvml_function("nvmlDeviceGetGpuInstances")
    def gpu_instances(self, handle: int, profile_id: int) -> list[int]:
        gpu = self._device(handle)
        self._require_mig(gpu)
        self._gi_profile_by_id(gpu, profile_id)
        return [
            self._handle(("gi", gpu.index, gi.serial))
            for gi_id, gi in sorted(gpu.gis.items())
            if gi.profile.profile_id == profile_id
        ]

    @nvml_function("nvmlDeviceGetGpuInstanceById")
    def gpu_instance_by_id(self, handle: int, gi_id: int) -> int:
        gpu = self._device(handle)
        self._require_mig(gpu)
        if gi_id not in gpu.gis:
            raise SimNvmlError(Nvml.NOT_FOUND, f"no GPU instance {gi_id}")
        return self._handle(("gi", gpu.index, gpu.gis[gi_id].serial))

    @nvml_function("nvmlGpuInstanceGetInfo")
    def gi_info(self, gi_handle: int) -> tuple[int, int, int, int, int]:
        """(device handle, GI ID, profile ID, placement start, placement size)."""
        gpu, gi = self._gi(gi_handle)
        return (
            self._handle(("gpu", gpu.index)),
            gi.id,
            gi.profile.profile_id,
            gi.start,
            gi.profile.memory_slices,
        )

    @nvml_function("nvmlGpuInstanceDestroy")
    def gi_destroy(self, gi_handle: int) -> None:
        gpu, gi = self._gi(gi_handle)
        self._require_manage(gpu)
        if gi.cis or self._processes_on(gpu, gi):
            raise SimNvmlError(Nvml.IN_USE, f"GPU instance {gi.id} has compute instances or processes")
        del gpu.gis[gi.id]
        self._topology_changed(gpu)

    # ---- compute instances -----------------------------------------------------------------------
    def _ci_profile(self, gi: SimGi, profile_id: int) -> CiProfile:
        for profile in ci_profiles(gi.profile):
            if profile.profile_id == profile_id:
                return profile
        raise SimNvmlError(Nvml.NOT_SUPPORTED, f"CI profile {profile_id} not offered by {gi.profile.name}")

    @nvml_function("nvmlGpuInstanceGetComputeInstanceProfileInfoV")
    def ci_profile_info(self, gi_handle: int, index: int, engine_profile: int) -> tuple[CiProfile, SimGi]:
        _, gi = self._gi(gi_handle)
        if not 0 <= index < CI_PROFILE_INDEX_COUNT or engine_profile != 0:
            raise SimNvmlError(
                Nvml.INVALID_ARGUMENT, f"CI profile index {index}, engine profile {engine_profile}"
            )
        return self._ci_profile(gi, index), gi

    @nvml_function("nvmlGpuInstanceGetComputeInstancePossiblePlacements")
    def ci_possible_placements(self, gi_handle: int, profile_id: int) -> list[tuple[int, int]]:
        _, gi = self._gi(gi_handle)
        profile = self._ci_profile(gi, profile_id)
        return [(start, profile.compute_slices) for start in profile.starts]

    @nvml_function("nvmlGpuInstanceGetComputeInstanceRemainingCapacity")
    def ci_remaining_capacity(self, gi_handle: int, profile_id: int) -> int:
        _, gi = self._gi(gi_handle)
        profile = self._ci_profile(gi, profile_id)
        mask = 0
        for ci in gi.cis.values():
            mask |= ci.profile.slice_mask(ci.start)
        existing = sum(1 for ci in gi.cis.values() if ci.profile.profile_id == profile_id)
        free = 0
        for start in profile.starts:
            if not profile.slice_mask(start) & mask:
                mask |= profile.slice_mask(start)
                free += 1
        return max(0, min(free, profile.max_instances - existing))

    def _create_ci(self, gi_handle: int, profile_id: int, start: int | None, size: int | None) -> int:
        gpu, gi = self._gi(gi_handle)
        self._require_manage(gpu)
        profile = self._ci_profile(gi, profile_id)
        mask = 0
        for ci in gi.cis.values():
            mask |= ci.profile.slice_mask(ci.start)
        if start is None:
            start = next((s for s in profile.starts if not profile.slice_mask(s) & mask), None)
            if start is None:
                raise SimNvmlError(Nvml.INSUFFICIENT_RESOURCES, "no free compute slices")
        elif start not in profile.starts or size != profile.compute_slices:
            raise SimNvmlError(
                Nvml.INVALID_ARGUMENT, f"CI placement {start}:{size} not allowed for {profile.name}"
            )
        existing = sum(1 for ci in gi.cis.values() if ci.profile.profile_id == profile_id)
        if existing >= profile.max_instances or profile.slice_mask(start) & mask:
            raise SimNvmlError(Nvml.INSUFFICIENT_RESOURCES, f"compute slices of {start}:{size} are occupied")
        ci_id = next(i for i in range(0, 64) if i not in gi.cis)
        serial = self._next_serial()
        digest = hashlib.sha1(f"{gpu.uuid}/{gi.serial}/{serial}".encode()).hexdigest()
        mig_uuid = "MIG-" + str(uuid.UUID(digest[:32]))
        gi.cis[ci_id] = SimCi(ci_id, serial, profile, start, mig_uuid)
        self._topology_changed(gpu)
        return self._handle(("ci", gpu.index, gi.serial, serial))

    @nvml_function("nvmlGpuInstanceCreateComputeInstance")
    def create_ci(self, gi_handle: int, profile_id: int) -> int:
        return self._create_ci(gi_handle, profile_id, None, None)

    @nvml_function("nvmlGpuInstanceCreateComputeInstanceWithPlacement")
    def create_ci_with_placement(self, gi_handle: int, profile_id: int, start: int, size: int) -> int:
        return self._create_ci(gi_handle, profile_id, start, size)

    @nvml_function("nvmlGpuInstanceGetComputeInstances")
    def compute_instances(self, gi_handle: int, profile_id: int) -> list[int]:
        gpu, gi = self._gi(gi_handle)
        self._ci_profile(gi, profile_id)
        return [
            self._handle(("ci", gpu.index, gi.serial, ci.serial))
            for _, ci in sorted(gi.cis.items())
            if ci.profile.profile_id == profile_id
        ]

    @nvml_function("nvmlGpuInstanceGetComputeInstanceById")
    def compute_instance_by_id(self, gi_handle: int, ci_id: int) -> int:
        gpu, gi = self._gi(gi_handle)
        if ci_id not in gi.cis:
            raise SimNvmlError(Nvml.NOT_FOUND, f"no compute instance {ci_id}")
        return self._handle(("ci", gpu.index, gi.serial, gi.cis[ci_id].serial))

    @nvml_function("nvmlComputeInstanceGetInfo_v2")
    def ci_info(self, ci_handle: int) -> tuple[int, int, int, int, int, int]:
        """(device handle, GI handle, CI ID, CI profile ID, placement start, placement size)."""
        gpu, gi, ci = self._ci(ci_handle)
        return (
            self._handle(("gpu", gpu.index)),
            self._handle(("gi", gpu.index, gi.serial)),
            ci.id,
            ci.profile.profile_id,
            ci.start,
            ci.profile.compute_slices,
        )

    @nvml_function("nvmlComputeInstanceDestroy")
    def ci_destroy(self, ci_handle: int) -> None:
        gpu, gi, ci = self._ci(ci_handle)
        self._require_manage(gpu)
        if self._processes_on(gpu, gi, ci):
            raise SimNvmlError(Nvml.IN_USE, f"compute instance {gi.id}/{ci.id} has processes")
        del gi.cis[ci.id]
        self._topology_changed(gpu)

    # ---- MIG device handles ------------------------------------------------------------------------
    @nvml_function("nvmlDeviceGetMaxMigDeviceCount")
    def max_mig_device_count(self, handle: int) -> int:
        gpu = self._device(handle)
        return 7 if gpu.sku.mig_capable and gpu.mig_current else 0

    @nvml_function("nvmlDeviceGetMigDeviceHandleByIndex")
    def mig_device_by_index(self, handle: int, index: int) -> int:
        gpu = self._device(handle)
        self._require_mig(gpu)
        if index >= 7:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"MIG device index {index}")
        devices = gpu.mig_devices()
        if index >= len(devices):
            raise SimNvmlError(Nvml.NOT_FOUND, f"no MIG device {index}")
        gi, ci = devices[index]
        return self._handle(("mig", gpu.index, gpu.topology_gen, gi.serial, ci.serial))

    @nvml_function("nvmlDeviceIsMigDeviceHandle")
    def is_mig_device(self, handle: int) -> bool:
        _, gi, _ = self._resolve(handle)
        return gi is not None

    @nvml_function("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
    def parent_of(self, handle: int) -> int:
        gpu, gi, _ = self._resolve(handle)
        if gi is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a MIG device handle")
        return self._handle(("gpu", gpu.index))

    @nvml_function("nvmlDeviceGetGpuInstanceId")
    def mig_gi_id(self, handle: int) -> int:
        _, gi, _ = self._resolve(handle)
        if gi is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a MIG device handle")
        return gi.id

    @nvml_function("nvmlDeviceGetComputeInstanceId")
    def mig_ci_id(self, handle: int) -> int:
        _, _, ci = self._resolve(handle)
        if ci is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a MIG device handle")
        return ci.id

    # ---- processes and telemetry -------------------------------------------------------------------
    def _process_rows(self, handle: int, mps: bool) -> list[tuple[int, int, int, int]]:
        gpu, gi, ci = self._resolve(handle)
        rows = []
        for proc in self._processes_on(gpu, gi, ci):
            if proc.mps != mps:
                continue
            # The parent's list carries GI/CI IDs only for a privileged caller (§9.2).
            show_ids = self.root and proc.gi_id is not None
            rows.append(
                (
                    proc.pid,
                    proc.used_mib * MIB,
                    proc.gi_id if show_ids and proc.gi_id is not None else WHOLE_DEVICE,
                    proc.ci_id if show_ids and proc.ci_id is not None else WHOLE_DEVICE,
                )
            )
        return rows

    @nvml_function("nvmlDeviceGetComputeRunningProcesses_v3")
    def compute_processes(self, handle: int) -> list[tuple[int, int, int, int]]:
        return self._process_rows(handle, mps=False)

    @nvml_function("nvmlDeviceGetMPSComputeRunningProcesses_v3")
    def mps_processes(self, handle: int) -> list[tuple[int, int, int, int]]:
        return self._process_rows(handle, mps=True)

    def _busy(self, gpu: SimGpu) -> int:
        return len(self._processes_on(gpu))

    @nvml_function("nvmlDeviceGetUtilizationRates")
    def utilization(self, handle: int) -> tuple[int, int]:
        gpu, gi, _ = self._resolve(handle)
        if gi is not None or gpu.mig_current:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "utilization is not reported in MIG mode")
        # (gpu, memory): the share of the sample period a kernel ran, and the share the device memory was
        # read or written, each summed over the processes' declared duty cycles.
        processes = self._processes_on(gpu)
        busy_pct = sum(p.sm_pct for p in processes)
        mem_busy_pct = sum(p.mem_busy_pct for p in processes)
        return min(100, busy_pct), min(100, mem_busy_pct)

    @nvml_function("nvmlDeviceGetClockInfo")
    def clock_info(self, handle: int, clock_type: int) -> int:
        gpu, gi, _ = self._resolve(handle)
        if gi is not None:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "clocks are a parent-GPU figure")
        if clock_type == 1:  # NVML_CLOCK_SM: idle boards park at a low clock
            return gpu.sku.max_sm_clock_mhz if self._busy(gpu) else 345
        if clock_type == 2:  # NVML_CLOCK_MEM
            return gpu.sku.mem_clock_mhz
        raise SimNvmlError(Nvml.NOT_SUPPORTED, f"clock type {clock_type}")

    @nvml_function("nvmlDeviceGetPowerUsage")
    def power_usage_mw(self, handle: int) -> int:
        gpu = self._device_whole(handle, "power")
        load = min(1.0, 0.3 * self._busy(gpu))
        return int((gpu.sku.idle_power_w + (gpu.sku.power_limit_w - gpu.sku.idle_power_w) * load) * 1000)

    @nvml_function("nvmlDeviceGetEnforcedPowerLimit")
    def power_limit_mw(self, handle: int) -> int:
        return self._device_whole(handle, "power").sku.power_limit_w * 1000

    @nvml_function("nvmlDeviceGetTemperature")
    def temperature_c(self, handle: int, sensor: int) -> int:
        gpu = self._device_whole(handle, "temperature")
        if sensor != 0:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, f"sensor {sensor}")
        return 30 + 10 * min(4, self._busy(gpu))

    def _device_whole(self, handle: int, what: str) -> SimGpu:
        gpu, gi, _ = self._resolve(handle)
        if gi is not None:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, f"{what} is a whole-GPU figure")
        return gpu

    @nvml_function("nvmlDeviceGetTotalEccErrors")
    def total_ecc_errors(self, handle: int, error_type: int, counter_type: int) -> int:
        gpu, gi, _ = self._resolve(handle)
        if error_type not in (0, 1) or counter_type not in (0, 1):
            raise SimNvmlError(Nvml.INVALID_ARGUMENT)
        if gi is not None and not (error_type == 1 and counter_type == 0):
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "MIG devices report uncorrected volatile errors only")
        if gi is None and gpu.mig_current and counter_type == 0:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "volatile counts through the parent in MIG mode")
        counts = gpu.ecc_volatile if counter_type == 0 else gpu.ecc_aggregate
        return counts[error_type]

    @nvml_function("nvmlDeviceGetRemappedRows")
    def remapped_rows(self, handle: int) -> tuple[int, int, int, int]:
        gpu = self._device(handle)
        if gpu.gis:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "row remapping is hidden while instances exist")
        return 0, 0, 0, 0

    @nvml_function("nvmlDeviceGetComputeMode")
    def get_compute_mode(self, handle: int) -> int:
        gpu, _, _ = self._resolve(handle)
        return gpu.compute_mode

    @nvml_function("nvmlDeviceSetComputeMode")
    def set_compute_mode(self, handle: int, mode: int) -> None:
        gpu, _, _ = self._resolve(handle)
        if not self.root:
            raise SimNvmlError(Nvml.NO_PERMISSION)
        if mode == 1:  # EXCLUSIVE_THREAD: support removed
            raise SimNvmlError(Nvml.NOT_SUPPORTED)
        if mode not in (0, 2, 3):
            raise SimNvmlError(Nvml.INVALID_ARGUMENT)
        gpu.compute_mode = mode

    # ---- events --------------------------------------------------------------------------------------
    def _supported_events(self, gpu: SimGpu) -> int:
        mask = Event.SINGLE_BIT_ECC | Event.DOUBLE_BIT_ECC | Event.XID_CRITICAL
        return mask | (Event.MIG_CONFIG_CHANGE if gpu.sku.mig_capable else 0)

    @nvml_function("nvmlEventSetCreate")
    def event_set_create(self) -> int:
        number = self._next_serial()
        self._event_sets[number] = SimEventSet()
        return self._handle(("evset", number))

    def _event_set(self, handle: int) -> SimEventSet:
        key = self._key(handle)
        if key[0] != "evset" or key[1] not in self._event_sets:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT, "not a live event set")
        return self._event_sets[key[1]]

    @nvml_function("nvmlDeviceGetSupportedEventTypes")
    def supported_event_types(self, handle: int) -> int:
        return self._supported_events(self._device(handle))

    @nvml_function("nvmlDeviceRegisterEvents")
    def register_events(self, handle: int, mask: int, set_handle: int) -> None:
        gpu, gi, _ = self._resolve(handle)
        if gi is not None:
            raise SimNvmlError(Nvml.NOT_SUPPORTED, "register events on the parent GPU")
        if mask & ~self._supported_events(gpu):
            raise SimNvmlError(Nvml.NOT_SUPPORTED, f"event mask 0x{mask:x}")
        event_set = self._event_set(set_handle)
        event_set.registrations[gpu.index] = event_set.registrations.get(gpu.index, 0) | mask

    @nvml_function("nvmlEventSetWait_v2")
    def event_wait(self, set_handle: int, timeout_ms: int) -> tuple[int, int, int, int, int]:
        """(device handle, event type, event data, GI ID, CI ID); TIMEOUT after advancing the clock."""
        event_set = self._event_set(set_handle)
        if not event_set.queue:
            self.clock.advance(timeout_ms / 1000)
            raise SimNvmlError(Nvml.TIMEOUT)
        gpu_index, event_type, data, gi_id, ci_id = event_set.queue.popleft()
        return self._handle(("gpu", gpu_index)), event_type, data, gi_id, ci_id

    @nvml_function("nvmlEventSetFree")
    def event_set_free(self, set_handle: int) -> None:
        key = self._key(set_handle)
        if self._event_sets.pop(key[1], None) is None:
            raise SimNvmlError(Nvml.INVALID_ARGUMENT)
