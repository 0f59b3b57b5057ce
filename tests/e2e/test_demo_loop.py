"""`whalegen demo` on the embedded default runs the loop: every seeded node's simulated agent registers
and heartbeats, the workload generator submits, and (with the scheduling cycle of `apps.scheduling`)
tasks reach the agents and finish within a minute."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import requests

from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.e2e


def _poll(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    data_dir = tmp_path_factory.mktemp("demo-loop")
    configured = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SECRET_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in configured}
    env.update(WHALEGEN_DATA_DIR=str(data_dir), PYTHONPATH=str(ROOT))
    log_path = data_dir / "demo.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "whalegen", "demo", "--port", "0", "--serve-seconds", "240",
             "--workload-interval-s", "1", "--seed", "7"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        text = _poll(lambda: "try:" in log_path.read_text() and log_path.read_text(), 90, "the demo to serve")
        url = re.search(r"serving at (http://\S+)", text).group(1)  # type: ignore[union-attr]
        tokens = dict(re.findall(r"^\s+(vision|speech|ranking)\s+\w+\s+(\S+)$", text, re.M))
        yield url, tokens, data_dir, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(url: str, token: str, path: str) -> dict:  # type: ignore[type-arg]
    answer = requests.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    answer.raise_for_status()
    return answer.json()


def test_every_seeded_node_has_a_live_agent(demo) -> None:  # type: ignore[no-untyped-def]
    url, tokens, data_dir, _ = demo

    def heard() -> list:  # type: ignore[type-arg]
        nodes = [n for t in tokens.values() for n in _get(url, t, "/api/v1/nodes/?limit=100")["results"]]
        named = {n["name"]: n for n in nodes}
        return list(named.values()) if all(n["last_heartbeat_at"] for n in named.values()) else []

    nodes = _poll(heard, 60, "every node to heartbeat")
    assert len(nodes) == 10 and {n["state"] for n in nodes} == {"ready"}
    assert len(list((data_dir / "agents").glob("*/agent.log"))) == 10


def test_generated_tasks_arrive(demo) -> None:  # type: ignore[no-untyped-def]
    url, tokens, _, _ = demo
    count = lambda: sum(  # noqa: E731
        1 for t in tokens.values() for task in _get(url, t, "/api/v1/tasks/?limit=200")["results"]
        if task["name"].startswith("gen-")
    )  # fmt: skip
    assert _poll(lambda: count() >= 3, 30, "generated tasks")


def test_generated_tasks_run_on_the_agents_and_finish_within_a_minute(demo) -> None:  # type: ignore[no-untyped-def]
    url, tokens, _, _ = demo

    def finished() -> list:  # type: ignore[type-arg]
        tasks = [t for tok in tokens.values() for t in _get(url, tok, "/api/v1/tasks/?limit=200")["results"]]
        return [t for t in tasks if t["name"].startswith("gen-") and t["state"] in ("succeeded", "failed")]

    done = _poll(finished, 90, "a generated task to finish")
    assert all(t["exit_code"] is not None for t in done)


def test_the_demo_says_how_its_tasks_are_isolated_and_runs_every_tenants_tasks_so(demo) -> None:  # type: ignore[no-untyped-def]
    url, tokens, data_dir, log_path = demo
    banner = log_path.read_text()
    if os.geteuid() == 0:
        assert "  runtime: tasks run as host processes, each as its tenant's uid in a cgroup" in banner
        said = "isolation: process runs as their tenant's uid"
    else:
        assert "  runtime: tasks run as host processes as your own user" in banner
        said = "isolation: NOT ROOT: process runs as this agent's own user"
    logs = list((data_dir / "agents").glob("*/agent.log"))
    assert len(logs) == 10
    _poll(lambda: all(said in p.read_text() for p in logs), 30, "every agent's isolation line")

    def tasks() -> list:  # type: ignore[type-arg]
        return [t for tok in tokens.values() for t in _get(url, tok, "/api/v1/tasks/?limit=200")["results"]]

    # Every tenant's tasks go from pending to succeeded under the sandbox.
    _poll(
        lambda: {t["tenant"] for t in tasks() if t["state"] == "succeeded"} == set(tokens),
        120, "a task of each tenant to succeed",
    )  # fmt: skip

    # Each tenant's seeded sample (the simulator's CUDA program: Python importing the checkout, as the
    # tenant's uid with a private /tmp) prints its steps: the sandbox leaves what a run needs reachable.
    def stepped() -> set:  # type: ignore[type-arg]
        found = set()
        for slug, token in tokens.items():
            for task in _get(url, token, "/api/v1/tasks/?limit=200")["results"]:
                if task["name"].startswith("gen-") or task["state"] not in ("running", "succeeded"):
                    continue
                lines = _get(url, token, f"/api/v1/tasks/{task['id']}/logs/?limit=50")["lines"]
                if any(re.search(r" 1/\d+$", line["text"]) for line in lines):
                    found.add(slug)
        return found

    _poll(lambda: stepped() == set(tokens), 90, "a seeded task of each tenant to print its first step")
