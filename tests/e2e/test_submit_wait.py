"""`whalegen submit --wait` against the live plane while a real agent runs the task: it prints the state
changes as they happen and exits with the task's own exit code. The assignment is written the way a
scheduling cycle commits one, so this test needs no cycle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.apps.fleet.conftest import assign
from tests.e2e.conftest import ROOT, wait_for
from tests.e2e.test_plane_and_agents import H100_NODE

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("exit_code", [0, 7], ids=["a task that succeeds exits 0", "a failing task exits 7"])
def test_submit_wait_follows_the_task_and_exits_with_its_exit_code(
    fleet: Any, agents: Any, live_server: Any, tmp_path: Path, exit_code: int
) -> None:
    from apps.tenants.services import token_create
    from apps.workloads.models import Task

    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.start()
    _, token = token_create(user=fleet.alice, tenant=fleet.tenant_a, name="ci")
    spec = tmp_path / "task.yaml"
    spec.write_text(f"queue: train\nname: wait-me\ncommand: [sh, -c, 'sleep 0.5; exit {exit_code}']\n")
    env = dict(os.environ, WHALEGEN_URL=live_server.url, WHALEGEN_TOKEN=token, PYTHONPATH=str(ROOT))
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whalegen",
            "submit",
            str(spec),
            "--wait",
            "--timeout",
            "30",
            "--interval",
            "0.2",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        task = wait_for(lambda: Task.objects.filter(name="wait-me").first(), what="the submission")
        wait_for(lambda: fleet.node.gpus.filter(uuid__startswith="GPU-").count() == 2, what="registration")
        assign(task, fleet.node, [fleet.whole_unit])
        out, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == exit_code, err
    lines = [line for line in out.splitlines() if line.startswith(f"task {task.pk}:")]
    states = [line.split(": ", 1)[1].split(" ")[0] for line in lines]
    final = "succeeded" if exit_code == 0 else "failed"
    assert states[0] == "pending" and states[-1] == final
    assert "running" in states
    assert lines[-1].endswith(f"exit code {exit_code}")
