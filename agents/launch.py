"""Tiny parent for one task: runs the command, captures its output, and records how it ended in a file.

`python -m agents.launch EXIT_FILE [--output DIR] [--cap-bytes N] [--cwd DIR] [--plan FILE] -- COMMAND…`.
The agent starts this in a new session, so the whole task is one process group it can signal. The
launcher outlives the agent, which lets a restarted agent learn the exit code of a task it did not start
(it is no longer that process's parent), and keeps capturing output while no agent runs.
It ignores SIGTERM/SIGINT itself (handlers, reset on exec, so the command keeps default dispositions)
and survives to record the command's fate; SIGKILL ends it too and then no file is written.

Output. stdout and stderr are two pipes to the launcher, which reads both as they come and appends one
record per line to the capture under `--output` (see `agents.capture` for the format): stdout and
stderr interleaved in the order the launcher read them, each line stamped and tagged. Pipes to the
launcher, not to the agent: the agent may restart while the task runs; the launcher does not.
A line without its newline is recorded as partial after a quiet second (progress bars, prompts) or
at 8 KiB.

Launch failures (no command, not found, permission denied, a working directory `--cwd` that cannot be
entered) are the launcher's own lines in the capture and `launch_error` in EXIT_FILE, with the shell's
codes (127 not found, 126 cannot execute; a bad working directory is 126 too: the command was never
looked for), so the agent reports the run `failed` with that message instead of losing it.

Sandbox (`--plan FILE`: the agent's `agents.isolation.plan.SandboxPlan` as JSON; without it the launcher
does none of this). Before the fork the launcher makes the run's cgroup with its limits
(`agents.isolation.cgroups`); a cgroup it cannot make or limit is a launch error (126). Process runtime:
the child enters the sandbox before exec (`agents.isolation.sandbox`: cgroup, private /tmp, masked
devices, the tenant's uid, no new privileges); a step that fails is a launch error (126) naming it.
Container runtime: the command is the engine's `run` argv with our cgroup as its parent; the launcher
runs it as is, and when it ends removes the container (`<engine> rm -f -t 0 <name>`): none outlives its
launcher. When the command ends, everything left in the cgroup is killed (a run leaves nothing behind)
and the cgroup removed. The fence: with a `lease_file`, the launcher reads it about once a second and
stops the run itself once the wall clock is past it (SIGTERM, or `<engine> stop`, then SIGKILL or
`rm -f` after `stop_grace_s`).

EXIT_FILE: `exit_code` (null when killed by a signal), `signal`, `launch_error` (only when the command
never ran), `killed_reason` (a sentence, "" when none: a memory kill, the fence), `oom_killed` (the
command died of a SIGKILL the launcher did not send while its cgroup reports the memory limit hit),
`fenced` (the launcher stopped the run because its lease ran out). The sentence is also the launcher's
last line in the capture.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable

if __package__ in (None, ""):
    # Run as a script (`python -S -E agents/launch.py`): the script's directory, first on the path,
    # would shadow the standard library with `agents/inspect.py`; the checkout root finds `agents`.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from agents.capture import CaptureWriter
from agents.isolation.cgroups import Cgroup, CgroupError

PARTIAL_AFTER_S = 1.0
PARTIAL_MAX_BYTES = 8192
# Small reads, one per ready pipe per round: stdout and stderr interleave to within a read of the truth.
READ_BYTES = 4096
DRAIN_AFTER_EXIT_S = 2.0
READ_WAIT_S = 0.25  # a daemonised grandchild may hold the pipes open: stop reading after this


LEASE_READ_EVERY_S = 1.0
ENGINE_TIMEOUT_S = 30.0  # an engine command (`rm -f`, `stop`) that hangs longer is killed: the run must end


# What `_parse` returns: exit file, output directory, cap in bytes, working directory, plan file, command.
# (A plain tuple: the launcher starts with every task and imports as little as it can; `dataclasses` would
# pull in `inspect`, which the script's own directory shadows before the path fix below.)
Launch = tuple[str, "str | None", int, "str | None", "str | None", list[str]]
USAGE = (
    "usage: python -m agents.launch EXIT_FILE [--output DIR] [--cap-bytes N] [--cwd DIR] [--plan FILE]"
    " -- COMMAND…"
)


def _parse(argv: list[str]) -> Launch | str:
    if not argv or "--" not in argv:
        return USAGE
    split = argv.index("--")
    head, command = argv[:split], argv[split + 1 :]
    exit_file, options = head[0], head[1:]
    output: str | None = None
    cwd: str | None = None
    plan: str | None = None
    cap_bytes = 10 << 20
    while options:
        name, value, options = options[0], options[1:2], options[2:]
        if not value:
            return f"launch option {name} needs a value"
        if name == "--output":
            output = value[0]
        elif name == "--cap-bytes" and value[0].isdigit():
            cap_bytes = int(value[0])
        elif name == "--cwd":
            cwd = value[0]
        elif name == "--plan":
            plan = value[0]
        else:
            return f"unknown launch option {name} {value[0]}"
    return exit_file, output, cap_bytes, cwd, plan, command


def _write_exit(exit_file: str, record: dict[str, object]) -> None:
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as out:
        json.dump(record, out)
    os.replace(tmp, exit_file)


def _exec_error(command: list[str], error: OSError) -> tuple[int, str]:
    """The shell's convention: 127 when the program is not there, 126 when it cannot be executed."""
    code = 127 if error.errno in (errno.ENOENT, errno.ENOTDIR) else 126
    why = error.strerror or str(error)
    return code, f"cannot run {command[0]!r}: {why} (errno {error.errno})"


