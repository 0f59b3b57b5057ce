"""Every line every process of the production set writes is one JSON object with the common fields, and no
credential sent to the plane appears in any of them (issue #42 item 3; docs/logs-and-metrics.md, "Logs").

The process set is the shipped one, each a real process on a PostgreSQL and a Redis of this test's own:
the start-up steps the compose stack runs before the others (`manage.py migrate --noinput` on an empty
database, with its progress output, and `whalegen create join-token --bootstrap`) and the `manage.py check`
an operator's unit may run, then gunicorn with docker/gunicorn.conf.py, `celery worker`, `celery beat` and
`whalegen agent --backend sim`, with no log setting in their environment (the defaults are what is under
test). Each process's stdout and stderr go to files of their own, read from the first byte, so a line is
judged as the process wrote it: every line of every one must be JSON with the common fields, start-up
lines included. The test drives what makes each kind of line: requests carrying an API token, a node
token, a join token and a made-up bearer in headers and query strings (gunicorn's access lines, with the
tenant or node the credential names, the agent's heartbeats' included; Django's 401/403 lines), a task
submitted and run on the agent (Celery's received/succeeded lines, the agent's task lines), a Celery task
sent with arguments it does not take (a failure with a traceback), and SIGTERM at the end (each process's
stop lines).
Run it under `flock /var/tmp/faults.lock` (fixed ports, as tests/ops/test_production_stack.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.ops.stack import ROOT, OpsStack, Ports, stack_in_temp_dir, wait

pytestmark = pytest.mark.e2e

PORTS = Ports.from_env("WHALEGEN_LOGS", web=18640, postgres=15474, redis=16421)
COMMON = ("time", "level", "component", "logger", "message")
# Each process of the set by the name its output files have, and the `component` its lines carry.
STEPS = {"migrate": "plane", "check": "plane", "bootstrap": "plane"}
COMPONENT = {**STEPS, "web": "web", "worker": "worker", "beat": "beat", "agent": "agent"}
BOOTSTRAP_SECRET = "logs-bootstrap-secret-0123456789"
FAKE_BEARER = "zq-made-up-bearer-7c1e0b9a5d"
FAKE_JOIN_TOKEN = "wgj_" + "J" * 40


def _make_stack(work: Path) -> OpsStack:
    return OpsStack(
        work,
        PORTS,
        "logs-test-only-not-secret",
        env_set={
            "WHALEGEN_WEB_BIND": f"127.0.0.1:{PORTS.web}",
            "WEB_CONCURRENCY": "2",
            "WHALEGEN_WEB_THREADS": "4",
        },
        # The shipped defaults are under test: no format, level or component chosen here.
        env_unset=(
            "DJANGO_SETTINGS_MODULE",
            "WHALEGEN_LOG_FORMAT",
            "WHALEGEN_LOG_LEVEL",
            "WHALEGEN_ACCESS_LOG_LEVEL",
            "WHALEGEN_COMPONENT",
        ),
        # Each stream to a file of its own, so a line is judged as the process wrote it.
        separate_streams=True,
    )


@pytest.fixture
def stack() -> Iterator[OpsStack]:
    with stack_in_temp_dir("whalegen-log-lines-", _make_stack) as made:
        yield made


def _step(stack: OpsStack, name: str, *args: str, **env: str) -> None:
    """`python *args` to the end, as a start-up step of the stack: exit 0, its stdout and stderr kept in
    files of their own as a spawned process's are."""
    with (stack.work / f"{name}.out").open("wb") as out, (stack.work / f"{name}.err").open("wb") as err:
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=dict(stack.env, **env), stdout=out,
                              stderr=err, timeout=180)  # fmt: skip
    assert done.returncode == 0, (name, stack.outputs(name))


