"""The agent's log lines: JSON under WHALEGEN_LOG_FORMAT=json with the node, task id and attempt, plain
otherwise, never a credential, and no Django or Celery loaded to write them (docs/logs-and-metrics.md,
"Logs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_TOKEN = "wgn_" + "k" * 40

# Logs through the agent's own code paths: the command's logging set-up, the agent's task report, and
# careless lines about its client's credentials (the header dict, the raw token).
SCRIPT = f"""
import logging, sys
from types import SimpleNamespace
from whalegen.commands.agent import configure_logging
configure_logging(fmt=sys.argv[1], level="INFO", node="gpu-host-7")
from agents.agent import Agent
from agents.client import PlaneClient
from whalegen.protocol import TaskState
Agent._task_report(SimpleNamespace(pending_tasks=[]), "42", 3, TaskState.FAILED, 0.0, reason="exit status 1")
client = PlaneClient("http://plane.invalid", {NODE_TOKEN!r})
log = logging.getLogger("whalegen.agent")
log.info("talking to the plane with %s", dict(client.session.headers))
log.warning("token=%s rejected", {NODE_TOKEN!r})
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & {{"django", "celery", "rest_framework", "apps"}})
print(",".join(loaded))
"""


def _run(fmt: str) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, fmt], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines(), done.stdout.strip()


def test_json_lines_carry_node_task_and_attempt_without_loading_django() -> None:
    lines, loaded = _run("json")
    assert loaded == ""
    entries = [json.loads(line) for line in lines]
    assert all(entry["node"] == "gpu-host-7" for entry in entries)
    report = next(entry for entry in entries if entry["message"].startswith("task 42"))
    assert (report["task_id"], report["attempt"], report["level"]) == ("42", 3, "INFO")
    assert report["message"] == "task 42 attempt 3 failed: exit status 1"


@pytest.mark.parametrize("fmt", ["json", "plain"], ids=["in JSON lines", "in plain lines"])
def test_the_node_token_is_never_written(fmt: str) -> None:
    lines, _ = _run(fmt)
    text = "\n".join(lines)
    assert len(lines) == 3
    assert NODE_TOKEN not in text and "k" * 16 not in text
    assert text.count("[redacted]") >= 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "--server and --token"),
        (("--server", "http://plane.invalid", "--uid-range", "5"), "--uid-range: a uid range reads LOW-HIGH"),
    ],
    ids=["no credential", "a bad uid range"],
)
def test_an_agent_that_refuses_to_start_says_why_in_a_json_line(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    """What a supervisor's log shows of an agent started without what it needs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEGEN_AGENT_", "WHALEGEN_LOG"))}
    env.update(PYTHONPATH=str(ROOT), WHALEGEN_AGENT_TOKEN=NODE_TOKEN if args else "")
    done = subprocess.run(
        [sys.executable, "-m", "whalegen", "agent", "--backend", "sim", "--state-dir", str(tmp_path), *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert (line["level"], line["component"], line["logger"]) == ("ERROR", "agent", "whalegen.agent")
    assert says in line["message"] and NODE_TOKEN not in done.stderr
