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

from agents.capture import stream_text
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
        # The credential in a file only its owner reads, as docs/operations.md sets a host up (on the
        # command line any user of the host would read it in /proc).
        self.token_file = work / "node-token"
        self.token_file.write_text(token)
        self.token_file.chmod(0o600)
        self.env = dict(
            os.environ,
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            PYTHONPATH=str(ROOT),
            WHALEGEN_AGENT_TOKEN_FILE=str(self.token_file),
        )
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.env.pop("WHALEGEN_AGENT_TOKEN", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "whalegen", "agent",
                    "--server", self.server,
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

    def task_output(self, task_id: int, stream: str = "stdout") -> str:
        return stream_text(self.state_dir / "tasks" / str(task_id) / "output", stream)

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
        # The agents are dead, so their connections are closed; let the server finish the long polls in
        # flight (wait_s 1) before the flush.
        wait_requests_served(at_most_s=1.5)


def wait_requests_served(at_most_s: float) -> None:
    """Wait until the live server (a threaded WSGI server in this process: one thread per connection)
    has no request thread left, so every request in flight has been answered, or `at_most_s` passed (a
    client that keeps its connection open holds a thread; that is no request in flight)."""
    import threading

    deadline = time.monotonic() + at_most_s
    while time.monotonic() < deadline and any(
        t.name.endswith("(process_request_thread)") and t.is_alive() for t in threading.enumerate()
    ):
        time.sleep(0.05)


class CeleryWorker:
    """`celery -A whalegen.config worker --pool solo` as a subprocess, on the real Redis broker and the
    same (test) PostgreSQL database as the live server."""

    def __init__(self, work: Path, *, name: str, database_url: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = work / f"{name}.log"
        self.env = dict(os.environ, DATABASE_URL=database_url, PYTHONPATH=str(ROOT))
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        # Silent agents are lost after 10 missed heartbeats of 2 s (the e2e agents beat every 0.5 s). On a
        # loaded 2-core machine 1 s let a live agent be marked lost now and then, and 6 s, then 10 s, were
        # shorter than a restarted agent's start under a load average of 10-15 (the re-adoption test then
        # saw its task requeued); the lost-node test still sees its node lost and its task rerun within
        # its 60 s.
        self.env.update(WHALEGEN_AGENT_HEARTBEAT_S="2", WHALEGEN_NODE_LOST_HEARTBEATS="10")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", "whalegen.config", "worker",
                    "--pool", "solo", "--concurrency", "1", "-n", f"{self.name}@%h", "--loglevel", "INFO",
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                ],
                cwd=ROOT, env=self.env, stdout=log, stderr=log,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"celery worker {self.name} exited:\n{self.log()[-3000:]}")
        return " ready." in self.log()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def celery_workers(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[CeleryWorker]]:
    """Two real Celery workers for the module, consuming from Redis (REDIS_URL) and writing to the test
    database the live server uses. Fails (never skips) without a Redis broker or PostgreSQL."""
    from django.conf import settings
    from django.db import connection

    from whalegen.config.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis://"), "set REDIS_URL: the e2e loop needs Redis"
    assert connection.vendor == "postgresql", "set DATABASE_URL: the e2e loop needs PostgreSQL"
    db = connection.settings_dict
    database_url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    if db.get("PASSWORD"):
        database_url = database_url.replace(f"{db['USER']}@", f"{db['USER']}:{db['PASSWORD']}@")
    app.control.purge()  # messages left by an earlier run would act on rows that no longer exist
    work = tmp_path_factory.mktemp("celery")
    workers = [CeleryWorker(work, name=f"e2e-{n}", database_url=database_url) for n in (1, 2)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 90
        while not all(w.ready() for w in workers):
            if time.monotonic() > deadline:
                raise AssertionError("celery workers not ready after 90 s:\n" + workers[0].log()[-3000:])
            time.sleep(0.3)
        yield workers
    finally:
        app.control.purge()
        for worker in workers:
            worker.stop()


class CyclePump:
    """What beat does in production, faster: every `interval_s` send `cycles_all_pools` (one `cycle_pool`
    per pool) and `nodes_check_health` through the broker. Only sends; the workers do the work."""

    def __init__(self, interval_s: float) -> None:
        import threading

        self.interval_s = interval_s
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cycle-pump", daemon=True)

    def _run(self) -> None:
        from apps.fleet.tasks import nodes_check_health
        from apps.scheduling.tasks import cycles_all_pools

        while not self._stop.is_set():
            cycles_all_pools.delay()
            nodes_check_health.delay()
            self.sent += 1
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def cycle_pump(celery_workers: list[CeleryWorker], transactional_db: None) -> Iterator[CyclePump]:
    """Beat's fan-out every second for one test; stopped and the queue purged before the tables are
    flushed, so no cycle runs against a half-emptied database."""
    from whalegen.config.celery import app

    pump = CyclePump(interval_s=1.0)
    yield pump
    pump.stop()
    app.control.purge()
    time.sleep(1.0)  # a cycle already running on a worker finishes (or finds nothing) before the flush
