"""Protocol 1.1 on the plane: every GPU of a task in its spec, runs named by (task, attempt), legacy 1.0
agents, and runs an agent dropped without a report (listed no more in its heartbeats)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.fleet.conftest import assign
from whalegen import protocol as p

pytestmark = pytest.mark.django_db


def register(client: Any, version: str = p.PROTOCOL_VERSION) -> None:
    body = p.Register(node_name="gpu-001", hostname="host-a", agent_version="0.1", protocol_version=version)
    assert client.post(p.REGISTER_PATH, body.to_dict(), format="json").status_code == 200


def beat(client: Any, node: Any, running: tuple[p.RunningTask, ...] | None, version: str = "1.1") -> None:
    body = p.Heartbeat(
        node_id=str(node.pk),
        agent_version="0.1",
        sent_at_s=time.time(),
        protocol_version=version,
        running=running,
    )
    assert client.post(p.HEARTBEAT_PATH, body.to_dict(), format="json").status_code == 200


def report(client: Any, node: Any, seq: int, *tasks: p.TaskReport) -> None:
    body = p.Report(node_id=str(node.pk), seq=seq, sent_at_s=time.time(), tasks=tasks)
    assert client.post(p.REPORT_PATH, body.to_dict(), format="json").status_code == 200


def tasks(client: Any) -> tuple[p.TaskSpec, ...]:
    return p.DesiredState.from_dict(client.get(p.DESIRED_STATE_PATH).json()).tasks


def test_a_multi_gpu_task_names_every_gpu_in_order(fleet: Any, agent_client: Any) -> None:
    from apps.inventory.models import Gpu
    from apps.inventory.services import gpu_add

    gpu_add(node=fleet.node, index=2, model="H100-80GB")
    second = Gpu.objects.get(node=fleet.node, index=2)
    client = agent_client(fleet.token_a)
    register(client)
    # Units handed over out of GPU order: the spec lists GPUs by index, the first is device 0.
    assign(fleet.task_a, fleet.node, [second.units.get(), fleet.whole_unit])
    (spec,) = tasks(client)
    first_uuid = fleet.whole_unit.gpu.uuid
    assert spec.gpu_uuids == (first_uuid, second.uuid)
    assert spec.gpu_uuid == first_uuid and spec.devices == spec.gpu_uuids
    assert (spec.task_id, spec.attempt) == (str(fleet.task_a.pk), 0)
    assert spec.env["WHALEGEN_GPU_UUIDS"] == f"{first_uuid},{second.uuid}"


def test_a_protocol_1_0_agent_gets_the_attempt_in_the_task_id(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.nodes import nodes_mark_lost

    client = agent_client(fleet.token_a)
    register(client, version="1.0")
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(client, fleet.node, 1, p.TaskReport(str(fleet.task_a.pk), p.TaskState.RUNNING, time.time(), pid=3))
    nodes_mark_lost(now=timezone.now() + timedelta(seconds=60))
    beat(client, fleet.node, None, version="1.0")
    fleet.task_a.refresh_from_db()
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    first = str(fleet.task_a.pk)
    report(client, fleet.node, 2, p.TaskReport(first, p.TaskState.STOPPED, time.time(), signal=15))
    (spec,) = tasks(client)
    assert (spec.task_id, spec.attempt, spec.desired) == (f"{first}.1", 0, p.DesiredTaskState.RUN)
    report(client, fleet.node, 3, p.TaskReport(f"{first}.1", p.TaskState.RUNNING, time.time(), pid=4))
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("running", 1)


def test_a_run_the_agent_dropped_without_a_report_is_lost_and_requeued_after_the_grace(
    fleet: Any, agent_client: Any, settings: Any
) -> None:
    from apps.fleet.heartbeat import agent_heartbeat
    from apps.fleet.models import TaskRun

    settings.WHALEGEN_NODE_LOST_HEARTBEATS = 3
    settings.WHALEGEN_AGENT_HEARTBEAT_S = 10
    client = agent_client(fleet.token_a)
    register(client)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    task_id = str(fleet.task_a.pk)
    report(client, fleet.node, 1, p.TaskReport(task_id, p.TaskState.RUNNING, time.time(), pid=3))
    listed = (p.RunningTask(task_id, 0, 3),)
    t0 = timezone.now()

    def heartbeat(after_s: float, running: tuple[p.RunningTask, ...] | None) -> None:
        message = p.Heartbeat(str(fleet.node.pk), "0.1", time.time(), running=running)
        agent_heartbeat(node=fleet.node, message=message, now=t0 + timedelta(seconds=after_s))
        fleet.task_a.refresh_from_db()

    # 1. Listed: nothing happens. Missing once, then listed again: the stamp clears.
    heartbeat(0, listed)
    heartbeat(10, ())
    assert TaskRun.objects.get(task=fleet.task_a).missing_since is not None
    heartbeat(20, listed)
    heartbeat(60, ())  # missing again from t0+60
    assert fleet.task_a.state == "running"
    # 2. Still within the grace (3 × 10 s) of the new stamp: kept.
    heartbeat(85, ())
    assert fleet.task_a.state == "running"
    # 3. Past it: the run is lost, the task requeued with the reason and the attempt counted.
    heartbeat(91, ())
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    assert "never reported how it ended" in fleet.task_a.why_pending
    run = TaskRun.objects.get(task=fleet.task_a)
    assert run.state == "lost" and "stopped listing it 31 s ago" in run.reason
    # 4. Nothing left to stop on the node: the lost run is not listed as `stop`.
    assert tasks(client) == ()


def test_a_heartbeat_without_a_running_list_never_declares_runs_lost(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.heartbeat import agent_heartbeat
    from apps.fleet.models import TaskRun

    client = agent_client(fleet.token_a)
    register(client, version="1.0")
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(client, fleet.node, 1, p.TaskReport(str(fleet.task_a.pk), p.TaskState.RUNNING, time.time(), pid=3))
    t0 = timezone.now()
    for after_s in (0, 60, 600):
        message = p.Heartbeat(str(fleet.node.pk), "0.1", time.time(), protocol_version="1.0")
        agent_heartbeat(node=fleet.node, message=message, now=t0 + timedelta(seconds=after_s))
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "running"
    assert TaskRun.objects.get(task=fleet.task_a).missing_since is None


def test_a_report_of_the_run_clears_its_missing_stamp(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.heartbeat import agent_heartbeat
    from apps.fleet.models import TaskRun

    client = agent_client(fleet.token_a)
    register(client)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    task_id = str(fleet.task_a.pk)
    report(client, fleet.node, 1, p.TaskReport(task_id, p.TaskState.RUNNING, time.time(), pid=3))
    agent_heartbeat(node=fleet.node, message=p.Heartbeat(str(fleet.node.pk), "0.1", time.time(), running=()))
    assert TaskRun.objects.get(task=fleet.task_a).missing_since is not None
    report(client, fleet.node, 2, p.TaskReport(task_id, p.TaskState.RUNNING, time.time(), pid=3))
    assert TaskRun.objects.get(task=fleet.task_a).missing_since is None
