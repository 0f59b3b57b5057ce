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
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ops.stack import ROOT, OpsStack, Ports, stack_in_temp_dir, wait

pytestmark = pytest.mark.e2e

PORTS = Ports.from_env("WHALEGEN_OPS", web=18620, postgres=15464, redis=16411)
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


def _make_stack(work: Path) -> OpsStack:
    json_logs = {"WHALEGEN_LOG_FORMAT": "json", "WHALEGEN_ACCESS_LOG_LEVEL": "WARNING"}
    return OpsStack(work, PORTS, "ops-test-only-not-secret", env_set=json_logs)


@pytest.fixture
def stack() -> Iterator[OpsStack]:
    with stack_in_temp_dir("whalegen-ops-stack-", _make_stack) as made:
        yield made


def _start_agent(stack: OpsStack, name: str, node: str, *spec: str) -> None:
    token = stack.world["nodes"][node]["token"]
    stack.spawn(
        name, "-m", "whalegen", "agent", "--server", stack.url, "--token", token,
        "--backend", "sim", *spec,
        "--state-dir", str(stack.work / name), "--node-name", node,
        "--heartbeat-s", "1", "--poll-wait-s", "1", "--tick-s", "0.2", "--reconcile-s", "2",
    )  # fmt: skip


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
    stack: OpsStack, tmp_path: Path
) -> None:
    # 1. Servers of our own, the database migrated and seeded; gunicorn and the worker import meanwhile.
    stack.start_servers()
    stack.spawn(
        "web", "-m", "gunicorn", "whalegen.config.wsgi", "--bind", f"127.0.0.1:{PORTS.web}",
        "--workers", "2", "--threads", "4", "--timeout", "60", "--graceful-timeout", "5",
    )  # fmt: skip
    stack.spawn(
        "worker", "-m", "celery", "-A", "whalegen.config", "worker", "--loglevel", "INFO",
        "--concurrency", "2", "-n", "ops@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    )  # fmt: skip
    stack.migrate_and_seed()

    # 2. Up but not ready: healthz answers, readyz names beat (never started) as its failing check.
    health = wait(lambda: stack.answers("/healthz"), 60, "gunicorn to answer /healthz")
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
    _start_agent(stack, "agent-example", "ops-example")  # the example host: no --sim-spec
    _start_agent(stack, "agent-l40s", "ops-l40s", "--sim-spec", str(l40s_spec))
    ready = wait(
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
    state = wait(
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
