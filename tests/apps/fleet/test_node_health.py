"""Node health: silent nodes are lost and their tasks requeued; a returning agent is told to stop its
orphans; operators cordon, uncordon and drain."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.fleet.conftest import assign
from whalegen import protocol as p

pytestmark = pytest.mark.django_db


def beat(client: Any, node: Any) -> Any:
    body = p.Heartbeat(node_id=str(node.pk), agent_version="0.1", sent_at_s=time.time())
    return client.post(p.HEARTBEAT_PATH, body.to_dict(), format="json")


def test_a_node_silent_for_three_heartbeats_is_lost_and_its_task_requeued(
    fleet: Any, agent_client: Any
) -> None:
    from apps.fleet.heartbeat import agent_heartbeat
    from apps.fleet.nodes import nodes_mark_lost
    from apps.scheduling.models import Assignment

    client = agent_client(fleet.token_a)
    assert beat(client, fleet.node).status_code == 200
    assignment = assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    now = timezone.now()
    # Node B keeps heartbeating: the plane hears its fleet, so node A's silence is node A's.
    for after_s in (0, 10, 20, 30):
        message = p.Heartbeat(
            node_id=str(fleet.node_b.pk), agent_version="0.1", sent_at_s=now.timestamp() + after_s
        )
        agent_heartbeat(node=fleet.node_b, message=message, now=now + timedelta(seconds=after_s))
    assert nodes_mark_lost(now=now + timedelta(seconds=29)) == []  # 3 × 10 s not yet over
    assert nodes_mark_lost(now=now + timedelta(seconds=31)) == [fleet.node.pk]
    fleet.node.refresh_from_db()
    fleet.task_a.refresh_from_db()
    assignment.refresh_from_db()
    assert fleet.node.state == "lost"
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    assert "no heartbeat" in assignment.release_reason
    assert not Assignment.objects.filter(task=fleet.task_a, released_at__isnull=True).exists()


def test_a_returning_agent_is_ready_again_and_told_to_stop_its_orphan(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.nodes import nodes_mark_lost

    client = agent_client(fleet.token_a)
    beat(client, fleet.node)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    running = p.TaskReport(task_id=str(fleet.task_a.pk), state=p.TaskState.RUNNING, at_s=time.time(), pid=3)
    body = p.Report(node_id=str(fleet.node.pk), seq=1, sent_at_s=time.time(), tasks=(running,))
    client.post(p.REPORT_PATH, body.to_dict(), format="json")
    nodes_mark_lost(now=timezone.now() + timedelta(seconds=60))
    assert beat(client, fleet.node).status_code == 200
    fleet.node.refresh_from_db()
    assert fleet.node.state == "ready"
    state = p.DesiredState.from_dict(client.get(p.DESIRED_STATE_PATH).json())
    assert [(t.task_id, t.desired) for t in state.tasks] == [(str(fleet.task_a.pk), p.DesiredTaskState.STOP)]


def test_the_beat_task_checks_node_health(fleet: Any) -> None:
    from apps.fleet.tasks import nodes_check_health
    from apps.inventory.models import Node

    Node.objects.filter(pk=fleet.node.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    Node.objects.filter(pk=fleet.node_b.pk).update(last_heartbeat_at=timezone.now())
    assert nodes_check_health.apply().get() == {"lost": [fleet.node.pk], "drained": []}


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain"])
def test_only_platform_admins_act_on_nodes(fleet: Any, api: Any, action: str) -> None:
    url = f"/api/v1/nodes/{fleet.node.pk}/{action}/"
    assert api(fleet.ada).post(url).status_code == 403
    assert api(fleet.alice).post(url).status_code == 403
    assert api().post(url).status_code in (401, 403)
    assert api(fleet.root).post(url).status_code == 200


def test_cordon_and_uncordon(fleet: Any, api: Any) -> None:
    root = api(fleet.root)
    assert root.post(f"/api/v1/nodes/{fleet.node.pk}/cordon/").json()["state"] == "cordoned"
    assert root.post(f"/api/v1/nodes/{fleet.node.pk}/uncordon/").json()["state"] == "ready"


def test_drain_requeues_preemptible_tasks_and_waits_for_the_others(
    fleet: Any, api: Any, agent_client: Any
) -> None:
    from apps.workloads.models import Task

    Task.objects.filter(pk=fleet.task_b.pk).update(preemptible=False)
    fleet.task_b.refresh_from_db()
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    assign(fleet.task_b, fleet.node, [fleet.mig_unit])
    answer = api(fleet.root).post(f"/api/v1/nodes/{fleet.node.pk}/drain/")
    assert answer.json()["state"] == "draining"
    fleet.task_a.refresh_from_db()
    fleet.task_b.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    assert fleet.task_b.state == "assigned"
    done = p.TaskReport(
        task_id=str(fleet.task_b.pk), state=p.TaskState.SUCCEEDED, at_s=time.time(), exit_code=0
    )
    body = p.Report(node_id=str(fleet.node.pk), seq=1, sent_at_s=time.time(), tasks=(done,))
    agent_client(fleet.token_a).post(p.REPORT_PATH, body.to_dict(), format="json")
    from apps.fleet.nodes import drains_complete

    assert drains_complete() == [fleet.node.pk]
    fleet.node.refresh_from_db()
    assert fleet.node.state == "cordoned"


def test_a_requeued_task_handed_back_to_the_same_node_is_a_new_run_after_the_old_one_stops(
    fleet: Any, agent_client: Any
) -> None:
    from apps.fleet.nodes import nodes_mark_lost

    client = agent_client(fleet.token_a)
    beat(client, fleet.node)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    running = p.TaskReport(task_id=str(fleet.task_a.pk), state=p.TaskState.RUNNING, at_s=time.time(), pid=3)
    client.post(
        p.REPORT_PATH, p.Report(str(fleet.node.pk), 1, time.time(), (running,)).to_dict(), format="json"
    )
    nodes_mark_lost(now=timezone.now() + timedelta(seconds=60))
    beat(client, fleet.node)
    fleet.task_a.refresh_from_db()
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])  # the cycle picks the same node and unit

    def listed() -> list[tuple[str, int, str]]:
        state = p.DesiredState.from_dict(client.get(p.DESIRED_STATE_PATH).json())
        return [(t.task_id, t.attempt, t.desired.value) for t in state.tasks]

    first = str(fleet.task_a.pk)
    assert listed() == [(first, 0, "stop")]  # the old process holds the unit: the new run waits
    stopped = p.TaskReport(task_id=first, state=p.TaskState.STOPPED, at_s=time.time(), signal=15)
    client.post(
        p.REPORT_PATH, p.Report(str(fleet.node.pk), 2, time.time(), (stopped,)).to_dict(), format="json"
    )
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "assigned"  # the old run's end does not touch the new attempt
    assert listed() == [(first, 1, "run")]  # same task id, the attempt in its own field
    started = p.TaskReport(task_id=first, state=p.TaskState.RUNNING, at_s=time.time(), pid=4, attempt=1)
    client.post(
        p.REPORT_PATH, p.Report(str(fleet.node.pk), 3, time.time(), (started,)).to_dict(), format="json"
    )
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("running", 1)


@pytest.mark.parametrize(("before", "after"), [("cordoned", "cordoned"), ("draining", "cordoned")])
def test_a_node_an_operator_took_out_stays_out_when_it_returns_from_lost(
    fleet: Any, agent_client: Any, before: str, after: str
) -> None:
    """Cordoned for a repair, the node reboots (silent long enough to be lost) and its agent comes back:
    it must not become `ready` and take new work behind the operator's back. A drain is done by then
    (its tasks were requeued when it was lost), so it comes back cordoned."""
    from apps.fleet.nodes import node_cordon, node_drain, nodes_mark_lost

    client = agent_client(fleet.token_a)
    beat(client, fleet.node)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    if before == "cordoned":
        node_cordon(node=fleet.node, actor="user:ops")
    else:
        fleet.task_a.preemptible = False  # keeps the node draining
        fleet.task_a.save(update_fields=["preemptible"])
        node_drain(node=fleet.node, actor="user:ops")
    fleet.node.refresh_from_db()
    assert fleet.node.state == before
    assert fleet.node.pk in nodes_mark_lost(now=timezone.now() + timedelta(seconds=60))
    assert beat(client, fleet.node).status_code == 200
    fleet.node.refresh_from_db()
    assert fleet.node.state == after


def test_a_ready_node_returns_from_lost_ready(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.nodes import node_cordon, node_uncordon, nodes_mark_lost

    client = agent_client(fleet.token_a)
    beat(client, fleet.node)
    node_cordon(node=fleet.node, actor="user:ops")
    node_uncordon(node=fleet.node, actor="user:ops")  # an earlier cordon, already lifted, counts for nothing
    nodes_mark_lost(now=timezone.now() + timedelta(seconds=60))
    beat(client, fleet.node)
    fleet.node.refresh_from_db()
    assert fleet.node.state == "ready"
