"""The real plane and real agent processes on simulated NVML, over HTTP: a task assigned in the database
runs on the node and ends with its exit code; a MIG layout is applied; cancel while running; a node
killed mid-run is marked lost and its task requeued, and its orphan stopped when it returns; an agent
restarted re-adopts its running task."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.fleet.conftest import assign
from tests.e2e.conftest import alive, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The world fixture's node gpu-001: GPU 0 an H100 in MIG mode carved 3g.40gb@0, GPU 1 a whole H100.
H100_NODE = [{"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "h100-80gb-sxm"}]


@pytest.fixture
def node_a(fleet: Any, agents: Any) -> Any:
    """The agent of gpu-001, started and registered (GPU UUIDs now the simulator's)."""
    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.start()
    wait_for(
        lambda: fleet.node.gpus.filter(uuid__startswith="GPU-").count() == 2 and _seen(fleet.node),
        what="registration",
    )
    fleet.agent = agent
    return fleet


def _seen(node: Any) -> bool:
    node.refresh_from_db()
    return node.last_heartbeat_at is not None


def _task(task: Any, command: list[str]) -> Any:
    task.command = command
    task.save(update_fields=["command"])
    return task


def _state(task: Any, *states: str) -> bool:
    task.refresh_from_db()
    return task.state in states


def test_an_assigned_task_runs_on_its_gpu_and_succeeds_with_its_exit_code(node_a: Any) -> None:
    gpu = node_a.node.gpus.get(index=1)
    task = _task(node_a.task_a, ["sh", "-c", 'echo "on $CUDA_VISIBLE_DEVICES"'])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "succeeded", "failed"), what="the task to end")
    assert (task.state, task.exit_code) == ("succeeded", 0)
    assert node_a.agent.task_output(task.pk).strip() == f"on {gpu.uuid}"
    assert [e.to_state for e in task.events.order_by("id")][-2:] == ["running", "succeeded"]


def test_a_failing_command_fails_the_task_with_its_exit_code(node_a: Any) -> None:
    task = _task(node_a.task_a, ["sh", "-c", "exit 3"])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "succeeded", "failed"), what="the task to end")
    assert (task.state, task.exit_code) == ("failed", 3)


def test_the_mig_layout_is_applied_and_a_task_runs_on_its_mig_instance(node_a: Any) -> None:
    from apps.fleet.models import GpuPartition

    gpu = node_a.node.gpus.get(index=0)
    part = wait_for(lambda: GpuPartition.objects.filter(gpu=gpu, state="ok").first(), what="the MIG layout")
    assert [(i["profile"], i["start"]) for i in part.instances] == [("3g.40gb", 0)]
    mig_uuid = part.instances[0]["mig_uuid"]
    task = _task(node_a.task_a, ["sh", "-c", 'echo "on $CUDA_VISIBLE_DEVICES"'])
    assign(task, node_a.node, [node_a.mig_unit])
    wait_for(lambda: _state(task, "succeeded", "failed"), what="the task to end")
    assert task.state == "succeeded"
    assert mig_uuid.startswith("MIG-")
    assert node_a.agent.task_output(task.pk).strip() == f"on {mig_uuid}"


def test_cancel_while_running_stops_the_process_and_the_task_ends_cancelled(node_a: Any) -> None:
    from apps.fleet.models import TaskRun
    from apps.workloads.services import task_cancel

    task = _task(node_a.task_a, ["sleep", "60"])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "running"), what="the task to run")
    pid = wait_for(lambda: node_a.agent.task_pid(task.pk), what="its pid")
    task_cancel(task=task, by=node_a.alice)
    run = wait_for(lambda: TaskRun.objects.filter(task=task, state="stopped").first(), what="the stop report")
    assert "stopped by the plane" in run.reason
    assert not alive(pid)
    task.refresh_from_db()
    assert task.state == "cancelled"


def test_a_node_killed_mid_run_is_lost_its_task_requeued_and_its_orphan_stopped_on_return(
    node_a: Any, settings: Any
) -> None:
    from apps.fleet.models import TaskRun
    from apps.fleet.nodes import nodes_mark_lost

    task = _task(node_a.task_a, ["sleep", "60"])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "running"), what="the task to run")
    pid = wait_for(lambda: node_a.agent.task_pid(task.pk), what="its pid")
    node_a.agent.kill()
    # Three missed heartbeats of 0.5 s: lost after 1.5 s of silence.
    settings.WHALEGEN_AGENT_HEARTBEAT_S = 0.5
    wait_for(lambda: node_a.node.pk in nodes_mark_lost(), timeout_s=10, what="the node to be marked lost")
    task.refresh_from_db()
    assert (task.state, task.attempts) == ("pending", 1)
    assert alive(pid), "a dead agent does not kill its tasks"
    node_a.agent.start()
    wait_for(lambda: TaskRun.objects.filter(task=task, state="stopped").exists(), what="the orphan stopped")
    assert not alive(pid)
    node_a.node.refresh_from_db()
    assert node_a.node.state == "ready"
    task.refresh_from_db()
    assert task.state == "pending"
    # Handed back to the same node, the task is a new run there (id `<task>.1`) and finishes.
    task = _task(task, ["sh", "-c", "exit 0"])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "succeeded", "failed"), what="the second attempt to end")
    assert (task.state, task.attempts) == ("succeeded", 1)


def test_a_restarted_agent_re_adopts_its_running_task(node_a: Any) -> None:
    from apps.fleet.models import AgentReport

    task = _task(node_a.task_a, ["sh", "-c", "sleep 3; exit 0"])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "running"), what="the task to run")
    pid = wait_for(lambda: node_a.agent.task_pid(task.pk), what="its pid")
    node_a.agent.stop()
    assert alive(pid)
    node_a.agent.start()
    wait_for(lambda: _state(task, "succeeded", "failed", "pending"), timeout_s=20, what="the task to end")
    assert (task.state, task.exit_code, task.attempts) == ("succeeded", 0, 0)
    said = [t for r in AgentReport.objects.filter(node=node_a.node) for t in r.payload["tasks"]]
    assert any(t["state"] == "running" and "re-adopted" in t["reason"] for t in said)


def test_a_preempted_task_is_stopped_on_the_agent_and_waits_in_pending(node_a: Any) -> None:
    from apps.fleet.models import TaskRun
    from apps.workloads.services import task_transition

    task = _task(node_a.task_a, ["sleep", "60"])
    assign(task, node_a.node, [node_a.whole_unit])
    wait_for(lambda: _state(task, "running"), what="the task to run")
    pid = wait_for(lambda: node_a.agent.task_pid(task.pk), what="its pid")
    # What a cycle's priority preemption commits: running → preempted → pending, units released.
    task = task_transition(task=task, to_state="preempted", actor="scheduler", reason="priority preemption")
    task_transition(task=task, to_state="pending", actor="scheduler", reason="requeued after preemption")
    wait_for(lambda: TaskRun.objects.filter(task=task, state="stopped").exists(), what="the stop report")
    assert not alive(pid)
    task.refresh_from_db()
    assert (task.state, task.attempts) == ("pending", 1)


def test_xid_79_on_a_live_node_marks_its_gpu_unhealthy(node_a: Any) -> None:
    gpu = node_a.node.gpus.get(index=1)
    node_a.agent.sim_command(op="inject_xid", gpu=1, xid=79)
    wait_for(lambda: node_a.node.gpus.get(index=1).health == "unhealthy", what="the GPU marked unhealthy")
    assert gpu.events.filter(fatal=True).exists()
    assert node_a.node.gpus.get(index=0).health == "healthy"