def _start(stack: OpsStack) -> None:
    """Servers, the start-up steps as docker/compose.yaml's migrate service runs them (and a `check`), the
    test's seed, then the four processes as the images run them; ready when /readyz is."""
    stack.start_servers()
    _step(stack, "migrate", "manage.py", "migrate", "--noinput")
    _step(stack, "bootstrap", "-m", "whalegen", "create", "join-token", "--bootstrap",
          WHALEGEN_BOOTSTRAP_JOIN_TOKEN=BOOTSTRAP_SECRET)  # fmt: skip
    _step(stack, "check", "manage.py", "check")
    stack.world = json.loads(stack.run("-m", "tests.ops.plane_scripts"))
    stack.spawn("web", "-m", "gunicorn", "-c", "docker/gunicorn.conf.py", "whalegen.config.wsgi")
    stack.spawn("worker", "-m", "celery", "-A", "whalegen.config", "worker", "--loglevel", "info",
                "--concurrency", "2", "-n", "logs@%h")  # fmt: skip
    stack.spawn("beat", "-m", "celery", "-A", "whalegen.config", "beat", "--loglevel", "info",
                "-s", str(stack.work / "beat-schedule"))  # fmt: skip
    stack.spawn(
        "agent", "-m", "whalegen", "agent", "--server", stack.url,
        "--backend", "sim", "--state-dir", str(stack.work / "agent"), "--node-name", "ops-example",
        "--heartbeat-s", "1", "--poll-wait-s", "1", "--tick-s", "0.2", "--reconcile-s", "2",
        WHALEGEN_AGENT_TOKEN=stack.world["nodes"]["ops-example"]["token"],
    )  # fmt: skip
    wait(lambda: (answer := stack.answers("/readyz")) is not None and answer.status_code == 200, 90,
          "/readyz to turn 200")  # fmt: skip


def _drive(stack: OpsStack) -> dict[str, str]:
    """Requests carrying every kind of credential, a task run to the end, a Celery task that fails.
    Returns the request id the plane answered each request with, by what it carried."""
    api_token = stack.world["token"]
    node_token = stack.world["nodes"]["ops-example"]["token"]
    sent = {
        "api token": ("/api/v1/tasks/", {"token": api_token}, api_token),
        "made-up bearer": ("/api/v1/tasks/", {"access_token": FAKE_BEARER}, FAKE_BEARER),
        "node token": ("/api/v1/agent/heartbeat/", {"token": node_token}, node_token),
        "join token": ("/api/v1/tasks/", {"join_token": FAKE_JOIN_TOKEN}, FAKE_JOIN_TOKEN),
    }
    request_ids = {}
    for what, (path, query, secret) in sent.items():
        answer = requests.get(
            f"{stack.url}{path}", params=query, headers={"Authorization": f"Bearer {secret}"}, timeout=10
        )
        request_ids[what] = answer.headers["X-Request-ID"]
    body = {"queue": "work", "name": "logged-task", "gpu_count": 1, "command": ["sh", "-c", "echo ran"],
            "max_runtime_s": 120, "cpu_milli": 1000, "host_mem_mib": 1024}  # fmt: skip
    headers = {"Authorization": f"Bearer {api_token}"}
    created = requests.post(f"{stack.url}/api/v1/tasks/?token={api_token}", json=body, headers=headers,
                            timeout=30)  # fmt: skip
    assert created.status_code == 201, created.text
    task_url = f"{stack.url}/api/v1/tasks/{created.json()['id']}/"
    wait(lambda: requests.get(task_url, headers=headers, timeout=10).json()["state"] == "succeeded", 90,
          "the task to succeed on the agent")  # fmt: skip
    # A message whose task takes no such arguments: the worker logs the failure with its traceback.
    stack.run("-m", "celery", "-A", "whalegen.config", "call", "apps.metrics.tasks.plane_tick",
              "--args", '["unexpected"]')  # fmt: skip
    wait(lambda: "TypeError" in stack.outputs("worker")["err"], 60, "the worker to log the failure")
    return request_ids


def _stop(stack: OpsStack) -> None:
    for proc in stack.procs.values():
        proc.send_signal(signal.SIGTERM)
    for proc in stack.procs.values():
        proc.wait(timeout=30)


def _entries(stack: OpsStack, name: str) -> list[dict[str, Any]]:
    """Every line `name` wrote on stdout and stderr, each parsed; a line that is not a JSON object fails."""
    found = []
    for stream, text in stack.outputs(name).items():
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                raise AssertionError(f"{name} {stream} line {number} is not JSON: {line!r}") from None
            assert isinstance(entry, dict), (name, stream, line)
            assert list(entry)[: len(COMMON)] == list(COMMON), (name, stream, line)
            assert entry["component"] == COMPONENT[name], (name, stream, line)
            assert datetime.fromisoformat(entry["time"]).utcoffset() is not None, line
            found.append(entry | {"stream": stream})
    return found


