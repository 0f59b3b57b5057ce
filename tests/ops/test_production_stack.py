"""The production process set without containers (issue #15 part 4): what docker/compose.yaml runs, each
as a real process on a PostgreSQL and a Redis of its own — gunicorn, `celery worker`, two `celery beat`
(one sends, the other stands by: issue #42) and two `whalegen agent --backend sim` (one on the example
host, given no `--sim-spec`). `/readyz` turns 200 once migrations ran and beat ticked; a task submitted
through the API and one through `whalegen submit --wait` run to `succeeded`; then every process gets
SIGTERM and must exit 0 within its grace. The servers, ports and work directory are this test's own
(WHALEGEN_OPS_*_PORT), so it runs in the same session as the fault suite.
"""

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from agents.sim.tools import install_fake_tools
from tests.faults.services import PostgresServer, RedisServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# Below Linux's ephemeral range, as the fault suite's (tests/faults/services.py says why).
WEB_PORT = int(os.environ.get("WHALEGEN_OPS_WEB_PORT", "18620"))
POSTGRES_PORT = int(os.environ.get("WHALEGEN_OPS_POSTGRES_PORT", "15464"))
REDIS_PORT = int(os.environ.get("WHALEGEN_OPS_REDIS_PORT", "16411"))
# Seconds each process may take to stop after SIGTERM: gunicorn's --graceful-timeout plus slack, Celery's
# warm shutdown of an idle worker, a beat giving up its lease, the agent's clean exit (it leaves runs
# running). Beat keeps no schedule file (its state is in PostgreSQL): the shelve that could be closed under
# a tick at shutdown ("invalid operation on closed shelf", exit 1) is gone.
FINAL = {"succeeded", "failed", "cancelled"}
GRACE_S = {
    "web": 15.0,
    "worker": 20.0,
    "beat": 10.0,
    "beat-standby": 10.0,
    "agent-example": 10.0,
    "agent-l40s": 10.0,
}


def _wait(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class ProductionStack:
    work: Path
    url: str = f"http://127.0.0.1:{WEB_PORT}"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    world: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pg = PostgresServer(self.work / "pg", port=POSTGRES_PORT)
        self.redis = RedisServer(self.work / "redis", port=REDIS_PORT)
        self.bin_dir = install_fake_tools(self.work / "bin")
        self.env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            PATH=f"{self.bin_dir}:{os.environ['PATH']}",
            DATABASE_URL=self.pg.url("whalegen"),
            REDIS_URL=self.redis.url,
            SECRET_KEY="ops-test-only-not-secret",
            WHALEGEN_CYCLE_INTERVAL_S="1",
            WHALEGEN_NODE_HEALTH_INTERVAL_S="1",
            WHALEGEN_PLANE_TICK_INTERVAL_S="1",
            WHALEGEN_AGENT_HEARTBEAT_S="2",
            WHALEGEN_NODE_LOST_HEARTBEATS="15",
            WHALEGEN_LOG_FORMAT="json",
            WHALEGEN_ACCESS_LOG_LEVEL="WARNING",
        )
        self.env.pop("DJANGO_SETTINGS_MODULE", None)

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def spawn(self, name: str, *args: str) -> None:
        with (self.work / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=self.env, stdout=log, stderr=log
            )

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=10, **kwargs)

    def answers(self, path: str) -> requests.Response | None:
        try:
            return self.get(path)
        except requests.RequestException:
            return None

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.world['token']}"}
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def start_agent(self, name: str, node: str, *spec: str) -> None:
        token = self.world["nodes"][node]["token"]
        self.spawn(
            name, "-m", "whalegen", "agent", "--server", self.url, "--token", token,
            "--backend", "sim", *spec,
            "--state-dir", str(self.work / name), "--node-name", node,
            "--heartbeat-s", "1", "--poll-wait-s", "1", "--tick-s", "0.2", "--reconcile-s", "2",
        )  # fmt: skip

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.redis.stop()
        self.pg.stop("immediate")


@pytest.fixture
def stack() -> Iterator[ProductionStack]:
    # Traversable by the `postgres` user the cluster runs as when the suite runs as root.
    path = Path(tempfile.mkdtemp(prefix="whalegen-ops-stack-"))
    path.chmod(0o755)
    made = ProductionStack(path)
    try:
        yield made
    finally:
        made.cleanup()
        if not os.environ.get("WHALEGEN_OPS_KEEP"):  # set it to read the processes' logs afterwards
            shutil.rmtree(path, ignore_errors=True)


def _task_body(name: str) -> dict[str, Any]:
    return {
        "queue": "work",
        "name": name,
        "gpu_count": 1,
        "command": ["sh", "-c", f"echo {name} ran; sleep 1"],
        "max_runtime_s": 120,
        "cpu_milli": 1000,
        "host_mem_mib": 1024,
    }