def _child_failed(err_w: int, code: int, message: str) -> None:
    """In the forked child: tell the launcher why the command never started, and end."""
    os.write(err_w, json.dumps([code, message]).encode())
    os._exit(code)


def _cwd_error(cwd: str, error: OSError) -> tuple[int, str]:
    why = error.strerror or str(error)
    return 126, f"cannot change to working directory {cwd!r}: {why} (errno {error.errno})"


def _launch_failed(capture: CaptureWriter | None, exit_file: str, code: int, message: str) -> int:
    """The command never started: say why in the capture and the exit file."""
    if capture is not None:
        capture.line("launcher", message.encode(), time.time())
        capture.close()
    _write_exit(exit_file, _record(code, None, launch_error=message))
    return code


def _record(code: int | None, signum: int | None, **more: object) -> dict[str, object]:
    return {
        "exit_code": code,
        "signal": signum,
        "killed_reason": "",
        "oom_killed": False,
        "fenced": False,
        **more,
    }


def _read_plan(plan_file: str) -> dict[str, object]:
    with open(plan_file) as source:
        plan = json.load(source)
    if not isinstance(plan, dict):
        raise ValueError("not a JSON object")
    return plan


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if isinstance(parsed, str):
        print(parsed, file=sys.stderr)
        return 2
    exit_file, output, cap_bytes, cwd, plan_file, command = parsed
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    capture = CaptureWriter(output, cap_bytes=cap_bytes) if output else None
    if not command:
        return _launch_failed(capture, exit_file, 127, "the task has no command to run")
    plan: dict[str, object] | None = None
    cgroup: Cgroup | None = None
    if plan_file is not None:
        try:
            plan = _read_plan(plan_file)
        except (OSError, ValueError) as error:
            return _launch_failed(
                capture, exit_file, 126, f"cannot read the sandbox plan {plan_file!r}: {error}"
            )
        try:
            cgroup = _make_cgroup(plan)
        except CgroupError as error:
            return _launch_failed(capture, exit_file, 126, f"cannot make the run's cgroup: {error}")
    watch = _Watch(plan or {}, cgroup)
    pipes = {"stdout": os.pipe(), "stderr": os.pipe()} if capture is not None else {}
    # The child tells a failed exec through this close-on-exec pipe: it closes unread on success.
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        for fd, (read_end, write_end) in zip((1, 2), pipes.values(), strict=False):
            os.dup2(write_end, fd)
            os.close(read_end)
            os.close(write_end)
        if plan is not None and watch.runtime == "process":
            _enter_sandbox(err_w, plan, cgroup, cwd, os.path.dirname(os.path.abspath(exit_file)))
        elif cwd is not None:
            try:
                os.chdir(cwd)
            except OSError as error:
                _child_failed(err_w, *_cwd_error(cwd, error))
        try:
            os.execvp(command[0], command)
        except OSError as error:
            _child_failed(err_w, *_exec_error(command, error))
    os.close(err_w)
    for _, write_end in pipes.values():
        os.close(write_end)
    watch.pid = pid
    fds = {read_end: name for name, (read_end, _) in pipes.items()}
    status = _capture_until_exit(pid, capture, fds, watch.tick)
    # When the run ended, on this host's clock: an agent away at the time reports this, not the moment
    # it came back, so the plane can tell a result that came before its requeue (docs/faults.md).
    ended_at_s = time.time()
    failure = os.read(err_r, 65536)
    os.close(err_r)
    watch.ended()
    code = os.waitstatus_to_exitcode(status)
    record = _record(code, None) if code >= 0 else _record(None, -code)
    if failure:
        code, message = json.loads(failure)
        record = _record(code, None, launch_error=message)
    else:
        record.update(watch.verdict(code))
    record["ended_at_s"] = ended_at_s
    watch.clean_up()
    if capture is not None:
        if failure:
            capture.line("launcher", str(record["launch_error"]).encode(), time.time())
        elif code < 0:
            capture.line("launcher", f"killed by signal {-code}".encode(), time.time())
        elif code > 0:
            capture.line("launcher", f"exited with code {code}".encode(), time.time())
        if record["killed_reason"]:
            capture.line("launcher", str(record["killed_reason"]).encode(), time.time())
        capture.close()
    _write_exit(exit_file, record)
    return code if code >= 0 else 128 - code