def test_every_process_writes_only_json_lines_with_the_common_fields_and_no_credential(
    stack: OpsStack,
) -> None:
    _start(stack)
    request_ids = _drive(stack)
    _stop(stack)
    # 1. Every line of every process is one JSON object with the common fields, and no credential.
    logs = {name: _entries(stack, name) for name in COMPONENT}
    secrets = [stack.world["token"], FAKE_BEARER, FAKE_JOIN_TOKEN, BOOTSTRAP_SECRET,
               *(node["token"] for node in stack.world["nodes"].values())]  # fmt: skip
    for name in COMPONENT:
        text = "".join(stack.outputs(name).values())
        assert [secret for secret in secrets if secret in text] == [], name
    # 2. gunicorn's own lines and its access lines: the request's fields, its id, the query redacted.
    web = logs["web"]
    assert any(e["logger"] == "gunicorn.error" and "Booting worker" in e["message"] for e in web)
    access = {e["request_id"]: e for e in web if e["logger"] == "gunicorn.access" and "request_id" in e}
    for what, request_id in request_ids.items():
        line = access[request_id]
        assert (line["method"], line["stream"]) == ("GET", "out"), line
        assert line["path"].split("?")[1].split("=")[1] == "[redacted]", (what, line)
        assert line["message"] == f"GET {line['path']} {line['status']}", line
    assert access[request_ids["api token"]]["status"] == 200
    # Who sent it, where the credential says: the API token's tenant, the agent's node on its fetches.
    assert access[request_ids["api token"]]["tenant"] == "ops"
    assert "tenant" not in access[request_ids["made-up bearer"]]
    fetches = [e for e in web if e["logger"] == "gunicorn.access" and "/agent/desired-state/" in e["path"]]
    assert fetches and {e["node"] for e in fetches} == {"ops-example"}
    # The heartbeat is answered in front of DRF (whalegen/config/wsgi.py) and names its node itself.
    beats = [e for e in web if e["logger"] == "gunicorn.access" and e["method"] == "POST"
             and e["path"] == "/api/v1/agent/heartbeat/"]  # fmt: skip
    assert beats and {(e["status"], e.get("node")) for e in beats} == {(200, "ops-example")}, beats[:3]
    refused = [e for e in web if e["logger"] == "django.request" and e.get("request_id") in access]
    assert refused, "Django's 401/403 lines carry the request id"
    # 3. Celery: the worker's lines about a task carry its id and name; a failure carries its traceback.
    worker = logs["worker"]
    received = [e for e in worker if e["message"].startswith("Task ") and " received" in e["message"]]
    assert received and all(e["celery_task_id"] and e["celery_task"] for e in received)
    assert any(e["logger"] == "celery.app.trace" and "succeeded" in e["message"] for e in worker)
    (failure,) = [e for e in worker if "TypeError" in e.get("exc", "")]
    assert (
        failure["exc"].startswith("Traceback") and failure["celery_task"] == "apps.metrics.tasks.plane_tick"
    )
    assert any(" ready." in e["message"] for e in worker)
    assert any("Sending due task" in e["message"] for e in logs["beat"])
    # 4. The agent: its node on every line, and the task's lines.
    agent = logs["agent"]
    assert {e["node"] for e in agent} == {"ops-example"}
    assert any(e.get("task_id") and "succeeded" in e["message"] for e in agent)
    # 5. The start-up steps: migrate's progress (a line printed in two pieces is one record), the
    #    bootstrap token's sentence, the check's verdict.
    said = {name: [(e["logger"], e["message"]) for e in logs[name]] for name in STEPS}
    assert ("manage.migrate", "Applying contenttypes.0001_initial... OK") in said["migrate"]
    assert [message.split(" token ")[0] for _, message in said["bootstrap"]] == ["made bootstrap"]
    assert said["check"] == [("manage.check", "System check identified no issues (0 silenced).")]


def test_a_setting_gunicorn_refuses_at_its_start_is_a_json_line_too() -> None:
    """docker/gunicorn.conf.py is read before gunicorn's logger exists: its refusal is formatted there."""
    env = {k: v for k, v in os.environ.items() if k not in ("WHALEGEN_LOG_FORMAT", "WHALEGEN_COMPONENT")}
    env.update(PYTHONPATH=str(ROOT), WHALEGEN_WEB_THREADS="eight", WHALEGEN_WEB_BIND="127.0.0.1:0")
    done = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "docker/gunicorn.conf.py",
                           "whalegen.config.wsgi"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert list(line) == [*COMMON]
    assert (line["level"], line["component"], line["message"]) == (
        "ERROR",
        "web",
        "WHALEGEN_WEB_THREADS='eight' is not a number",
    )
