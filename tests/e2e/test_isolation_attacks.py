"""A tenant's task attacks its host, with real agents on the live plane (issue #37; docs/isolation.md).

Tenant `speech` runs a victim on the node's MIG instance: a secret in its environment, a line of output,
a sleep. Tenant `vision` then runs the attack script (tests/e2e/attacks.py) on the node's other GPU, told
every path and pid it could want. Every probe must fail: the node's credential, the agent's environment
and state, the victim's environment, output and run directory, signalling or killing the victim, opening
the victim's GPU device. Two more runs go past their own limits: host memory (killed, and the task says
why in words) and processes (the fork fails; the host stays usable).

The agents here run as root (CI does), so process runs take their tenant's uid; the container variant
runs the same script in the test image (scripts/test-image) through podman, given its GPU by CDI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agents.isolation import cdi
from tests.apps.fleet.conftest import assign
from tests.e2e.attacks import PROBES, SCRIPT, breaches, verdicts
from tests.e2e.conftest import wait_for
from tests.e2e.test_plane_and_agents import H100_NODE

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TEST_IMAGE = "localhost/whalegen-test/busybox:1"
VICTIM_SECRET = "hf_victim_secret_7f3a"
VICTIM_LINE = "victim-output-line-91c2"


def _state(task: Any, *states: str) -> bool:
    task.refresh_from_db()
    return task.state in states


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _command_pid(agent: Any, task_id: int) -> int:
    """The pid of the victim's command: the launcher's child (the launcher itself is root's)."""
    launcher = wait_for(lambda: agent.task_pid(task_id), what="the victim's launcher")
    return int(wait_for(lambda: (_children(launcher) or [0])[0], what="the victim's command"))


def _gpu_device_node(agent: Any, gpu_uuid: str) -> str:
    """The host device node this agent's simulated host gives `gpu_uuid` in its CDI spec (simulated hosts
    of other tests may name the same UUIDs: theirs lie in their own state directories)."""
    registry = cdi.load_registry()
    for spec in registry.specs:
        nodes = [n for n in spec.devices.get(gpu_uuid, ()) if n.startswith(f"{agent.state_dir}/")]
        if nodes:
            return nodes[0]
    raise AssertionError(f"no CDI device for {gpu_uuid} in {[s.source for s in registry.specs]}")


@pytest.fixture(params=["process", "container"])
def node(request: Any, fleet: Any, agents: Any) -> Any:
    """gpu-001's agent, and the runtime the tasks of this test run in (both tenants' tasks)."""
    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.start()
    wait_for(lambda: fleet.node.gpus.filter(uuid__startswith="GPU-").count() == 2, what="registration")
    fleet.agent = agent
    fleet.runtime = request.param
    for task in (fleet.task_a, fleet.task_b):
        task.runtime = request.param
        task.image = TEST_IMAGE if request.param == "container" else ""
        task.save(update_fields=["runtime", "image"])
    return fleet


def _run_victim(node: Any) -> Any:
    from apps.fleet.models import GpuPartition

    gpu0 = node.node.gpus.get(index=0)
    wait_for(lambda: GpuPartition.objects.filter(gpu=gpu0, state="ok").exists(), what="the MIG layout")
    victim = node.task_b
    victim.command = ["sh", "-c", f"echo {VICTIM_LINE}; echo $HF_TOKEN > secret-copy; sleep 120"]
    victim.env = {"HF_TOKEN": VICTIM_SECRET}
    victim.save(update_fields=["command", "env"])
    assign(victim, node.node, [node.mig_unit])
    wait_for(lambda: _state(victim, "running"), what="the victim to run")
    wait_for(lambda: VICTIM_LINE in node.agent.task_output(victim.pk), what="the victim's output")
    return victim


def test_every_attack_of_one_tenants_process_run_on_another_and_on_the_node_fails(
    node: Any, settings: Any
) -> None:
    agent = node.agent
    victim = _run_victim(node)
    victim_pid = _command_pid(agent, victim.pk)
    if node.runtime == "process":
        victim_uid = settings.WHALEGEN_TASK_UID_BASE + victim.tenant_id
        assert os.stat(f"/proc/{victim_pid}").st_uid == victim_uid, "the victim runs as its tenant's uid"
    attacker = node.task_a
    own_gpu = node.node.gpus.get(index=1).uuid
    attacker.command = ["sh", "-c", SCRIPT]
    attacker.env = {
        "A_TOKEN_FILE": str(agent.token_file),
        "A_AGENT_PID": str(agent.proc.pid),
        "A_STATE_DIR": str(agent.state_dir),
        "A_VICTIM_PID": str(victim_pid),
        "A_VICTIM_OUTPUT": str(agent.state_dir / "tasks" / str(victim.pk) / "output"),
        "A_VICTIM_RUN_DIR": str(agent.state_dir / "runs" / str(victim.pk)),
        "A_OTHER_GPU": _gpu_device_node(agent, node.node.gpus.get(index=0).uuid),
        # A process run opens its own GPU's host node; in a container the host path means nothing.
        "A_OWN_GPU": _gpu_device_node(agent, own_gpu) if node.runtime == "process" else "",
    }
    attacker.save(update_fields=["command", "env"])
    assign(attacker, node.node, [node.whole_unit])
    wait_for(lambda: _state(attacker, "succeeded", "failed"), timeout_s=60, what="the attack to end")
    output = agent.task_output(attacker.pk)
    assert "ATTACK DONE" in output, output
    # As its tenant's own uid (the plane's range: WHALEGEN_TASK_UID_BASE + the tenant's id).
    uid = settings.WHALEGEN_TASK_UID_BASE + attacker.tenant_id
    if node.runtime == "container":
        # In podman's container, with exactly one GPU device node: its own.
        assert f"RUNTIME podman uid={uid}\n" in output and "GPU NODES 1" in output, output
    else:
        assert f"RUNTIME host uid={uid}\n" in output and "OWN GPU OPENS" in output, output
    assert set(verdicts(output)) == set(PROBES), output
    assert breaches(output) == [], output
    assert VICTIM_SECRET not in output
    assert _state(victim, "running"), "the victim survived the attack"


def test_a_run_above_its_host_memory_limit_is_killed_and_says_so(node: Any) -> None:
    task = node.task_a
    task.host_mem_mib = 64
    task.command = ["sh", "-c", "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo survived"]
    task.save(update_fields=["host_mem_mib", "command"])
    assign(task, node.node, [node.whole_unit])
    wait_for(lambda: _state(task, "succeeded", "failed"), timeout_s=60, what="the run to end")
    assert task.state == "failed"
    assert "host memory above its 64 MiB limit" in task.failure_reason
    assert "survived" not in node.agent.task_output(task.pk)


def test_a_fork_bomb_stops_at_the_runs_process_limit(node: Any, settings: Any) -> None:
    settings.WHALEGEN_TASK_PIDS_MAX = 32
    task = node.task_a
    bomb = "n=0; while [ $n -lt 200 ]; do sleep 5 </dev/null >/dev/null 2>&1 & n=$((n+1)); done; echo done"
    task.command = ["sh", "-c", bomb]
    task.save(update_fields=["command"])
    assign(task, node.node, [node.whole_unit])
    wait_for(lambda: _state(task, "succeeded", "failed"), timeout_s=90, what="the bomb to end")
    output = node.agent.task_output(task.pk, "stderr")
    assert "fork" in output.lower(), output  # the shell's "can't fork" / "Cannot fork"
    # The host still starts runs: the limit was the run's, not the node's.
    node.task_b.command = ["sh", "-c", "echo after"]
    node.task_b.save(update_fields=["command"])
    assign(node.task_b, node.node, [node.whole_unit])
    wait_for(lambda: _state(node.task_b, "succeeded", "failed"), timeout_s=60, what="the next run")
    assert node.task_b.state == "succeeded"
