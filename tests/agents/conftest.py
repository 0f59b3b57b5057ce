"""Fixtures for agent tests: a simulated host, the plane double, and the real agent as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.capture import stream_text
from agents.sim import shim
from agents.sim.tools import install_fake_tools
from tests.agents.plane_double import PlaneDouble

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-node-a"


@pytest.fixture(autouse=True)
def _no_shim_leak() -> Iterator[None]:
    """pynvml's library slot is process-global: reset it after every test."""
    yield
    shim.uninstall()


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = install_fake_tools(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the agent's runs may write to: they run as their tenant's uid with a /tmp of their
    own (docs/isolation.md), so pytest's tmp_path (under /tmp, private to root) is out of their reach."""
    path = Path(tempfile.mkdtemp(prefix="whalegen-runs-", dir="/var/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plane() -> Iterator[PlaneDouble]:
    double = PlaneDouble({TOKEN: "a"}, heartbeat_interval_s=0.5, poll_wait_s=1.0)
    double.start()
    yield double
    double.stop()


def _kill_leftovers(state_dir: Path) -> None:
    """End what the agent started and left running (tasks survive the agent by design)."""
    state = state_dir / "agent-state.json"
    if state.exists():
        for record in json.loads(state.read_text()).get("tasks", []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(record["pid"]), signal.SIGKILL)
    for pid_file in state_dir.glob("mps/*/pipe/nvidia-cuda-mps-control.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


class AgentProcess:
    """The real `whalegen agent` in a subprocess, on a simulated host described by a spec."""

    def __init__(self, tmp_path: Path, plane: PlaneDouble, fake_bin: Path, spec: dict[str, Any]) -> None:
        self.plane = plane
        self.state_dir = tmp_path / "state"
        self.spec_path = tmp_path / "spec.yaml"
        self.spec_path.write_text(yaml.safe_dump(spec))
        self.log_path = tmp_path / "agent.log"
        self.env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "whalegen",
                "agent",
                "--server",
                self.plane.url,
                "--token",
                TOKEN,
                "--backend",
                "sim",
                "--sim-spec",
                str(self.spec_path),
                "--state-dir",
                str(self.state_dir),
                "--node-name",
                "a",
                "--heartbeat-s",
                "0.5",
                "--poll-wait-s",
                "1",
                "--tick-s",
                "0.2",
                "--reconcile-s",
                "1",
                "--log-level",
                "DEBUG",
                *extra,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=log,
        )

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("agent did not stop on SIGTERM") from None

    def sim_command(self, **command: Any) -> None:
        inbox = self.state_dir / "sim" / "control"
        inbox.mkdir(parents=True, exist_ok=True)
        path = inbox / f"{time.monotonic_ns()}.json"
        path.with_suffix(".tmp").write_text(json.dumps(command))
        path.with_suffix(".tmp").replace(path)

    def calls(self) -> list[dict[str, Any]]:
        path = self.state_dir / "sim" / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def mutating_calls(self) -> list[str]:
        from agents.sim.core import MUTATING

        return [c["function"] for c in self.calls() if c["function"] in MUTATING and c["code"] == 0]

    def task_file(self, task_id: str, name: str) -> str:
        """A file of the run's task directory; `stdout.log`/`stderr.log` name that stream of the capture."""
        task_dir = self.state_dir / "tasks" / task_id
        if name in ("stdout.log", "stderr.log"):
            return stream_text(task_dir / "output", name.removesuffix(".log"))
        path = task_dir / name
        return path.read_text() if path.exists() else ""

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


@pytest.fixture
def agent_process(tmp_path: Path, plane: PlaneDouble, fake_bin: Path) -> Iterator[Any]:
    made: list[AgentProcess] = []

    def make(spec: dict[str, Any]) -> AgentProcess:
        agent = AgentProcess(tmp_path, plane, fake_bin, spec)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
        _kill_leftovers(agent.state_dir)
