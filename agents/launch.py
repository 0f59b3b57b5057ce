"""Tiny parent for one task: runs the command, captures its output, and records how it ended in a file.

`python -m agents.launch EXIT_FILE [--output DIR] [--cap-bytes N] [--cwd DIR] -- COMMAND…`. The agent
starts this in a new session, so the whole task is one process group it can signal. The launcher outlives the
agent, which lets a restarted agent learn the exit code of a task it did not start (it is no longer
that process's parent), and keeps capturing output while no agent runs.
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
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import sys
import time

if __package__ in (None, ""):
    # Run as a script (`python -S -E agents/launch.py`): the script's directory, first on the path,
    # would shadow the standard library with `agents/inspect.py`; the checkout root finds `agents`.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from agents.capture import CaptureWriter

PARTIAL_AFTER_S = 1.0
PARTIAL_MAX_BYTES = 8192
# Small reads, one per ready pipe per round: stdout and stderr interleave to within a read of the truth.
READ_BYTES = 4096
DRAIN_AFTER_EXIT_S = 2.0  # a daemonised grandchild may hold the pipes open: stop reading after this


# What `_parse` returns: exit file, output directory, cap in bytes, working directory, command. (A plain
# tuple: the launcher starts with every task and imports as little as it can; `dataclasses` would pull in
# `inspect`, which the script's own directory shadows before the path fix below.)
Launch = tuple[str, "str | None", int, "str | None", list[str]]


def _parse(argv: list[str]) -> Launch | str:
    if not argv or "--" not in argv:
        return (
            "usage: python -m agents.launch EXIT_FILE [--output DIR] [--cap-bytes N] [--cwd DIR] -- COMMAND…"
        )
    split = argv.index("--")
    head, command = argv[:split], argv[split + 1 :]
    exit_file, options = head[0], head[1:]
    output: str | None = None
    cwd: str | None = None
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
        else:
            return f"unknown launch option {name} {value[0]}"
    return exit_file, output, cap_bytes, cwd, command


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


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if isinstance(parsed, str):
        print(parsed, file=sys.stderr)
        return 2
    exit_file, output, cap_bytes, cwd, command = parsed
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    capture = CaptureWriter(output, cap_bytes=cap_bytes) if output else None
    if not command:
        message = "the task has no command to run"
        if capture is not None:
            capture.line("launcher", message.encode(), time.time())
            capture.close()
        _write_exit(exit_file, {"exit_code": 127, "signal": None, "launch_error": message})
        return 127
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
        if cwd is not None:
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
    status = _capture_until_exit(pid, capture, {read_end: name for name, (read_end, _) in pipes.items()})
    failure = os.read(err_r, 65536)
    os.close(err_r)
    code = os.waitstatus_to_exitcode(status)
    record: dict[str, object] = (
        {"exit_code": code, "signal": None} if code >= 0 else {"exit_code": None, "signal": -code}
    )
    if failure:
        code, message = json.loads(failure)
        record = {"exit_code": code, "signal": None, "launch_error": message}
    if capture is not None:
        if failure:
            capture.line("launcher", str(record["launch_error"]).encode(), time.time())
        elif code < 0:
            capture.line("launcher", f"killed by signal {-code}".encode(), time.time())
        elif code > 0:
            capture.line("launcher", f"exited with code {code}".encode(), time.time())
        capture.close()
    _write_exit(exit_file, record)
    return code if code >= 0 else 128 - code


def _capture_until_exit(pid: int, capture: CaptureWriter | None, fds: dict[int, str]) -> int:
    """Read both pipes into the capture until the child has exited and the pipes are drained (or held
    open by something else for DRAIN_AFTER_EXIT_S); returns the child's wait status."""
    partial: dict[int, bytes] = dict.fromkeys(fds, b"")
    last_data_s: dict[int, float] = dict.fromkeys(fds, time.monotonic())
    status: int | None = None
    exited_at = 0.0
    while fds:
        ready, _, _ = select.select(list(fds), [], [], 0.25)
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
    if status is None:
        _, status = os.waitpid(pid, 0)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
