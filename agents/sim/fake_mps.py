"""A stand-in for `nvidia-cuda-mps-control` that keeps state like the real one (reference §6.2, §9.2).

Run as the control binary (tests put a `nvidia-cuda-mps-control` wrapper first on PATH):
- `-d` starts a background daemon for `$CUDA_MPS_PIPE_DIRECTORY`; it writes
  `nvidia-cuda-mps-control.pid` there and keeps its state in `fake-mps-state.json`.
- Without arguments it reads classic commands on stdin and answers them; every command is appended
  to `$CUDA_MPS_LOG_DIRECTORY/control.log`, as the real daemon logs them.
- Defaults are copied into a server when the first client of a UID connects; `set_*` on an unknown
  server PID prints an error and exits non-zero; `quit` stops the daemon and removes its state.

`connect_client()` is what a (fake) CUDA program does when it starts under MPS: it resolves the
effective limits with the real precedence, min(server value, client environment).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PID_FILE = "nvidia-cuda-mps-control.pid"
STATE_FILE = "fake-mps-state.json"
FIRST_SERVER_PID = 900_000  # synthetic server PIDs: the fake spawns no server processes


class MpsUnavailable(ConnectionError):
    pass


def _pipe_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    return Path(env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    return Path(env.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def daemon_alive(pipe: Path) -> int | None:
    try:
        pid = int((pipe / PID_FILE).read_text())
        os.kill(pid, 0)
    except PermissionError:
        return pid  # alive, and another user's: clients run as their tenants' uids, the daemon as root
    except (OSError, ValueError):
        return None
    return pid


def _shared(path: Path, mode: int) -> None:
    """The real daemon's pipes are open to every user of the host (clients run as their tenants' uids);
    the stand-in's state files are too. Unlike the real one, it trusts its clients with them."""
    with contextlib.suppress(OSError):
        path.chmod(mode)


