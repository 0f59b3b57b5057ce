"""Start, watch and stop task processes; re-adopt them after an agent restart; read their output.

Each task runs under `agents/launch.py` in its own session (process group = launcher PID). The
launcher captures stdout and stderr into `<task dir>/output/` under the cap (`agents.capture`); the
agent reads that capture from a cursor kept with the run (and in the state file), so output survives
an agent restart and a plane outage. Not a pipe to the agent: a task must survive an agent restart,
and a pipe to a dead agent would kill it with SIGPIPE. The launcher's own stdout/stderr (its crash, if
it ever crashes) go to `<task dir>/launcher.log`.

Stopping is SIGTERM to the group → `stop_grace_s` → SIGKILL to the group, driven by `poll()` so the
agent's loop never blocks on a slow task.

Every launcher carries `WHALEGEN_RUN=<node>/<task>/<attempt>` in its environment, and
`WHALEGEN_RUN_PLANE=<plane URL>`. The state file is the first way back to running work after a restart,
the marker the second: an agent whose state directory was wiped (or whose state file lags the last
start) finds its own launchers in `/proc` (`scan`), so it neither starts a run that is still going nor
leaves one it no longer wants running unsupervised. A node name is unique only within one plane: two
planes' agents on one host (two demos, a demo beside the test suite) may both call a node `us-h200-01`,
and without the plane in the marker each would adopt, then stop, the other's runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agents import capture
from agents.isolation.cgroups import Cgroup, CgroupError
from agents.isolation.plan import SandboxPlan
from whalegen.protocol import run_key

LAUNCHER = Path(__file__).with_name("launch.py")
RUN_MARKER = "WHALEGEN_RUN"
RUN_PLANE = "WHALEGEN_RUN_PLANE"


def run_marker(node_name: str, task_id: str, attempt: int) -> str:
    return f"{node_name}/{task_id}/{attempt}"


def parse_marker(value: str) -> tuple[str, str, int] | None:
    """(node, task, attempt) from a marker; node names may hold '/', task ids and attempts do not."""
    parts = value.rsplit("/", 2)
    if len(parts) != 3 or not parts[2].isdigit() or not parts[1]:
        return None
    return parts[0], parts[1], int(parts[2])


@dataclass
class TaskProcess:
    task_id: str
    pid: int  # the launcher; also the process-group ID
    started_at_s: float
    device_uuid: str | None
    task_dir: str
    max_runtime_s: float | None
    stop_grace_s: float
    proc_start_ticks: int  # /proc/<pid>/stat field 22: tells our process from a reused PID
    stop_requested_at_s: float | None = None
    stop_reason: str = ""
    killed: bool = False
    attempt: int = 0  # which run of the task; records of agents before protocol 1.1 lack it (0)
    # Where the agent's reading of the capture stands (`capture.Cursor`); older records lack it and
    # read from the start again (the plane keeps each line once).
    log_cursor: list[Any] = field(default_factory=lambda: [capture.HEAD, 0, 0, 0])
    # A container run: the engine's argv prefix and the container's name. Killing the launcher's group
    # would leave the container running (the engine's client is only its messenger): the kill goes
    # through the engine (`rm -f`). Empty for a process run.
    engine: list[str] = field(default_factory=list)
    container: str = ""
    # The run's cgroup (root agents): the stop's SIGKILL goes to everything in it, not to the launcher,
    # which then records the end, removes the container and the cgroup, and exits (a killed launcher
    # could do none of it, and a process that left the session would go on unseen).
    cgroup: str = ""
    killed_at_s: float | None = None
    work_dir: str = ""  # the run's own working directory (owned by its uid), removed when it has ended
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        return run_key(self.task_id, self.attempt)

    def record(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "popen"}

    @property
    def cursor(self) -> capture.Cursor:
        segment, pos, line, byte = self.log_cursor
        return capture.Cursor(str(segment), int(pos), int(line), int(byte))


@dataclass(frozen=True)
class Finished:
    task_id: str
    pid: int
    exit_code: int | None
    signal: int | None
    reason: str  # "" for a natural end, else why the agent stopped it or lost track of it
    lost: bool = False  # the exit status could not be learned
    attempt: int = 0
    launch_error: str = ""  # the command never ran: the launcher's message (exit code 126/127)
    task_dir: str = ""
    # Why the launcher (not the command) ended it, in words: a memory kill by its cgroup limit, or the
    # fence (its agent's lease ran out). "" when the command ended by itself or the agent stopped it.
    killed_reason: str = ""
    fenced: bool = False
    ended_at_s: float | None = None  # when the launcher saw the command end (wall clock); None: unknown
    log_cursor: tuple[Any, ...] = (capture.HEAD, 0, 0, 0)

    @property
    def key(self) -> str:
        return run_key(self.task_id, self.attempt)


def proc_start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after the last ')' are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def _boot_time_s() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


@dataclass(frozen=True)
class FoundLauncher:
    """A launcher process on this host, read from /proc."""

    pid: int
    marker: tuple[str, str, int]  # node, task, attempt
    exit_file: str
    start_ticks: int
    env: dict[str, str]


def find_launchers() -> list[FoundLauncher]:
    """Every live task launcher on the host that carries a run marker. A launcher is its session's leader
    (started with `start_new_session`) running `launch.py EXIT_FILE … -- …`; the task's own processes
    inherit the marker but are never leaders of a session running the launcher, so they are not taken
    for it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != pid:
                continue
            raw_env = Path(f"/proc/{pid}/environ").read_bytes()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile, or another user's
        if stat[0] == "Z":
            continue
        env = dict(
            item.decode(errors="replace").split("=", 1) for item in raw_env.split(b"\0") if b"=" in item
        )
        marker = parse_marker(env.get(RUN_MARKER, ""))
        args = [a.decode(errors="replace") for a in argv]
        at = next((i for i, a in enumerate(args) if Path(a).name == LAUNCHER.name), None)
        # `launch.py EXIT_FILE [--output DIR --cap-bytes N] -- COMMAND…`
        if marker is None or at is None or len(args) < at + 3 or "--" not in args[at + 2 :]:
            continue
        found.append(FoundLauncher(pid, marker, args[at + 1], int(stat[19]), env))
    return found