def _make_cgroup(plan: dict[str, object]) -> Cgroup | None:
    relative = str(plan.get("cgroup") or "")
    if not relative:
        return None
    cgroup = Cgroup(relative)
    try:
        cgroup.create(
            cpu_milli=_int_or_none(plan.get("cpu_milli")),
            host_mem_mib=_int_or_none(plan.get("host_mem_mib")),
            pids_max=_int_or_none(plan.get("pids_max")),
        )
    except CgroupError:
        cgroup.remove(timeout_s=0)
        raise
    return cgroup


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(str(value))


def _enter_sandbox(
    err_w: int, plan: dict[str, object], cgroup: Cgroup | None, cwd: str | None, sandbox_dir: str
) -> None:
    """In the forked child: the process runtime's sandbox; a step that fails ends the child with 126."""
    from agents.isolation.sandbox import SandboxError, enter

    try:
        enter(plan, cgroup, cwd=cwd, sandbox_dir=sandbox_dir)
    except SandboxError as error:
        _child_failed(err_w, 126, str(error))
    except OSError as error:  # only the chdir raises a bare OSError
        _child_failed(err_w, *_cwd_error(str(cwd), error))


class _Watch:
    """What the launcher does around the running command when there is a plan: the fence (the lease),
    the container's removal, emptying the cgroup, and how the run ended in words."""

    def __init__(self, plan: dict[str, object], cgroup: Cgroup | None) -> None:
        self.pid = 0
        self.runtime = str(plan.get("runtime") or "process")
        self.cgroup = cgroup
        self.host_mem_mib = plan.get("host_mem_mib")
        self.container = str(plan.get("container") or "")
        engine = plan.get("engine")
        self.engine = [str(part) for part in engine] if isinstance(engine, list) else []
        self.lease_file = str(plan.get("lease_file") or "")
        grace = plan.get("stop_grace_s")
        self.stop_grace_s = 10.0 if grace is None else float(str(grace))
        self.lease_until: float | None = None  # the last value read; None: never read (no fence yet)
        self.next_read_s = 0.0
        self.fenced_at_s: float | None = None  # monotonic: when the launcher began to stop the run
        self.fenced_lease = 0.0
        self.sent_kill = False  # the launcher itself sent SIGKILL (so a SIGKILL death is not memory's)
        self.helpers: list[int] = []  # engine commands still running
        self.done = False

    # ---- while the command runs --------------------------------------------------------------------
    def tick(self, exited: bool) -> None:
        self.helpers = [pid for pid in self.helpers if not _reaped(pid)]
        if exited:
            self.ended()
            return
        now_m = time.monotonic()
        if self.fenced_at_s is None:
            if self.lease_file and now_m >= self.next_read_s:
                self.next_read_s = now_m + LEASE_READ_EVERY_S
                self._read_lease()
                if self.lease_until is not None and time.time() > self.lease_until:
                    self._fence(now_m)
        elif not self.sent_kill and now_m - self.fenced_at_s >= self.stop_grace_s:
            self._kill()

    def _read_lease(self) -> None:
        try:
            with open(self.lease_file) as source:
                self.lease_until = float(source.read().strip())
        except (OSError, ValueError):
            pass  # written atomically by the agent: missing or unreadable keeps the last value read

    def _fence(self, now_m: float) -> None:
        self.fenced_at_s, self.fenced_lease = now_m, float(self.lease_until or 0.0)
        if self.runtime == "container" and self.engine and self.container:
            grace = str(max(int(self.stop_grace_s), 0))
            self.helpers.append(_spawn([*self.engine, "stop", "-t", grace, self.container]))
        else:
            self._signal_run(signal.SIGTERM)

    def _kill(self) -> None:
        self.sent_kill = True
        if self.runtime == "container" and self.engine and self.container:
            self.helpers.append(_spawn([*self.engine, "rm", "-f", "-t", "0", self.container]))
        self._signal_run(signal.SIGKILL)

    def _signal_run(self, signum: int) -> None:
        """Every process of the run: its cgroup, or without one the launcher's process group but itself."""
        if self.cgroup is not None:
            self.cgroup.signal_all(signum)
            if self.runtime == "process":
                return
        for pid in [self.pid] if self.runtime == "container" else _group_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    # ---- after it ended ----------------------------------------------------------------------------
    def ended(self) -> None:
        """The command has ended: remove its container and kill what is left in its cgroup (once, as soon
        as the exit is seen, so a daemonised leftover does not hold the output pipes open)."""
        if self.done:
            return
        self.done = True
        if self.runtime == "container" and self.engine and self.container:
            _run([*self.engine, "rm", "-f", "-t", "0", self.container], ENGINE_TIMEOUT_S)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def verdict(self, code: int) -> dict[str, object]:
        """`oom_killed`, `fenced` and `killed_reason` for the exit file, from how the command ended."""
        if self.fenced_at_s is not None:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.fenced_lease))
            reason = (
                f"stopped on its node: the agent's lease ran out at {at}"
                " (no heartbeat acknowledged by the plane since)"
            )
            return {"fenced": True, "killed_reason": reason}
        # A container's engine client reports the container's SIGKILL as exit code 137.
        sigkilled = code == -signal.SIGKILL or (self.runtime == "container" and code == 128 + signal.SIGKILL)
        if sigkilled and not self.sent_kill and self.cgroup is not None and self.cgroup.memory_killed():
            limit = f"its {self.host_mem_mib} MiB limit" if self.host_mem_mib is not None else "its limit"
            return {"oom_killed": True, "killed_reason": f"killed: host memory above {limit}"}
        return {}

    def clean_up(self) -> None:
        for pid in self.helpers:
            _wait(pid, ENGINE_TIMEOUT_S)
        if self.cgroup is not None:
            self.cgroup.kill_all()
            self.cgroup.remove()