@contextmanager
def _state(pipe: Path) -> Iterator[dict[str, Any]]:
    with (pipe / "fake-mps.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = pipe / STATE_FILE
        state = json.loads(path.read_text())
        yield state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        _shared(tmp, 0o666)
        tmp.replace(path)


def _parse_limit_mib(text: str) -> int | None:
    text = text.strip().upper().removesuffix("B")
    if not text or text == "0":
        return None
    unit = text[-1]
    number = float(text[:-1]) if unit in "MGK" else float(text) / (1 << 20)
    return int(number * 1024) if unit == "G" else int(number / 1024) if unit == "K" else int(number)


def _client_pinned_limit(env: dict[str, str], device_uuid: str) -> int | None:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G,1=512MB": keys are ordinals or UUIDs."""
    for part in env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            if key.strip() in {"0", device_uuid}:
                return _parse_limit_mib(value)
    return None


def connect_client(env: dict[str, str], pid: int, uid: int) -> dict[str, Any]:
    """Attach a client to the MPS server of its UID (spawning it with the daemon's defaults)."""
    pipe = _pipe_dir(env)
    if daemon_alive(pipe) is None:
        raise MpsUnavailable(f"no MPS control daemon at {pipe}")
    with _state(pipe) as state:
        server = next((s for s in state["servers"].values() if s["uid"] == uid), None)
        if server is None:
            server_pid = state["next_server_pid"]
            state["next_server_pid"] += 1
            server = {
                "pid": server_pid,
                "uid": uid,
                "thread_pct": state["default_thread_pct"],
                "pinned_mib": dict(state["default_pinned_mib"]),
                "clients": {},
            }
            state["servers"][str(server_pid)] = server
        env_pct = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        thread_pct = server["thread_pct"] if env_pct is None else min(server["thread_pct"], float(env_pct))
        server_mem = server["pinned_mib"].get("0")
        client_mem = _client_pinned_limit(env, state["device_uuid"])
        limits = [m for m in (server_mem, client_mem) if m is not None]
        effective = {
            "server_pid": server["pid"],
            "device_uuid": state["device_uuid"],
            "thread_pct": thread_pct,
            "pinned_mib": min(limits) if limits else None,
        }
        server["clients"][str(pid)] = effective  # fixed at connect time, like the real client context
    return effective


def disconnect_client(env: dict[str, str], pid: int) -> None:
    pipe = _pipe_dir(env)
    if daemon_alive(pipe) is None:
        return
    with _state(pipe) as state:
        for server in state["servers"].values():
            server["clients"].pop(str(pid), None)


def _answer(state: dict[str, Any], words: list[str]) -> tuple[str, bool]:
    """One classic command → (output, ok)."""
    servers = state["servers"]
    verb, args = words[0], words[1:]

    def server(pid_text: str) -> dict[str, Any] | None:
        found = servers.get(pid_text)
        return found if isinstance(found, dict) else None

    if verb == "get_server_list":
        return "\n".join(sorted(servers)), True
    if verb == "get_default_active_thread_percentage":
        return f"{state['default_thread_pct']:.1f}", True
    if verb == "set_default_active_thread_percentage" and args:
        state["default_thread_pct"] = float(args[0])
        return f"{float(args[0]):.1f}", True
    if verb == "get_default_device_pinned_mem_limit" and args:
        limit = state["default_pinned_mib"].get(args[0])
        return (f"{limit}M" if limit is not None else "0"), True
    if verb == "set_default_device_pinned_mem_limit" and len(args) == 2:
        state["default_pinned_mib"][args[0]] = _parse_limit_mib(args[1])
        return "", True
    if verb in {
        "set_active_thread_percentage",
        "get_active_thread_percentage",
        "get_client_list",
        "set_device_pinned_mem_limit",
        "get_device_pinned_mem_limit",
        "shutdown_server",
        "get_server_status",
    }:
        target = server(args[0]) if args else None
        if target is None:
            return f"Server {args[0] if args else '?'} not found", False
        if verb == "set_active_thread_percentage" and len(args) == 2:
            target["thread_pct"] = float(args[1])  # later clients only; connected ones keep theirs
            return f"{float(args[1]):.1f}", True
        if verb == "get_active_thread_percentage":
            return f"{target['thread_pct']:.1f}", True
        if verb == "set_device_pinned_mem_limit" and len(args) == 3:
            target["pinned_mib"][args[1]] = _parse_limit_mib(args[2])
            return "", True
        if verb == "get_device_pinned_mem_limit" and len(args) == 2:
            limit = target["pinned_mib"].get(args[1])
            return (f"{limit}M" if limit is not None else "0"), True
        if verb == "get_client_list":
            return "\n".join(sorted(target["clients"])), True
        if verb == "get_server_status":
            return "ACTIVE", True
        if verb == "shutdown_server":
            del servers[args[0]]
            return "", True
    if verb == "start_server" and args[:1] == ["-uid"] and len(args) == 2:
        pid = state["next_server_pid"]
        state["next_server_pid"] += 1
        servers[str(pid)] = {
            "pid": pid,
            "uid": int(args[1]),
            "thread_pct": state["default_thread_pct"],
            "pinned_mib": dict(state["default_pinned_mib"]),
            "clients": {},
        }
        return str(pid), True
    return f"Unrecognized command: {' '.join(words)}", False


def _serve(pipe: Path) -> int:
    """The daemon: hold the pid file until `quit` (SIGTERM) arrives."""
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    (pipe / PID_FILE).write_text(str(os.getpid()))
    while not stop:
        time.sleep(0.2)
    (pipe / PID_FILE).unlink(missing_ok=True)
    (pipe / STATE_FILE).unlink(missing_ok=True)
    return 0


def _log(log_dir: Path, line: str) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "control.log").open("a") as out:
        out.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")


def main(argv: list[str]) -> int:
    env = os.environ
    pipe, log_dir = _pipe_dir(env), _log_dir(env)
    if argv[:1] == ["--serve"]:
        return _serve(Path(argv[1]))
    if argv[:1] == ["-d"]:
        if daemon_alive(pipe) is not None:
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        pipe.mkdir(parents=True, exist_ok=True)
        _shared(pipe, 0o777)  # not sticky: a client replaces the state file another wrote
        (pipe / "fake-mps.lock").touch()
        _shared(pipe / "fake-mps.lock", 0o666)
        (pipe / STATE_FILE).write_text(
            json.dumps(
                {
                    "device_uuid": env.get("CUDA_VISIBLE_DEVICES", ""),
                    "default_thread_pct": 100.0,
                    "default_pinned_mib": {},
                    "servers": {},
                    "next_server_pid": FIRST_SERVER_PID,
                }
            )
        )
        _shared(pipe / STATE_FILE, 0o666)
        subprocess.Popen(
            [sys.executable, "-S", "-E", __file__, "--serve", str(pipe)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 5
        while daemon_alive(pipe) is None:
            if time.monotonic() > deadline:
                print("MPS daemon did not start", file=sys.stderr)
                return 1
            time.sleep(0.02)
        _log(log_dir, "Starting control daemon")
        return 0
    daemon = daemon_alive(pipe)
    if daemon is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    ok = True
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        _log(log_dir, f"Command: {' '.join(words)}")
        if words[0] == "quit":
            os.kill(daemon, signal.SIGTERM)
            continue
        with _state(pipe) as state:
            output, good = _answer(state, words)
        if output:
            print(output)
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
