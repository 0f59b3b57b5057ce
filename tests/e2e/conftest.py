"""End-to-end fixtures: the real plane (Django, on pytest-django's live server over the test PostgreSQL
database) and real `whalegen agent` processes on simulated NVML, talking the protocol over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.sim.tools import install_fake_tools
from tests.apps.fleet.conftest import fleet  # noqa: F401  (the world with node credentials)

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition") -> Any:
    """Poll `predicate` (a database read) until it is truthy; fail with `what` after `timeout_s`."""
    from django.db import close_old_connections

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        close_old_connections()
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class AgentProcess:
    """`whalegen agent --backend sim` for one node of the plane, as a subprocess."""

    def __init__(
        self, work: Path, *, server: str, token: str, node_name: str, gpus: list[dict[str, Any]]
    ) -> None:
        self.work = work
        self.server = server
        self.token = token
        self.node_name = node_name
        self.state_dir = work / "state"
        work.mkdir(parents=True, exist_ok=True)
        self.spec_path = work / "spec.yaml"
        self.spec_path.write_text(yaml.safe_dump({"nodes": [{"name": node_name, "gpus": gpus}]}))
        bin_dir = install_fake_tools(work / "bin")
        self.log_path = work / "agent.log"
        self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "whalegen", "agent",
                    "--server", self.server, "--token", self.token,
                    "--backend", "sim", "--sim-spec", str(self.spec_path),
                    "--state-dir", str(self.state_dir), "--node-name", self.node_name,
                    "--heartbeat-s", "0.5", "--poll-wait-s", "1", "--tick-s", "0.2", "--reconcile-s", "1",
                ],
                cwd=ROOT, env=self.env, stdout=log, stderr=log,
            )  # fmt: skip

    def stop(self) -> None:
        """SIGTERM: the agent leaves its tasks running for the next agent."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)

    def kill(self) -> None:
        """SIGKILL: the host's agent dies without a word."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=15)

    def sim_command(self, **command: Any) -> None:
        """Drop a command into the simulator's control inbox (e.g. op="inject_xid", gpu=0, xid=79)."""
        inbox = self.state_dir / "sim" / "control"
        inbox.mkdir(parents=True, exist_ok=True)
        path = inbox / f"{time.monotonic_ns()}.json"
        path.with_suffix(".tmp").write_text(json.dumps(command))
        path.with_suffix(".tmp").replace(path)

    def task_pid(self, task_id: int) -> int | None:
        path = self.state_dir / "agent-state.json"
        if not path.exists():
            return None
        for record in json.loads(path.read_text()).get("tasks", []):
            if record["task_id"] == str(task_id):
                return int(record["pid"])
        return None

    def task_output(self, task_id: int) -> str:
        path = self.state_dir / "tasks" / str(task_id) / "stdout.log"
        return path.read_text() if path.exists() else ""

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        state = self.state_dir / "agent-state.json"
        if state.exists():
            for record in json.loads(state.read_text()).get("tasks", []):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(record["pid"]), signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the agent that started it is gone, nobody reaped it yet) is as good as dead.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


@pytest.fixture
def agents(live_server: Any, transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    # Depends on the database fixture so agents stop before the tables are flushed under them.
    made: list[AgentProcess] = []

    def make(*, token: str, node_name: str, gpus: list[dict[str, Any]]) -> AgentProcess:
        agent = AgentProcess(
            tmp_path / f"agent-{len(made)}",
            server=live_server.url,
            token=token,
            node_name=node_name,
            gpus=gpus,
        )
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.cleanup()
    if made:
        time.sleep(1.5)  # let the server finish the long polls in flight (wait_s 1) before the flush