def test_gunicorn_celery_and_two_agents_run_a_task_and_stop_cleanly_on_sigterm(
    stack: ProductionStack, tmp_path: Path
) -> None:
    # 1. Servers of our own, the database migrated and seeded; gunicorn and the worker import meanwhile.
    stack.pg.init()
    stack.pg.start()
    subprocess.run(
        [str(stack.pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(POSTGRES_PORT), "-U", "postgres",
         "whalegen"],
        check=True, capture_output=True,
    )  # fmt: skip
    stack.redis.start()
    stack.spawn(
        "web", "-m", "gunicorn", "whalegen.config.wsgi", "--bind", f"127.0.0.1:{WEB_PORT}",
        "--workers", "2", "--threads", "4", "--timeout", "60", "--graceful-timeout", "5",
    )  # fmt: skip
    stack.spawn(
        "worker", "-m", "celery", "-A", "whalegen.config", "worker", "--loglevel", "INFO",
        "--concurrency", "2", "-n", "ops@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    )  # fmt: skip
    stack.run("manage.py", "migrate", "--noinput")
    stack.world = json.loads(stack.run("-m", "tests.ops.plane_scripts"))

    # 2. Up but not ready: healthz answers, readyz names beat (never started) as its failing check.
    health = _wait(lambda: stack.answers("/healthz"), 60, "gunicorn to answer /healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    early = stack.get("/readyz")
    assert early.status_code == 503, early.text
    assert early.json()["failing"] == ["beat"], early.json()
    assert early.json()["checks"]["broker"] == {"ok": True, "detail": "redis answers PING"}

    # 3. Two beats and the agents; readyz turns 200 once a worker ran the leading beat's plane-tick.
    for name in ("beat", "beat-standby"):
        stack.spawn(
            name, "-m", "celery", "-A", "whalegen.config", "beat", "--loglevel", "INFO",
            "--pidfile", str(stack.work / f"{name}.pid"),
        )  # fmt: skip
    l40s_spec = stack.work / "l40s.yaml"
    l40s_spec.write_text("nodes:\n  - name: ops-l40s\n    gpus:\n      - sku: l40s\n        count: 2\n")
    stack.start_agent("agent-example", "ops-example")  # the example host: no --sim-spec
    stack.start_agent("agent-l40s", "ops-l40s", "--sim-spec", str(l40s_spec))
    ready = _wait(
        lambda: (answer := stack.answers("/readyz")) is not None and answer.status_code == 200 and answer,
        60,
        "/readyz to turn 200",
    )
    assert ready.json()["status"] == "ok" and ready.json()["failing"] == []
    assert ready.headers["X-Request-ID"]

    # 4. One task through the API, one through `whalegen submit --wait`; both succeed on the agents.
    answer = stack.api("post", "/api/v1/tasks/", json=_task_body("api-task"))
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["id"]
    spec = tmp_path / "task.yaml"
    spec.write_text(json.dumps(_task_body("cli-task")))
    cli = subprocess.run(
        [sys.executable, "-m", "whalegen", "submit", str(spec),
         "--wait", "--timeout", "90", "--interval", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(stack.env, WHALEGEN_URL=stack.url, WHALEGEN_TOKEN=stack.world["token"]),
    )  # fmt: skip
    assert cli.returncode == 0, f"{cli.stdout}\n{cli.stderr}\n{stack.log('agent-example')[-2000:]}"
    assert "succeeded" in cli.stdout
    state = _wait(
        lambda: (s := stack.api("get", f"/api/v1/tasks/{task_id}/").json()["state"]) in FINAL and s,
        60,
        "the API task to end",
    )
    assert state == "succeeded", stack.api("get", f"/api/v1/tasks/{task_id}/").json()

    # The plane's processes wrote JSON lines (WHALEGEN_LOG_FORMAT=json), the worker's included.
    worker_lines = [line for line in stack.log("worker").splitlines() if line.startswith("{")]
    assert worker_lines, stack.log("worker")[-2000:]
    assert {"time", "level", "component", "logger", "message"} <= json.loads(worker_lines[-1]).keys()

    # 5. SIGTERM to every process at once; each exits 0 within its grace.
    started = time.monotonic()
    for proc in stack.procs.values():
        proc.send_signal(signal.SIGTERM)
    took: dict[str, float] = {}
    codes: dict[str, int | None] = {}
    for name, proc in stack.procs.items():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(GRACE_S[name] - (time.monotonic() - started), 0.1))
        codes[name] = proc.poll()
        took[name] = round(time.monotonic() - started, 1)
    logs = {name: stack.log(name)[-1500:] for name, code in codes.items() if code != 0}
    assert codes == dict.fromkeys(stack.procs, 0), (codes, took, logs)