def _group_pids() -> list[int]:
    """The launcher's process group (the task's processes when there is no cgroup), less the launcher."""
    group, own = os.getpgrp(), os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != own:
            try:
                if os.getpgid(int(entry)) == group:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _spawn(argv: list[str]) -> int:
    """Start an engine command with no input or output; 0 when it cannot start."""
    quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    try:
        return os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=quiet)
    except OSError:
        return 0


def _reaped(pid: int) -> bool:
    if pid == 0:
        return True
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _wait(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not _reaped(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.05)


def _run(argv: list[str], timeout_s: float) -> None:
    """An engine command to its end, killed after `timeout_s`; its failure is ignored (best effort)."""
    _wait(_spawn(argv), timeout_s)


def _capture_until_exit(
    pid: int, capture: CaptureWriter | None, fds: dict[int, str], tick: Callable[[bool], None]
) -> int:
    """Read both pipes into the capture until the child has exited and the pipes are drained (or held
    open by something else for DRAIN_AFTER_EXIT_S); returns the child's wait status. `tick(exited)` runs
    every round (at least every READ_WAIT_S)."""
    partial: dict[int, bytes] = dict.fromkeys(fds, b"")
    last_data_s: dict[int, float] = dict.fromkeys(fds, time.monotonic())
    status: int | None = None
    exited_at = 0.0
    while fds:
        ready, _, _ = select.select(list(fds), [], [], READ_WAIT_S)
        now_s = time.time()
        for fd in ready:
            data = os.read(fd, READ_BYTES)
            stream = fds[fd]
            assert capture is not None
            if not data:
                if partial[fd]:
                    capture.line(stream, partial[fd], now_s, partial=True)
                del fds[fd], partial[fd]
                os.close(fd)
                continue
            *lines, rest = (partial[fd] + data).split(b"\n")
            for line in lines:
                capture.line(stream, line, now_s)
            partial[fd] = rest
            last_data_s[fd] = time.monotonic()
        for fd, rest in partial.items():
            quiet = time.monotonic() - last_data_s[fd] >= PARTIAL_AFTER_S
            if rest and (quiet or len(rest) >= PARTIAL_MAX_BYTES):
                assert capture is not None
                capture.line(fds[fd], rest, now_s, partial=True)
                partial[fd] = b""
        if capture is not None:
            capture.flush()
        if status is None:
            done, status_now = os.waitpid(pid, os.WNOHANG)
            if done:
                status, exited_at = status_now, time.monotonic()
        elif time.monotonic() - exited_at > DRAIN_AFTER_EXIT_S:
            break
        tick(status is not None)
    while status is None:
        # No pipes (no capture), or both closed while the command runs: keep the fence going.
        done, status_now = os.waitpid(pid, os.WNOHANG)
        if done:
            status = status_now
        else:
            tick(False)
            time.sleep(READ_WAIT_S)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
