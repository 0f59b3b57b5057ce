"""The node agent: register, heartbeat, pull desired state, enforce it, report what happened.

Two threads. A poller long-polls the plane for the desired state and hands each new one over. The
main loop wakes on a new desired state or every `tick_s` and, in order:
  1. registers (once, with back-off),
  2. drains NVML events (Xid 79 → the GPU leaves the inventory),
  3. applies a new desired state, or re-checks the current one every `reconcile_s` (idempotent: an
     unchanged host gets zero mutating NVML calls),
  4. supervises tasks: exits, max runtime, stop escalation, the time-slice memory watchdog,
  5. heartbeats when due, 6. queues reports on disk and sends what it can, 7. saves its state file.
No step waits on the plane, so running tasks keep running through an outage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.backend import BackendError, GpuBackend
from agents.capture import Batch
from agents.client import Backoff, PlaneClient, PlaneRejected, PlaneUnavailable
from agents.enforce.mig import reconcile_mig
from agents.enforce.mps import MpsError, MpsManager
from agents.enforce.timeslice import find_overruns
from agents.isolation import cdi, cgroups, host, podman
from agents.isolation.plan import SandboxPlan
from agents.runner import Finished, Runner, TaskProcess, remaining_output, visible_devices
from agents.state import Outbox, StateFile
from whalegen import __version__
from whalegen.protocol import (
    DesiredState,
    DesiredTaskState,
    GpuEvent,
    GpuInventory,
    GpuLayout,
    Heartbeat,
    LogChunk,
    LogLine,
    LogStreamName,
    MigInstance,
    MpsSpec,
    PartitionMode,
    PartitionReport,
    PartitionState,
    ProcessSample,
    ProtocolError,
    Register,
    Report,
    RunningTask,
    TaskReport,
    TaskRuntime,
    TaskSpec,
    TaskState,
    TelemetrySample,
    UnitKind,
    run_key,
)

log = logging.getLogger("whalegen.agent")

Paths = tuple[str, ...]
STALE_CGROUP_S = 300.0  # an empty run cgroup older than this is a killed launcher's leftover


class RunRefused(Exception):
    """A run this host must not start (the sentence says why); it ends `rejected`."""


@dataclass(frozen=True)
class RunDevices:
    """What a run is handed: its device (a GPU, a MIG instance: the first of a multi-GPU run), the
    environment that points CUDA at it, and host paths it must reach (an MPS pipe directory)."""

    uuid: str
    env: dict[str, str]
    expose: tuple[str, ...] = ()


EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, what MPS wants (reference §6.1)
MAX_QUEUED_EVENTS = 200
# Output shipping. A report carries about this much captured text, so one POST stays small; while more
# than LOG_BACKLOG_REPORTS reports wait (the plane is slow or down), live runs' output stays in their
# capture on disk, where the launcher's cap bounds it, instead of piling up in the outbox.
LOG_REPORT_BYTES = 512 << 10
LOG_BACKLOG_REPORTS = 4
LOG_TICK_BYTES = 2 << 20  # read per run per pass at most (then the next pass follows at once)


@dataclass(frozen=True)
class AgentConfig:
    server: str
    token: str
    state_dir: Path
    node_name: str = field(default_factory=socket.gethostname)
    allow_mig_mode_change: bool = False  # the node's consent; the desired state must also allow it
    mps_exclusive_compute_mode: bool = True
    heartbeat_s: float = 10.0
    poll_wait_s: float = 20.0
    tick_s: float = 1.0
    reconcile_s: float = 30.0
    log_cap_bytes: int = 10 << 20  # per run: the head and the tail of a bigger output are kept
    # Isolation (docs/isolation.md). Root agents start each run as its tenant's uid (from the plane,
    # within this range), in a cgroup under `cgroup_root` with its limits and a /tmp of its own; an agent
    # that is not root cannot, and runs tasks only where the operator declared the host single-tenant.
    single_tenant: bool = False
    uid_range: tuple[int, int] = (200_000, 299_999)
    cgroup_root: str = "whalegen"
    private_tmp: bool = True
    # The container engine for container runs (podman); None: this host runs none (they are refused).
    container_engine: podman.EngineConfig | None = None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: GpuBackend,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.clock = clock
        self.rng = rng or random.Random()
        config.state_dir.mkdir(parents=True, exist_ok=True)
        # Tasks run as other users: they may pass through the state directory (to their own run
        # directory, an MPS pipe) but not list it, and every file the agent keeps there is its own.
        config.state_dir.chmod(0o711)
        self.runs_dir = config.state_dir / "runs"  # each run's working directory, owned by its uid
        self.runs_dir.mkdir(exist_ok=True, mode=0o711)
        self.lease_file = config.state_dir / "lease"
        self.lease_s = 0.0  # from the plane at registration; 0 = no fence
        self.lease_until_s = float("inf")  # what the lease file says (wall clock)
        self.policy = host.HostPolicy(
            is_root=os.geteuid() == 0,
            agent_uid=os.geteuid(),
            single_tenant=config.single_tenant,
            uid_min=config.uid_range[0],
            uid_max=config.uid_range[1],
            cgroup_root=config.cgroup_root,
            private_tmp=config.private_tmp,
            container_ready="no container engine is configured on this agent",
        )
        self._cdi: cdi.CdiRegistry | None = None
        self.client = PlaneClient(config.server, config.token)
        self.poll_client = PlaneClient(config.server, config.token)
        self.runner = Runner(
            config.state_dir / "tasks",
            log_cap_bytes=config.log_cap_bytes,
            node_name=config.node_name,
            plane=config.server.rstrip("/"),
        )
        self.mps = MpsManager(config.state_dir / "mps")
        self.state_file = StateFile(config.state_dir)
        self.outbox = Outbox(config.state_dir / "outbox")
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self._inbox_lock = threading.Lock()
        self._inbox: DesiredState | None = None
        self._poll_generation = 0
        # Set when the poller must fetch now without a long poll (`poll_wait_s` 0): at registration, and
        # when a heartbeat's answer names a newer generation than the poller holds.
        self._fetch = threading.Event()
        self._plane_answered = threading.Event()  # the poller's last fetch was answered

        self.node_id: str | None = None
        self.desired: DesiredState | None = None
        self._desired_encoded: tuple[DesiredState | None, dict[str, Any] | None] = (None, None)
        self.generation_applied = 0
        # Keyed by run key (`protocol.run_key`: task id and attempt), so a requeued task handed back to
        # this node is a new run here, never confused with its earlier attempt.
        self.specs: dict[str, TaskSpec] = {}  # runs started and not yet reported finished
        self.finished: set[str] = set()  # runs that ended here: never started again
        self.stop_reasons: dict[str, tuple[TaskState, str]] = {}
        self.partitions: dict[str, PartitionReport] = {}  # last report per GPU
        self.inventory: list[GpuInventory] = []
        self.lost: set[str] = set()
        self.events: list[GpuEvent] = []
        self.pending_tasks: list[TaskReport] = []
        self.pending_partitions: list[PartitionReport] = []
        self.pending_logs: list[LogChunk] = []
        self.seq = 0
        self._backoff = {name: Backoff(rng=self.rng) for name in ("register", "heartbeat", "report")}
        self._next_heartbeat_s = 0.0
        self._next_reconcile_s = 0.0

    # ---- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Open NVML, load the state file, re-adopt tasks left running by a previous agent."""
        if self.config.container_engine is not None:
            ready = podman.engine_available(self.config.container_engine)
            self.policy = dataclasses.replace(self.policy, container_ready=ready)
        if self.policy.is_root:
            # Cgroups of this node's runs whose launchers were killed outright (nothing else removes them).
            with contextlib.suppress(OSError):
                cgroups.prune_stale(
                    self.policy.cgroup_root,
                    host.run_prefix(self.config.node_name),
                    older_than_s=STALE_CGROUP_S,
                    now_s=time.time(),
                )
        self.backend.open()
        self.events.extend(self.backend.events(0))  # registers for events before anything can happen
        self.inventory = self.backend.inventory()
        saved = self.state_file.load()
        with contextlib.suppress(OSError, ValueError):
            self.lease_until_s = float(self.lease_file.read_text())  # a previous agent's fence
        self.seq = max(int(saved.get("seq", 0)), self.outbox.last_seq())
        self.finished = set(saved.get("finished", []))
        if saved.get("desired"):
            try:
                self.desired = DesiredState.from_dict(saved["desired"])
                self.generation_applied = int(saved.get("generation_applied", 0))
                self._poll_generation = self.generation_applied
            except ProtocolError:
                log.warning("ignoring an unreadable desired state in the state file")
        self.specs = {tid: TaskSpec.from_dict(spec) for tid, spec in saved.get("specs", {}).items()}
        now = self.clock()
        for gpu in self.inventory:
            if gpu.lost:
                self._mark_lost(gpu.uuid, "NVML answers GPU_IS_LOST at start-up", now)
        for record in saved.get("tasks", []):
            ended = self.runner.adopt(record)
            if ended is None:
                self._task_report(
                    record["task_id"],
                    int(record.get("attempt", 0)),
                    TaskState.RUNNING,
                    now,
                    pid=record["pid"],
                    device_uuid=record.get("device_uuid"),
                    reason="re-adopted after agent restart",
                )
            else:
                self._on_finished(ended, now)
        # Launchers no record names: the state directory was wiped, or the agent died between starting a
        # run and saving its state. Starting the plane's list again would run them twice.
        for proc in self.runner.scan():
            log.warning(
                "run %s (pid %d) found by its marker, not in the state file",
                proc.key,
                proc.pid,
                extra={"task_id": proc.task_id, "attempt": proc.attempt},
            )
            self._task_report(
                proc.task_id,
                proc.attempt,
                TaskState.RUNNING,
                now,
                pid=proc.pid,
                device_uuid=proc.device_uuid,
                reason="re-adopted after agent restart (found by its run marker)",
            )
        log.info("agent started: %d GPUs, %d tasks re-adopted", len(self.inventory), len(self.runner.tasks))
        log.info("isolation: %s", self.isolation_summary())

    def isolation_summary(self) -> str:
        """How this agent runs tasks, in one sentence for its log (and the operator's first look)."""
        policy = self.policy
        if policy.is_root:
            process = (
                f"process runs as their tenant's uid ({policy.uid_min}-{policy.uid_max}), no new "
                f"privileges, cgroup limits under {policy.cgroup_root}/"
                + (", a private /tmp" if policy.private_tmp else "")
                + ", other GPUs' device nodes masked (from the host's CDI spec)"
            )
        elif policy.single_tenant:
            process = (
                f"NOT ROOT: process runs as this agent's own user (uid {policy.agent_uid}) without a "
                "sandbox; the operator declared this host single-tenant, so runs of one tenant at a time"
            )
        else:
            process = (
                f"NOT ROOT: this agent (uid {policy.agent_uid}) refuses process runs, it cannot start "
                "them as their tenant's user (WHALEGEN_AGENT_SINGLE_TENANT=true for a one-tenant host)"
            )
        containers = (
            "container runs through the engine"
            if policy.container_ready is None
            else f"no container runs ({policy.container_ready})"
        )
        return f"{process}; {containers}"

    def run(self) -> None:
        self.start()
        poller = threading.Thread(target=self._poll_loop, name="desired-state-poller", daemon=True)
        poller.start()
        try:
            while not self.stop_event.is_set():
                try:
                    self.tick()
                except Exception:
                    # One bad pass must not take the supervisor of running tasks down with it.
                    log.exception("agent loop pass failed; continuing")
                self.wake.wait(self.config.tick_s)
                self.wake.clear()
        finally:
            self._save_state()
            self.client.close()
            self.poll_client.close()
            try:
                self.backend.close()
            except BackendError as error:
                log.warning("closing NVML: %s", error)

    def stop(self) -> None:
        """Leave tasks and MPS daemons running: a restarted agent re-adopts them."""
        self.stop_event.set()
        self.wake.set()
        self._fetch.set()

    # ---- the poller thread ----------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        """Two ways to learn of a new desired state (docs/agent.md, "Protocol", the desired-state row): a
        long poll held open (`poll_wait_s` > 0: the plane answers as soon as it changes), or, with
        `poll_wait_s` 0 (a plane of thousands of nodes holds no request per idle agent), a fetch when a
        heartbeat's answer names a newer generation than the one held, and once after registering."""
        backoff = Backoff(rng=self.rng)
        while not self.stop_event.is_set():
            if self.node_id is None:
                self.stop_event.wait(0.2)
                continue
            wait_s = self.config.poll_wait_s
            if wait_s <= 0:
                self._fetch.wait()
                self._fetch.clear()
                if self.stop_event.is_set():
                    return
            try:
                desired = self.poll_client.desired_state(self._poll_generation, max(0.0, wait_s))
                backoff.succeeded()
                self._plane_answered.set()
            except (PlaneUnavailable, PlaneRejected, ProtocolError) as error:
                delay = backoff.failed(time.monotonic())
                log.info("desired state unavailable (%s); retrying in %.1f s", error, delay)
                self._fetch.set()  # a fetch that failed is still owed
                self.stop_event.wait(delay)
                continue
            if desired is not None and desired.generation != self._poll_generation:
                with self._inbox_lock:
                    self._inbox = desired
                self._poll_generation = desired.generation
                self.wake.set()

    # ---- one pass of the main loop --------------------------------------------------------------------
    def tick(self) -> None:
        now = self.clock()
        # 1. Register.
        if self.node_id is None and self._backoff["register"].ready(now):
            self._register(now)
        # 2. Events.
        self._drain_events(now)
        # 3. Desired state.
        with self._inbox_lock:
            incoming, self._inbox = self._inbox, None
        if self._plane_answered.is_set():
            # The plane answers again (a poll came back): the heartbeat need not sit out its back-off
            # (after an outage up to 30 s), which would keep the node lost and its fence down meanwhile.
            self._plane_answered.clear()
            self._backoff["heartbeat"].succeeded()
        if incoming is not None:
            self.desired = incoming
            self._apply(now, new=True)
        elif self.desired is not None and now >= self._next_reconcile_s:
            self._apply(now, new=False)
        # 4. Supervise.
        self._supervise(now)
        # 5. Heartbeat.
        if (
            self.node_id is not None
            and now >= self._next_heartbeat_s
            and self._backoff["heartbeat"].ready(now)
        ):
            self._heartbeat(now)
        # 6. Reports (with the output captured since the last pass).
        self._collect_output()
        self._queue_reports(now)
        if self.node_id is not None and self._backoff["report"].ready(now):
            self._flush_reports(now)
        # 7. State file.
        self._save_state()

    def _register(self, now: float) -> None:
        message = Register(
            node_name=self.config.node_name,
            hostname=socket.gethostname(),
            agent_version=__version__,
            inventory=tuple(self.inventory),
        )
        register_sent_s = time.time()
        try:
            registered = self.client.register(message)
        except (PlaneUnavailable, PlaneRejected, ProtocolError) as error:
            delay = self._backoff["register"].failed(now)
            log.warning("register failed (%s); retrying in %.1f s", error, delay)
            return
        self._backoff["register"].succeeded()
        self.node_id = registered.node_id
        self._fetch.set()  # whatever was assigned while this agent was away
        if registered.stored_seq > self.seq:
            self._renumber_outbox(registered.stored_seq)
        self.config = _replace_intervals(self.config, registered.heartbeat_interval_s, registered.poll_wait_s)
        self.lease_s = max(0.0, registered.lease_s)
        if self.lease_s:
            self._renew_lease(register_sent_s)
        elif self.lease_file.exists():
            # A plane that keeps no fence: the launchers of runs started under an earlier one keep the last
            # time they read, so the file says "never" rather than going away.
            self._write_lease(float("inf"))
        log.info(
            "registered as node %s%s",
            self.node_id,
            f"; runs are fenced {self.lease_s:.0f} s after the last acknowledged heartbeat"
            if self.lease_s
            else "",
        )

    def _renumber_outbox(self, stored_seq: int) -> None:
        """The plane holds reports numbered above anything this agent numbered: our state was lost and
        our numbering restarted. Continue above the plane's, moving what waits in the outbox up too (a
        report the plane holds under the same seq is another one: ours would be dropped as a repeat)."""
        log.warning("plane holds reports up to seq %d, ours restart at %d; renumbering", stored_seq, self.seq)
        self.seq = stored_seq
        for old_seq, data in self.outbox.pending():
            self.seq += 1
            data["seq"] = self.seq
            self.outbox.put(self.seq, data)
            self.outbox.done(old_seq)

    def _drain_events(self, now: float) -> None:
        try:
            events = self.backend.events(0)
        except BackendError as error:
            log.warning("reading NVML events failed: %s", error)
            return
        for event in events:
            if event.fatal:
                self._mark_lost(event.gpu_uuid, f"Xid {event.xid}: GPU fell off the bus", now)
        self.events = (self.events + events)[-MAX_QUEUED_EVENTS:]

    def _mark_lost(self, gpu_uuid: str, reason: str, now: float) -> None:
        """A lost GPU leaves the usable inventory once, with one partition report saying why."""
        if not gpu_uuid or gpu_uuid in self.lost:
            return
        self.lost.add(gpu_uuid)
        log.error("GPU %s lost: %s", gpu_uuid, reason)
        report = PartitionReport(
            gpu_uuid, PartitionState.GPU_LOST, now, self.generation_applied, reason=reason
        )
        self._partition_report(report)

    # ---- applying the desired state ----------------------------------------------------------------
    def _gpu_index(self, gpu_uuid: str) -> int | None:
        return next((gpu.index for gpu in self.inventory if gpu.uuid == gpu_uuid), None)

    def _apply(self, now: float, *, new: bool) -> None:
        desired = self.desired
        assert desired is not None
        self._next_reconcile_s = now + self.config.reconcile_s
        for layout in desired.gpus:
            self._apply_layout(layout, desired, now)
        if new:
            self.generation_applied = desired.generation
        self._apply_tasks(desired, now)

    def _apply_layout(self, layout: GpuLayout, desired: DesiredState, now: float) -> None:
        index = self._gpu_index(layout.gpu_uuid)
        if index is None or layout.gpu_uuid in self.lost:
            state = PartitionState.GPU_LOST if layout.gpu_uuid in self.lost else PartitionState.ERROR
            reason = "GPU is lost" if state is PartitionState.GPU_LOST else "no such GPU on this node"
            self._partition_report(
                PartitionReport(layout.gpu_uuid, state, now, desired.generation, reason=reason)
            )
            return
        report = reconcile_mig(
            self.backend,
            index,
            layout,
            generation=desired.generation,
            allow_mode_change=self.config.allow_mig_mode_change and desired.allow_mig_mode_change,
            now_s=now,
        )
        if report.state is PartitionState.GPU_LOST:
            self._mark_lost(layout.gpu_uuid, report.reason, now)
            return
        if report.state is PartitionState.OK:
            report = self._apply_sharing(index, layout, report, now)
        self._partition_report(report)

    def _apply_sharing(
        self, index: int, layout: GpuLayout, report: PartitionReport, now: float
    ) -> PartitionReport:
        """MPS daemon up with its defaults in MPS mode; down (once idle) otherwise."""
        actions = list(report.actions)
        try:
            if layout.mode is PartitionMode.MPS:
                if (
                    self.config.mps_exclusive_compute_mode
                    and self.backend.compute_mode(index) != EXCLUSIVE_PROCESS
                ):
                    self.backend.set_compute_mode(index, EXCLUSIVE_PROCESS)
                    actions.append("compute mode EXCLUSIVE_PROCESS")
                actions += self.mps.ensure(layout.gpu_uuid, layout.mps or MpsSpec())
            elif self.mps.daemon_pid(layout.gpu_uuid) is not None and not self._tasks_on(layout.gpu_uuid):
                self.mps.shutdown(layout.gpu_uuid)
                actions.append("mps daemon stopped")
                if (
                    self.config.mps_exclusive_compute_mode
                    and self.backend.compute_mode(index) == EXCLUSIVE_PROCESS
                ):
                    self.backend.set_compute_mode(index, 0)
                    actions.append("compute mode DEFAULT")
        except MpsError as error:
            return _with(report, state=PartitionState.ERROR, actions=tuple(actions), reason=f"MPS: {error}")
        except BackendError as error:
            return _with(
                report,
                state=PartitionState.ERROR,
                actions=tuple(actions),
                errors=(*report.errors, error.failure),
                reason=str(error),
            )
        return _with(report, actions=tuple(actions))

    def _tasks_on(self, gpu_uuid: str) -> list[str]:
        return [key for key in self.runner.tasks if key in self.specs and gpu_uuid in self.specs[key].devices]

    def _apply_tasks(self, desired: DesiredState, now: float) -> None:
        wanted = {run_key(task.task_id, task.attempt): task for task in desired.tasks}
        for key in list(self.runner.tasks):
            spec = wanted.get(key)
            if spec is None or spec.desired is DesiredTaskState.STOP:
                why = "stopped by the plane" if spec is not None else "no longer in the desired state"
                self.stop_reasons.setdefault(key, (TaskState.STOPPED, why))
                self.runner.stop(key, why, now)
        for key in self.runner.tasks.keys() - self.specs.keys():
            spec = wanted.get(key)
            if spec is not None:
                # Adopted by its marker: the desired state is where its unit and limits come from.
                self.specs[key] = spec
                self.runner.set_limits(key, max_runtime_s=spec.max_runtime_s, stop_grace_s=spec.stop_grace_s)
        fenced = self._lease_out()
        for key, task in wanted.items():
            running_or_done = key in self.runner.tasks or key in self.finished
            if task.desired is DesiredTaskState.RUN and not running_or_done:
                if fenced:
                    # Its launcher would stop it at once (the fence), a start spent for nothing: the run
                    # waits for the next acknowledged heartbeat, and the desired state is applied again.
                    self._next_reconcile_s = min(self._next_reconcile_s, now + self.config.tick_s)
                    self._next_heartbeat_s = min(self._next_heartbeat_s, now)
                    continue
                self._start_task(task, now)
        # Remember ended tasks only while the plane still lists them (so they are never rerun).
        self.finished &= set(wanted)

    def _start_task(self, task: TaskSpec, now: float) -> None:
        lost = [uuid for uuid in task.devices if uuid in self.lost]
        if lost:
            self._reject(task, now, f"GPU {', '.join(lost)} is lost")
            return
        live_tenants = [self.specs[key].tenant for key in self.runner.tasks if key in self.specs]
        refused = host.refusal(task, self.policy, live_tenants)
        if refused is not None:
            self._reject(task, now, refused)
            return
        key = run_key(task.task_id, task.attempt)
        try:
            devices = self._devices_for(task)
            if task.runtime is TaskRuntime.CONTAINER:
                proc = self._start_container(task, devices, now)
            else:
                proc = self._start_process(task, devices, now)
        except RunRefused as refused:
            self._reject(task, now, str(refused))
            return
        except (OSError, ValueError) as error:
            # The launcher could not be started, or the run cannot be put in words the engine takes (an
            # environment variable podman's env file cannot carry): the run failed to launch (not a
            # missing unit, which another node may have), so it ends failed rather than being retried.
            self.finished.add(key)
            why = (
                f"launch failed: cannot start the launcher: {error}"
                if isinstance(error, OSError)
                else f"launch failed: {error}"
            )
            self.pending_logs.append(
                LogChunk(
                    task.task_id, task.attempt, 0, (LogLine(now, LogStreamName.LAUNCHER, why),), eof=True
                )
            )
            self._task_report(
                task.task_id, task.attempt, TaskState.FAILED, now, reason=why, finished_at_s=now
            )
            return
        self.specs[proc.key] = task
        self._task_report(
            task.task_id,
            task.attempt,
            TaskState.RUNNING,
            now,
            pid=proc.pid,
            device_uuid=devices.uuid,
            started_at_s=now,
        )

    def _devices_for(self, task: TaskSpec) -> RunDevices:
        """The device a run is handed and what it needs to reach it; RunRefused when its unit is not
        here as the plane thinks (a MIG instance not carved, no MPS daemon)."""
        if task.unit.kind is UnitKind.MIG:
            instance = self._mig_instance_for(task)
            if instance is None or instance.mig_uuid is None:
                state = self.partitions.get(task.gpu_uuid)
                start = "any" if task.unit.mig_start is None else task.unit.mig_start
                where = f"{task.unit.mig_profile}@{start}"
                partition = state.state if state else "unknown"
                raise RunRefused(f"MIG instance {where} not present (partition {partition})")
            return RunDevices(instance.mig_uuid, {"CUDA_VISIBLE_DEVICES": instance.mig_uuid})
        if task.unit.kind is UnitKind.MPS:
            if self.mps.daemon_pid(task.gpu_uuid) is None:
                raise RunRefused("no MPS daemon on this GPU (layout mode is not mps)")
            # No CUDA_VISIBLE_DEVICES: the MPS server remaps devices (reference §6.1).
            env = self.mps.client_env(task.gpu_uuid, task.unit.thread_pct, task.unit.pinned_mem_mib)
            return RunDevices(task.gpu_uuid, env, (str(self.mps.dirs(task.gpu_uuid).pipe),))
        # Whole GPUs and time slices: every GPU of the task, in order (a multi-GPU task sees them all).
        return RunDevices(task.gpu_uuid, {"CUDA_VISIBLE_DEVICES": visible_devices(task.devices)})

    def _start_process(self, task: TaskSpec, devices: RunDevices, now: float) -> TaskProcess:
        """A command of the host, as its tenant's uid in the launcher's sandbox (`host.process_plan`)."""
        backend_env = self.backend.task_env()
        work_dir = self._run_dir(task)
        env = host.task_env(task, backend_env=backend_env, device_env=devices.env, home=str(work_dir))
        # What the task's programs must reach although /tmp is its own: its working directory, the
        # backend's directories (the simulated NVML's process directory, say), its devices' nodes.
        masked, own = self._device_nodes(task, devices.uuid)
        backend_dirs = [v for v in backend_env.values() if v.startswith("/")]
        # A working directory the task names is a host path it asked for: under /tmp it must stay there.
        # (One that is not there is left to the launcher, whose chdir then fails the run in words.)
        asked = (
            [task.working_dir] if os.path.isabs(task.working_dir) and os.path.isdir(task.working_dir) else []
        )
        expose = [*devices.expose, str(work_dir), *asked, *backend_dirs, *own]
        plan = host.process_plan(
            task,
            self.policy,
            name=self._run_name(task),
            expose=expose,
            mask=masked,
            lease_file=str(self.lease_file) if self.lease_s else "",
        )
        return self.runner.start(
            task.task_id,
            list(task.command),
            env,
            device_uuid=devices.uuid,
            now_s=now,
            max_runtime_s=task.max_runtime_s,
            stop_grace_s=task.stop_grace_s,
            attempt=task.attempt,
            working_dir=task.working_dir,
            plan=plan,
            work_dir=work_dir,
        )

    def _start_container(self, task: TaskSpec, devices: RunDevices, now: float) -> TaskProcess:
        """The task's image through the container engine, given exactly its devices by CDI; the engine
        does the sandbox, the launcher the cgroup (the container's parent) and the fence."""
        engine = self.config.container_engine
        assert engine is not None and task.run_as_uid is not None and task.run_as_gid is not None
        name = self._run_name(task)
        cgroup = f"{self.policy.cgroup_root}/{name}"
        task_dir = self.runner.task_dir(task.task_id, task.attempt)
        task_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The environment goes in a file only root reads: on the engine's command line every user of the
        # host would read the values in /proc.
        env_file = task_dir / "env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(podman.env_file_text({**task.env, **devices.env}))
        cdi_names = [self.backend.cdi_device(uuid) for uuid in self._run_devices(task, devices.uuid)]
        argv = podman.run_argv(
            engine,
            name=podman.container_name(self.config.node_name, task.task_id, task.attempt, self.runner.plane),
            image=task.image,
            command=task.command,
            uid=task.run_as_uid,
            gid=task.run_as_gid,
            env_file=str(env_file),
            cdi_devices=cdi_names,
            mounts=[podman.Mount(path, path, read_only=False) for path in devices.expose],
            workdir=task.working_dir,
            cgroup_parent=cgroup,
            pull_policy=task.pull_policy.value,
            pids_max=task.pids_max or None,
        )
        plan = SandboxPlan(
            runtime="container",
            cgroup=cgroup,
            cpu_milli=task.cpu_milli or None,  # 0: no limit, as for a process run
            host_mem_mib=task.host_mem_mib or None,
            pids_max=task.pids_max or None,
            container=argv[argv.index("--name") + 1],
            engine=engine.prefix,
            lease_file=str(self.lease_file) if self.lease_s else "",
            stop_grace_s=task.stop_grace_s,
        )
        return self.runner.start(
            task.task_id,
            argv,
            {"PATH": host.DEFAULT_PATH},  # the launcher's, to find the engine; the task's is in the file
            device_uuid=devices.uuid,
            now_s=now,
            max_runtime_s=task.max_runtime_s,
            stop_grace_s=task.stop_grace_s,
            attempt=task.attempt,
            plan=plan,
        )

    def _run_name(self, task: TaskSpec) -> str:
        return host.run_name(self.config.node_name, self.runner.plane, task.task_id, task.attempt)

    def _run_devices(self, task: TaskSpec, device_uuid: str | None) -> list[str]:
        """The GPU devices a run is given: its MIG instance, or its GPUs (an MPS share: its GPU)."""
        if task.unit.kind is UnitKind.MIG and device_uuid:
            return [device_uuid]
        return list(task.devices)

    def _device_nodes(self, task: TaskSpec, device_uuid: str | None) -> tuple[Paths, Paths]:
        """(the device nodes of this host's GPUs a process run was not given, to mask; those it was given
        and the ones every GPU program needs, kept reachable), from the host's CDI spec. A spec that does
        not name the run's devices is read again, then renewed (`refresh_cdi`: a MIG re-carve gives new
        UUIDs); still nothing, the run is refused: it never starts seeing GPUs that are not its own."""
        if not self.policy.is_root:
            return (), ()
        given = self._run_devices(task, device_uuid)
        problem = ""
        for attempt in range(3):
            if attempt == 2:
                renewed = self.backend.refresh_cdi()
                if renewed is not None:
                    problem = f"{problem}; {renewed}"
                    break
            if self._cdi is None or attempt:
                self._cdi = cdi.load_registry(self.backend.cdi_spec_dirs())
            try:
                names = [self.backend.cdi_device(uuid) for uuid in given]
                kind = cdi.parse_qualified_name(names[0])[0]
                own = [node for name in names for node in cdi.device_nodes(self._cdi, name)]
                own += cdi.common_nodes(self._cdi, kind)
                return cdi.mask_nodes(self._cdi, kind=kind, given=names), tuple(own)
            except (cdi.CdiError, LookupError, IndexError) as error:
                problem = str(error)
        raise RunRefused(f"cannot tell this run's GPU device nodes from the others': {problem}")

    def _run_dir(self, task: TaskSpec) -> Path:
        """The run's own working directory: empty, owned by the uid it runs as, closed to everyone else."""
        path = self.runs_dir / Path(self.runner.task_dir(task.task_id, task.attempt)).name
        if path.exists():
            shutil.rmtree(path)  # a run is new each start; nothing of an earlier one is handed over
        path.mkdir(mode=0o700)
        if self.policy.is_root and task.run_as_uid is not None and task.run_as_gid is not None:
            os.chown(path, task.run_as_uid, task.run_as_gid)
        return path

    def _mig_instance_for(self, task: TaskSpec) -> MigInstance | None:
        report = self.partitions.get(task.gpu_uuid)
        if report is None:
            return None
        taken = {
            self.runner.tasks[key].device_uuid
            for key in self.runner.tasks
            if key in self.specs and self.specs[key].unit.kind is UnitKind.MIG
        }
        for inst in report.instances:
            if inst.profile != task.unit.mig_profile:
                continue
            if task.unit.mig_start is not None:
                if inst.start == task.unit.mig_start:
                    return inst
            elif inst.mig_uuid not in taken:
                return inst
        return None

    def _reject(self, task: TaskSpec, now: float, reason: str) -> None:
        self.finished.add(run_key(task.task_id, task.attempt))
        self._task_report(task.task_id, task.attempt, TaskState.REJECTED, now, reason=reason)

    # ---- supervision ----------------------------------------------------------------------------------
    def _supervise(self, now: float) -> None:
        limits = {
            tid: self.specs[tid].unit.mem_limit_mib
            for tid in self.runner.tasks
            if tid in self.specs
            and self.specs[tid].unit.kind is UnitKind.TIMESLICE
            and self.specs[tid].unit.mem_limit_mib is not None
        }
        if limits:
            gpus = {uuid for key in limits for uuid in self.specs[key].devices}
            processes: list[ProcessSample] = []
            for gpu_uuid in gpus - self.lost:
                index = self._gpu_index(gpu_uuid)
                if index is None:
                    continue
                try:
                    processes += self.backend.processes(index)
                except BackendError as error:
                    log.warning("watchdog cannot read processes on %s: %s", gpu_uuid, error)
            bounded = {tid: int(limit) for tid, limit in limits.items() if limit is not None}
            for overrun in find_overruns(processes, bounded, self.runner.pgid_of):
                if overrun.task_id not in self.stop_reasons:
                    run = self.runner.tasks.get(overrun.task_id)
                    context = {"task_id": run.task_id, "attempt": run.attempt} if run else {}
                    log.warning("task %s: %s", overrun.task_id, overrun.reason, extra=context)
                    self.stop_reasons[overrun.task_id] = (TaskState.FAILED, overrun.reason)
                    self.runner.stop(overrun.task_id, overrun.reason, now)
        for ended in self.runner.poll(now):
            self._on_finished(ended, now)

    def _on_finished(self, ended: Finished, now: float) -> None:
        # Its output first: the plane has all of it by the time it learns the run ended.
        if ended.task_dir:
            batches = remaining_output(ended, max_bytes=LOG_REPORT_BYTES)
            for batch in batches:
                self.pending_logs.append(_chunk(ended.task_id, ended.attempt, batch))
            last = batches[-1].cursor.line if batches else int(ended.log_cursor[2])
            self.pending_logs.append(LogChunk(ended.task_id, ended.attempt, last, eof=True))
        state, reason = self.stop_reasons.pop(ended.key, (None, ended.reason))
        if state is None and ended.launch_error:
            state, reason = TaskState.FAILED, f"launch failed: {ended.launch_error}"
        if ended.fenced:
            # Stopped on its node by its own launcher: this agent's lease ran out (it could not reach the
            # plane, or was down), so the plane may already run the work elsewhere. Lost, not failed:
            # the plane runs it again unless it already has.
            state, reason = TaskState.LOST, ended.killed_reason or "stopped by the fence"
        elif state is None and ended.killed_reason:
            state, reason = TaskState.FAILED, ended.killed_reason  # a limit of its own: memory
        if state is None:
            if ended.lost:
                state = TaskState.LOST
            elif ended.reason.startswith("max_runtime_exceeded"):
                state = TaskState.FAILED
            elif ended.exit_code == 0:
                state = TaskState.SUCCEEDED
            else:
                state = TaskState.FAILED
        spec = self.specs.pop(ended.key, None)
        self.finished.add(ended.key)
        if ended.task_dir:
            shutil.rmtree(self.runs_dir / Path(ended.task_dir).name, ignore_errors=True)
            (Path(ended.task_dir) / "env").unlink(missing_ok=True)  # a container run's secrets
        self._task_report(
            ended.task_id,
            ended.attempt,
            state,
            now,
            reason=reason,
            pid=ended.pid,
            exit_code=ended.exit_code,
            signal=ended.signal,
            device_uuid=spec.gpu_uuid if spec else None,
            finished_at_s=ended.ended_at_s or now,
        )

    # ---- heartbeat and reports ------------------------------------------------------------------------
    def _heartbeat(self, now: float) -> None:
        self._next_heartbeat_s = now + self.config.heartbeat_s
        telemetry: list[TelemetrySample] = []
        processes: list[ProcessSample] = []
        try:
            self.inventory = self.backend.inventory()
        except BackendError as error:
            log.warning("inventory failed: %s", error)
        for gpu in self.inventory:
            if gpu.lost:
                self._mark_lost(gpu.uuid, "NVML answers GPU_IS_LOST", now)
            if gpu.uuid in self.lost:
                continue
            try:
                telemetry.append(self.backend.telemetry(gpu.index))
                processes += [self._with_task(p) for p in self.backend.processes(gpu.index)]
            except BackendError as error:
                log.warning("telemetry on %s failed: %s", gpu.uuid, error)
        assert self.node_id is not None
        sent_wall_s = time.time()  # the fence is read by launchers on the wall clock, not `self.clock`
        message = Heartbeat(
            node_id=self.node_id,
            agent_version=__version__,
            sent_at_s=now,
            inventory=tuple(g if g.uuid not in self.lost else _lost(g) for g in self.inventory),
            telemetry=tuple(telemetry),
            processes=tuple(processes),
            events=tuple(self.events),
            lost_gpus=tuple(sorted(self.lost)),
            generation_applied=self.generation_applied,
            running=tuple(
                RunningTask(proc.task_id, proc.attempt, proc.pid) for proc in self.runner.tasks.values()
            ),
        )
        try:
            ack = self.client.heartbeat(message)
        except (PlaneUnavailable, PlaneRejected, ProtocolError) as error:
            delay = self._backoff["heartbeat"].failed(now)
            log.info("heartbeat failed (%s); retrying in %.1f s", error, delay)
            return
        self._backoff["heartbeat"].succeeded()
        self._renew_lease(sent_wall_s)
        # The plane's generation is newer than the poller's: fetch (without a long poll this is how a
        # change arrives; with one, the poll in flight answers by itself). Only newer: the generation a
        # heartbeat answers from Redis may be older than one a fetch got since.
        if ack.generation > self._poll_generation:
            self._fetch.set()
        # The plane answers again: the reports held back by their own back-off (up to 30 s after an
        # outage) go in this same pass. A heartbeat that no longer lists a run that ended meanwhile
        # starts the plane's grace for that run; its end must land within it, or the plane declares the
        # run lost and runs the work again (a finished result thrown away, docs/faults.md).
        self._backoff["report"].succeeded()
        self.events = []

    def _renew_lease(self, sent_wall_s: float) -> None:
        """Move the fence: runs may go on `lease_s` past the send time of this acknowledged heartbeat.
        The plane received it after it was sent, so the fence falls before the plane could call this node
        lost (its threshold counts from the receipt), and no run goes on while its work runs elsewhere."""
        if self.lease_s > 0:
            self._write_lease(sent_wall_s + self.lease_s)

    def _lease_out(self) -> bool:
        """True while this node's fence is down: the lease file (the last acknowledged heartbeat, or what a
        previous agent left) says a time already past."""
        return self.lease_until_s < time.time()

    def _write_lease(self, until_s: float) -> None:
        self.lease_until_s = until_s
        tmp = self.lease_file.with_name("lease.tmp")
        tmp.write_text(f"{until_s:.3f}\n")
        tmp.replace(self.lease_file)

    def _with_task(self, sample: ProcessSample) -> ProcessSample:
        """A GPU process sample named by the run whose process group holds it (None: not ours)."""
        key = self.runner.pgid_of(sample.pid)
        proc = self.runner.tasks.get(key) if key is not None else None
        if proc is None:
            return sample
        return dataclasses.replace(sample, task_id=proc.task_id, attempt=proc.attempt)

    def _task_report(self, task_id: str, attempt: int, state: TaskState, now: float, **fields: Any) -> None:
        reason = fields.get("reason")
        log.info(
            "task %s attempt %d %s%s",
            task_id,
            attempt,
            state.value,
            f": {reason}" if reason else "",
            extra={"task_id": task_id, "attempt": attempt},
        )
        self.pending_tasks.append(
            TaskReport(task_id=task_id, state=state, at_s=now, attempt=attempt, **fields)
        )

    def _partition_report(self, report: PartitionReport) -> None:
        """Queue a partition report when something about it changed (not on every periodic pass)."""
        last = self.partitions.get(report.gpu_uuid)
        self.partitions[report.gpu_uuid] = report
        if (
            last is not None
            and not report.actions
            and (last.state, last.instances, last.errors, last.reason, last.generation)
            == (report.state, report.instances, report.errors, report.reason, report.generation)
        ):
            return
        self.pending_partitions.append(report)

    def _collect_output(self) -> None:
        """Read what live runs wrote since the last pass, unless reports are already backing up."""
        if not self.runner.tasks:
            return  # an idle node: nothing to read, and no need to count the outbox every tick
        if self.outbox.count() >= LOG_BACKLOG_REPORTS:
            return
        for proc in self.runner.tasks.values():
            self._read_run(proc)

    def _read_run(self, proc: TaskProcess) -> None:
        for _ in range(LOG_TICK_BYTES // LOG_REPORT_BYTES):
            batch = self.runner.read_output(proc, max_bytes=LOG_REPORT_BYTES)
            if not batch.lines and not batch.dropped_lines:
                return
            self.pending_logs.append(_chunk(proc.task_id, proc.attempt, batch))
        self.wake.set()  # a loud run: read on in the next pass without waiting a tick

    def _queue_reports(self, now: float) -> None:
        """Into the outbox, in order: output chunks in reports of about LOG_REPORT_BYTES, the task and
        partition reports in the last one (so a run's output is stored before its end is)."""
        if not self.pending_tasks and not self.pending_partitions and not self.pending_logs:
            return
        groups: list[list[LogChunk]] = [[]]
        size = 0
        for chunk in self.pending_logs:
            chunk_bytes = sum(len(line.text) + 48 for line in chunk.lines)
            if groups[-1] and size + chunk_bytes > LOG_REPORT_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(chunk)
            size += chunk_bytes
        for i, logs in enumerate(groups):
            last = i == len(groups) - 1
            self.seq += 1
            report = Report(
                node_id=self.node_id or "",
                seq=self.seq,
                sent_at_s=now,
                tasks=tuple(self.pending_tasks) if last else (),
                partitions=tuple(self.pending_partitions) if last else (),
                logs=tuple(logs),
            )
            self.outbox.put(self.seq, report.to_dict())
        self.pending_tasks, self.pending_partitions, self.pending_logs = [], [], []

    def _flush_reports(self, now: float) -> None:
        for seq, data in self.outbox.pending():
            if not data.get("node_id"):
                data["node_id"] = self.node_id  # queued before registration
            try:
                self.client.report(Report.from_dict(data))
            except PlaneRejected as error:
                if refused_for_good(error.status):
                    # Sending it again gets the same answer: drop it so the reports after it get through.
                    log.error("report %d refused for good, dropped: %s", seq, error)
                    self.outbox.done(seq)
                    continue
                delay = self._backoff["report"].failed(now)
                log.warning("report %d refused (%s); retrying in %.1f s", seq, error, delay)
                return
            except (PlaneUnavailable, ProtocolError) as error:
                delay = self._backoff["report"].failed(now)
                log.info("reports buffered (%s); retrying in %.1f s", error, delay)
                return
            self.outbox.done(seq)
            self._backoff["report"].succeeded()

    def _save_state(self) -> None:
        self.state_file.save(
            {
                "node_name": self.config.node_name,
                "seq": self.seq,
                "generation_applied": self.generation_applied,
                "desired": self._desired_dict(),
                "tasks": self.runner.records(),
                "specs": {tid: spec.to_dict() for tid, spec in self.specs.items()},
                "finished": sorted(self.finished),
            }
        )

    def _desired_dict(self) -> dict[str, Any] | None:
        """The desired state as the state file keeps it, encoded once per desired state: the file is
        checked every tick, and encoding the desired state was half of that check's cost on an idle node.
        Keyed by identity, which is safe because a DesiredState is frozen and a new one is a new object."""
        if self.desired is None:
            return None
        if self._desired_encoded[0] is not self.desired:
            self._desired_encoded = (self.desired, self.desired.to_dict())
        return self._desired_encoded[1]


def _chunk(task_id: str, attempt: int, batch: Batch) -> LogChunk:
    return LogChunk(
        task_id=task_id,
        attempt=attempt,
        first_line=batch.first_line,
        lines=tuple(
            LogLine(line.at_s, LogStreamName(line.stream), line.text, line.partial) for line in batch.lines
        ),
        dropped_lines=batch.dropped_lines,
        dropped_bytes=batch.dropped_bytes,
    )


def refused_for_good(status: int) -> bool:
    """A 4xx answer to a report that resending cannot change. Not 408/429 (the plane asks to come back
    later) and not 401: a bad or rotated credential refuses every request, not this report, and the
    reports are wanted once the node has a good token again."""
    return 400 <= status < 500 and status not in (401, 408, 429)


def _with(report: PartitionReport, **changes: Any) -> PartitionReport:
    return dataclasses.replace(report, **changes)


def _lost(gpu: GpuInventory) -> GpuInventory:
    return dataclasses.replace(gpu, lost=True, instances=())


def _replace_intervals(config: AgentConfig, heartbeat_s: float, poll_wait_s: float) -> AgentConfig:
    """The plane sets the pace; a node configured to go faster (tests, benchmarks) keeps its own."""
    return dataclasses.replace(
        config,
        heartbeat_s=min(config.heartbeat_s, heartbeat_s) if heartbeat_s > 0 else config.heartbeat_s,
        # 0 from the plane: no long poll, fetch on the heartbeat's hint (`_poll_loop`).
        poll_wait_s=min(config.poll_wait_s, poll_wait_s) if poll_wait_s >= 0 else config.poll_wait_s,
    )