def _safe_name(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)[:120] or "task"


class Runner:
    def __init__(
        self, tasks_dir: Path, *, log_cap_bytes: int = 10 << 20, node_name: str = "", plane: str = ""
    ) -> None:
        self.tasks_dir = tasks_dir
        self.node_name = node_name
        self.plane = plane  # the plane's URL: with the node name, whose runs `scan` may adopt
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        self.tasks_dir.chmod(0o700)  # exit files, captured output and sandbox plans: the agent's alone
        self.log_cap_bytes = log_cap_bytes  # per run: head and tail kept, the middle dropped
        self.tasks: dict[str, TaskProcess] = {}  # by run key (`protocol.run_key`)

    # ---- start and adopt ---------------------------------------------------------------------------
    def start(
        self,
        task_id: str,
        command: list[str],
        env: dict[str, str],
        *,
        device_uuid: str | None,
        now_s: float,
        max_runtime_s: float | None = None,
        stop_grace_s: float = 10.0,
        attempt: int = 0,
        working_dir: str = "",
        plan: SandboxPlan | None = None,
        work_dir: Path | None = None,
    ) -> TaskProcess:
        """Start one run; `env` is the task's whole environment (CUDA_VISIBLE_DEVICES included, see
        `visible_devices`): nothing of the agent's own environment is added but the run markers. The
        command starts in `working_dir` when one is given (the launcher enters it, and a directory it
        cannot enter fails the run with the launcher's message), else in `work_dir`, the run's own
        directory (`run_dir`), else in the launcher's directory. `plan` is what the launcher does around
        the command (its uid, cgroup and limits, private /tmp, masked devices, the fence); the run's
        launcher directory (`task_dir`: exit file, output, plan) is the agent's alone."""
        task_dir = self.task_dir(task_id, attempt)
        task_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (task_dir / "exit.json").unlink(missing_ok=True)
        env = {**env, RUN_MARKER: run_marker(self.node_name, task_id, attempt), RUN_PLANE: self.plane}
        launch = [sys.executable, "-S", "-E", str(LAUNCHER), str(task_dir / "exit.json")]
        launch += ["--output", str(task_dir / "output"), "--cap-bytes", str(self.log_cap_bytes)]
        cwd = working_dir if working_dir and (plan is None or plan.runtime != "container") else ""
        cwd = cwd or (str(work_dir) if work_dir is not None else "")
        if cwd:
            launch += ["--cwd", cwd]
        if plan is not None:
            launch += ["--plan", str(plan.write(task_dir))]
        with (task_dir / "launcher.log").open("ab") as own:
            popen = subprocess.Popen(
                [*launch, "--", *command],
                stdin=subprocess.DEVNULL,
                stdout=own,
                stderr=own,
                env=env,
                cwd=task_dir,
                start_new_session=True,
            )
        proc = TaskProcess(
            task_id=task_id,
            pid=popen.pid,
            started_at_s=now_s,
            device_uuid=device_uuid,
            task_dir=str(task_dir),
            max_runtime_s=max_runtime_s,
            stop_grace_s=stop_grace_s,
            proc_start_ticks=proc_start_ticks(popen.pid) or 0,
            attempt=attempt,
            engine=list(plan.engine) if plan is not None and plan.container else [],
            container=plan.container if plan is not None else "",
            cgroup=plan.cgroup if plan is not None else "",
            work_dir=str(work_dir) if work_dir is not None else "",
            popen=popen,
        )
        self.tasks[proc.key] = proc
        return proc

    def task_dir(self, task_id: str, attempt: int) -> Path:
        """The launcher's directory of one run: exit file, output capture, sandbox plan (agent only)."""
        return self.tasks_dir / _safe_name(run_key(task_id, attempt))

    def adopt(self, record: dict[str, Any]) -> Finished | None:
        """Take back a task recorded by an earlier agent; returns how it ended if it already has."""
        proc = TaskProcess(**{k: v for k, v in record.items() if k != "popen"})
        if proc_start_ticks(proc.pid) == proc.proc_start_ticks:
            self.tasks[proc.key] = proc
            return None
        return self._finished(proc)

    def scan(self) -> list[TaskProcess]:
        """Adopt this node's launchers that no record named (a wiped state directory, a state file older
        than the last start); returns them. Their limits are unknown until the desired state names the
        run again (`set_limits`); a run it does not name is stopped like any other."""
        known = {proc.pid for proc in self.tasks.values()}
        adopted = []
        boot_s = _boot_time_s()
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        for found in find_launchers():
            node, task_id, attempt = found.marker
            if node != self.node_name or found.pid in known or run_key(task_id, attempt) in self.tasks:
                continue
            # Another plane's node of the same name. A launcher without the tag predates it: ours.
            if found.env.get(RUN_PLANE, self.plane) != self.plane:
                continue
            task_dir = Path(found.exit_file).parent
            # The launcher writes its exit file here when the task ends: the directory must exist again.
            task_dir.mkdir(parents=True, exist_ok=True)
            devices = found.env.get("CUDA_VISIBLE_DEVICES", "")
            proc = TaskProcess(
                task_id=task_id,
                pid=found.pid,
                started_at_s=boot_s + found.start_ticks / ticks_per_s,
                device_uuid=devices.split(",")[0] or None,
                task_dir=str(task_dir),
                max_runtime_s=None,
                stop_grace_s=10.0,
                proc_start_ticks=found.start_ticks,
                attempt=attempt,
            )
            self.tasks[proc.key] = proc
            adopted.append(proc)
        return adopted

    def set_limits(self, key: str, *, max_runtime_s: float | None, stop_grace_s: float) -> None:
        """The limits of a run adopted by `scan`, once the desired state names it."""
        proc = self.tasks.get(key)
        if proc is not None:
            proc.max_runtime_s, proc.stop_grace_s = max_runtime_s, stop_grace_s

    # ---- stop and watch ------------------------------------------------------------------------------
    def stop(self, key: str, reason: str, now_s: float) -> None:
        proc = self.tasks.get(key)
        if proc is None or proc.stop_requested_at_s is not None:
            return
        proc.stop_requested_at_s = now_s
        proc.stop_reason = reason
        self._signal(proc, signal.SIGTERM)

    def _signal(self, proc: TaskProcess, signum: int) -> None:
        if signum == signal.SIGKILL and proc.cgroup and self._kill_cgroup(proc):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)
        if signum == signal.SIGKILL and proc.container and proc.engine:
            # The container outlives its engine client: remove it through the engine (its launcher,
            # still alive, would do the same on its way out; a killed launcher cannot).
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    [*proc.engine, "rm", "-f", "-t", "0", proc.container],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=30,
                    check=False,
                )

    def _kill_cgroup(self, proc: TaskProcess) -> bool:
        """SIGKILL every process of the run's cgroup (its command, what it forked, a container's); False
        when the cgroup cannot be read (then the launcher's group is killed instead)."""
        try:
            Cgroup(proc.cgroup).signal_all(signal.SIGKILL)
        except (CgroupError, OSError):
            return False
        return True

    def _alive(self, proc: TaskProcess) -> bool:
        if proc.popen is not None:
            return proc.popen.poll() is None
        ticks = proc_start_ticks(proc.pid)
        if ticks != proc.proc_start_ticks:
            return False
        # An adopted launcher is not our child: a zombie left for init still has a /proc entry.
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def _finished(self, proc: TaskProcess) -> Finished:
        ended = self._how_it_ended(proc)
        return dataclasses.replace(ended, task_dir=proc.task_dir, log_cursor=tuple(proc.log_cursor))

    def _how_it_ended(self, proc: TaskProcess) -> Finished:
        exit_file = Path(proc.task_dir) / "exit.json"
        reason = proc.stop_reason
        try:
            data = json.loads(exit_file.read_text())
            return Finished(
                proc.task_id,
                proc.pid,
                data.get("exit_code"),
                data.get("signal"),
                reason,
                attempt=proc.attempt,
                launch_error=str(data.get("launch_error") or ""),
                killed_reason=str(data.get("killed_reason") or ""),
                fenced=bool(data.get("fenced")),
                ended_at_s=float(data["ended_at_s"]) if data.get("ended_at_s") else None,
            )
        except (OSError, ValueError):
            pass
        if proc.killed:
            return Finished(proc.task_id, proc.pid, None, int(signal.SIGKILL), reason, attempt=proc.attempt)
        if proc.popen is not None and proc.popen.returncode is not None and proc.popen.returncode < 0:
            return Finished(
                proc.task_id, proc.pid, None, -proc.popen.returncode, reason, attempt=proc.attempt
            )
        crash = _last_words(Path(proc.task_dir) / "launcher.log")
        if crash and not reason:
            # The launcher itself failed (it writes nothing there otherwise): the run cannot have
            # worked, and running it elsewhere would fail the same way.
            error = f"launcher: {crash}"
            return Finished(proc.task_id, proc.pid, None, None, "", attempt=proc.attempt, launch_error=error)
        return Finished(
            proc.task_id,
            proc.pid,
            None,
            None,
            reason or "exit status unknown",
            lost=True,
            attempt=proc.attempt,
        )

    def poll(self, now_s: float) -> list[Finished]:
        """Reap ended tasks, enforce max runtime and stop escalation."""
        done = []
        for key, proc in list(self.tasks.items()):
            if not self._alive(proc):
                done.append(self._finished(proc))
                del self.tasks[key]
                continue
            if proc.max_runtime_s is not None and now_s - proc.started_at_s > proc.max_runtime_s:
                self.stop(key, f"max_runtime_exceeded: ran {now_s - proc.started_at_s:.0f} s", now_s)
            if (
                proc.stop_requested_at_s is not None
                and not proc.killed
                and now_s - proc.stop_requested_at_s >= proc.stop_grace_s
            ):
                proc.killed = True
                proc.killed_at_s = now_s
                self._signal(proc, signal.SIGKILL)
            elif (
                proc.killed
                and proc.cgroup
                and proc.killed_at_s is not None
                and now_s - proc.killed_at_s >= max(proc.stop_grace_s, 5.0)
            ):
                # The launcher should have ended within a grace of its run's kill; it has not: the last
                # resort is the launcher's whole group.
                proc.cgroup = ""
                self._signal(proc, signal.SIGKILL)
        return done

    def read_output(self, proc: TaskProcess, *, max_bytes: int) -> capture.Batch:
        """The next captured lines of a live run; its cursor moves past them."""
        batch = capture.read(Path(proc.task_dir) / "output", proc.cursor, max_bytes=max_bytes)
        proc.log_cursor = list(dataclasses.astuple(batch.cursor))
        return batch

    def records(self) -> list[dict[str, Any]]:
        return [proc.record() for proc in self.tasks.values()]

    def pgid_of(self, pid: int) -> str | None:
        """The run key of the task whose process group holds `pid` (tasks never leave their session)."""
        try:
            pgid = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            return None
        for proc in self.tasks.values():
            if proc.pid == pgid:
                return proc.key
        return None


def remaining_output(ended: Finished, *, max_bytes: int) -> list[capture.Batch]:
    """Everything a finished run's capture holds past where the agent had read (bounded by the cap)."""
    segment, pos, line, byte = ended.log_cursor
    cursor = capture.Cursor(str(segment), int(pos), int(line), int(byte))
    batches: list[capture.Batch] = []
    while True:
        batch = capture.read(Path(ended.task_dir) / "output", cursor, max_bytes=max_bytes)
        if batch.cursor == cursor:
            return batches
        batches.append(batch)
        cursor = batch.cursor


def _last_words(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text.splitlines()[-1][:400] if text else ""


def visible_devices(devices: tuple[str, ...]) -> str:
    """CUDA_VISIBLE_DEVICES for a task given its GPU (or MIG) UUIDs: all of them, in the plane's order,
    so a multi-GPU task sees every GPU it was given and its device 0 is the first."""
    return ",".join(devices)
