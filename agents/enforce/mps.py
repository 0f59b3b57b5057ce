"""MPS enforcer: one control daemon per GPU (or MIG device), each with its own pipe and log dirs.

Facts it relies on (reference §6): defaults set on the control daemon apply to the *next* server it
spawns; a client's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` can only
lower what the server allows, and are fixed when the client connects. So the daemon carries the GPU's
default share and every task gets its own limits through its environment (tenants can only lower
them). Commands go through `nvidia-cuda-mps-control` on stdin, one process per command, as NVIDIA's
device plugin does; `get_default_active_thread_percentage` is the health probe.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from whalegen.protocol import MpsSpec

CONTROL_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"


class MpsError(RuntimeError):
    pass


@dataclass(frozen=True)
class MpsDirs:
    pipe: Path
    log: Path


def _mib(text: str) -> int | None:
    """'4096M' / '4G' / '4096 MB' → MiB; None when the limit is off or unreadable."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*([MG])", text.upper())
    if not match:
        return None
    value = float(match.group(1))
    return int(value * 1024) if match.group(2) == "G" else int(value)


class MpsManager:
    def __init__(self, root: Path, *, control_binary: str = CONTROL_BINARY, timeout_s: float = 10.0) -> None:
        self.root = root
        self.control_binary = control_binary
        self.timeout_s = timeout_s

    def dirs(self, device_uuid: str) -> MpsDirs:
        base = self.root / re.sub(r"[^A-Za-z0-9_.-]", "_", device_uuid)
        return MpsDirs(base / "pipe", base / "log")

    def _env(self, device_uuid: str) -> dict[str, str]:
        dirs = self.dirs(device_uuid)
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES=device_uuid,  # the daemon's device; clients then see it as ordinal 0
            CUDA_MPS_PIPE_DIRECTORY=str(dirs.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(dirs.log),
        )
        return env

    def control(self, device_uuid: str, command: str) -> str:
        try:
            result = subprocess.run(
                [self.control_binary],
                input=command + "\n",
                capture_output=True,
                text=True,
                env=self._env(device_uuid),
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise MpsError(f"{command!r} on {device_uuid}: {error}") from None
        if result.returncode != 0:
            raise MpsError(f"{command!r} on {device_uuid}: {(result.stdout + result.stderr).strip()}")
        return result.stdout.strip()

    def daemon_pid(self, device_uuid: str) -> int | None:
        try:
            pid = int((self.dirs(device_uuid).pipe / PID_FILE).read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def healthy(self, device_uuid: str) -> bool:
        if self.daemon_pid(device_uuid) is None:
            return False
        try:
            return (
                self.control(device_uuid, "get_default_active_thread_percentage")
                .replace(".", "", 1)
                .isdigit()
            )
        except MpsError:
            return False

    def ensure(self, device_uuid: str, spec: MpsSpec) -> list[str]:
        """Daemon up, healthy, with the wanted defaults. Returns the actions taken (none when in shape)."""
        actions: list[str] = []
        # 1. Running and answering? Else (re)start it.
        if not self.healthy(device_uuid):
            if self.daemon_pid(device_uuid) is not None:
                self.shutdown(device_uuid)
                actions.append("restart unhealthy daemon")
            dirs = self.dirs(device_uuid)
            dirs.pipe.mkdir(parents=True, exist_ok=True)
            dirs.log.mkdir(parents=True, exist_ok=True)
            try:
                started = subprocess.run(
                    [self.control_binary, "-d"],
                    env=self._env(device_uuid),
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                raise MpsError(f"starting the MPS daemon for {device_uuid}: {error}") from None
            if started.returncode != 0:
                raise MpsError(f"starting the MPS daemon for {device_uuid}: {started.stderr.strip()}")
            actions.append("start daemon")
        # 2. Defaults: read first, set only what differs (a set applies to the next server only).
        current_pct = self.control(device_uuid, "get_default_active_thread_percentage")
        if _number(current_pct) != spec.default_thread_pct:
            self.control(device_uuid, f"set_default_active_thread_percentage {spec.default_thread_pct}")
            actions.append(f"default thread % {spec.default_thread_pct}")
        if spec.default_pinned_mem_mib is not None:
            current_mem = self.control(device_uuid, "get_default_device_pinned_mem_limit 0")
            if _mib(current_mem) != spec.default_pinned_mem_mib:
                self.control(
                    device_uuid, f"set_default_device_pinned_mem_limit 0 {spec.default_pinned_mem_mib}M"
                )
                actions.append(f"default pinned memory {spec.default_pinned_mem_mib} MiB")
        return actions

    def client_env(
        self, device_uuid: str, thread_pct: int | None, pinned_mem_mib: int | None
    ) -> dict[str, str]:
        """Environment for one MPS client. No CUDA_VISIBLE_DEVICES: the server remaps devices (§6.1)."""
        dirs = self.dirs(device_uuid)
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}
        if thread_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(thread_pct)
        if pinned_mem_mib is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={pinned_mem_mib}M"
        return env

    def shutdown(self, device_uuid: str) -> bool:
        """`quit`, then wait for the daemon to go. True when it is gone."""
        pid = self.daemon_pid(device_uuid)
        if pid is None:
            return True
        with contextlib.suppress(MpsError):
            self.control(device_uuid, "quit")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.daemon_pid(device_uuid) is None:
                return True
            time.sleep(0.05)
        return False

    def running_devices(self) -> list[str]:
        if not self.root.is_dir():
            return []
        found = []
        for base in sorted(self.root.iterdir()):
            pid_file = base / "pipe" / PID_FILE
            if pid_file.exists():
                found.append(base.name)
        return [name for name in found if self.daemon_pid(name) is not None]


def _number(text: str) -> int | None:
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None
