"""The agent endpoints as a node agent meets them: credentials per node, the protocol version, the
long-polled desired state, and reports that move tasks through the state machine."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.apps.factories import holder_of
from tests.apps.fleet.conftest import assign
from whalegen import protocol as p

pytestmark = pytest.mark.django_db

REGISTER = p.REGISTER_PATH
HEARTBEAT = p.HEARTBEAT_PATH
DESIRED = p.DESIRED_STATE_PATH
REPORTS = p.REPORT_PATH


def register(client: Any, version: str = p.PROTOCOL_VERSION) -> Any:
    body = p.Register(node_name="gpu-001", hostname="host-a", agent_version="0.1", protocol_version=version)
    return client.post(REGISTER, body.to_dict(), format="json")


def report(client: Any, node: Any, seq: int, *tasks: p.TaskReport, parts: tuple = ()) -> Any:
    body = p.Report(node_id=str(node.pk), seq=seq, sent_at_s=time.time(), tasks=tasks, partitions=parts)
    return client.post(REPORTS, body.to_dict(), format="json")


def task_report(task: Any, state: p.TaskState, **fields: Any) -> p.TaskReport:
    return p.TaskReport(task_id=str(task.pk), state=state, at_s=time.time(), **fields)


def desired(client: Any, generation: int = 0, wait_s: float = 0) -> Any:
    return client.get(DESIRED, {"generation": generation, "wait_s": wait_s})


# ---- who may speak ---------------------------------------------------------------------------------


def test_register_answers_the_token_owners_node_and_the_pace(fleet: Any, agent_client: Any) -> None:
    answer = register(agent_client(fleet.token_a))
    assert answer.status_code == 200
    registered = p.Registered.from_dict(answer.json())
    assert registered.node_id == str(fleet.node.pk)
    assert registered.heartbeat_interval_s == 10.0
    fleet.node.refresh_from_db()
    assert fleet.node.last_heartbeat_at is not None


@pytest.mark.parametrize(
    "who",
    ["no token", "unknown token", "a user's API token"],
    ids=["without a token", "with an unknown token", "with a user API token"],
)
def test_agent_endpoints_refuse_anyone_but_a_node(fleet: Any, agent_client: Any, who: str) -> None:
    from apps.tenants.services import token_create

    token = {
        "no token": None,
        "unknown token": "wgn_not-a-node",
        "a user's API token": token_create(user=fleet.alice, tenant=fleet.tenant_a, name="ci")[1],
    }[who]
    client = agent_client(token)
    assert register(client).status_code == 401
    assert desired(client).status_code == 401
    assert report(client, fleet.node, 1).status_code == 401


def test_a_node_token_is_nothing_on_the_user_api(fleet: Any, agent_client: Any) -> None:
    assert agent_client(fleet.token_a).get("/api/v1/tasks/").status_code == 401


def test_an_agent_of_another_major_protocol_version_is_refused(fleet: Any, agent_client: Any) -> None:
    answer = register(agent_client(fleet.token_a), version="2.0")
    assert answer.status_code == 409
    assert "major" in answer.json()["detail"]


def test_a_node_cannot_heartbeat_or_report_as_another(fleet: Any, agent_client: Any) -> None:
    client = agent_client(fleet.token_b)
    beat = p.Heartbeat(node_id=str(fleet.node.pk), agent_version="0.1", sent_at_s=time.time())
    assert client.post(HEARTBEAT, beat.to_dict(), format="json").status_code == 403
    assert report(client, fleet.node, 1).status_code == 403


def test_a_node_cannot_report_on_another_nodes_task(fleet: Any, agent_client: Any) -> None:
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    answer = report(
        agent_client(fleet.token_b),
        fleet.node_b,
        1,
        task_report(fleet.task_a, p.TaskState.SUCCEEDED, exit_code=0),
    )
    assert answer.status_code == 403
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "assigned"


def test_a_node_does_not_see_another_nodes_tasks(fleet: Any, agent_client: Any) -> None:
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    mine = p.DesiredState.from_dict(desired(agent_client(fleet.token_a)).json())
    theirs = p.DesiredState.from_dict(desired(agent_client(fleet.token_b)).json())
    assert [t.task_id for t in mine.tasks] == [str(fleet.task_a.pk)]
    assert theirs.tasks == ()


def test_issuing_a_new_node_token_retires_the_old_one(fleet: Any, agent_client: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("issue_node_token", f"eu-1/{fleet.node.name}", stdout=out)
    new = out.getvalue().strip()
    assert register(agent_client(fleet.token_a)).status_code == 401
    assert register(agent_client(new)).status_code == 200


# ---- heartbeat ---------------------------------------------------------------------------------------


def _inventory(node: Any, **lost: bool) -> tuple[p.GpuInventory, ...]:
    return tuple(
        p.GpuInventory(
            index=gpu.index,
            uuid=f"GPU-real-{gpu.index}",
            name="NVIDIA H100 80GB HBM3",
            model="H100-80GB",
            mem_mib=81559,
            pci_bus_id=f"0000:{gpu.index}",
            mig_capable=True,
            lost=lost.get(f"gpu{gpu.index}", False),
        )
        for gpu in node.gpus.all()
    )


def test_heartbeat_adopts_the_agents_gpu_uuids_and_stores_telemetry(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.models import GpuSample

    sample = p.TelemetrySample(
        gpu_uuid="GPU-real-1", at_s=time.time(), mem_used_mib=1000, mem_total_mib=81559, util_gpu_pct=40,
        util_mem_pct=10, power_w=300.0, power_limit_w=700.0, temperature_c=55, sm_clock_mhz=1980,
        mem_clock_mhz=2619, ecc_uncorrected_aggregate=0,
    )  # fmt: skip
    beat = p.Heartbeat(
        node_id=str(fleet.node.pk),
        agent_version="0.1",
        sent_at_s=time.time(),
        inventory=_inventory(fleet.node),
        telemetry=(sample,),
    )
    answer = agent_client(fleet.token_a).post(HEARTBEAT, beat.to_dict(), format="json")
    assert answer.status_code == 200
    assert p.HeartbeatAck.from_dict(answer.json()).generation >= 1
    assert sorted(fleet.node.gpus.values_list("uuid", flat=True)) == ["GPU-real-0", "GPU-real-1"]
    stored = GpuSample.objects.get()
    assert (stored.gpu.index, stored.util_gpu_pct, stored.power_w) == (1, 40, 300.0)


def test_telemetry_is_stored_once_per_sample_interval_whatever_the_heartbeat_rate(fleet: Any) -> None:
    """Heartbeats every 10 s, telemetry kept every WHALEGEN_TELEMETRY_SAMPLE_S (30 s): the first
    heartbeat stores, the next two within 30 s do not, the one 30 s after the first stores again."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.fleet.heartbeat import agent_heartbeat
    from apps.fleet.models import GpuSample

    start = timezone.now()
    for offset_s in (0, 10, 20, 30):
        at = start + timedelta(seconds=offset_s)
        sample = p.TelemetrySample(
            gpu_uuid="GPU-real-0", at_s=at.timestamp(), mem_used_mib=1000, mem_total_mib=81559,
            util_gpu_pct=offset_s, util_mem_pct=10, power_w=300.0, power_limit_w=700.0, temperature_c=55,
            sm_clock_mhz=1980, mem_clock_mhz=2619, ecc_uncorrected_aggregate=0,
        )  # fmt: skip
        beat = p.Heartbeat(
            node_id=str(fleet.node.pk),
            agent_version="0.1",
            sent_at_s=at.timestamp(),
            inventory=_inventory(fleet.node),
            telemetry=(sample,),
        )
        agent_heartbeat(node=fleet.node, message=beat, now=at)
    stored = sorted(GpuSample.objects.values_list("at", "util_gpu_pct"))
    assert stored == [(start, 0), (start + timedelta(seconds=30), 30)]


def test_xid_79_takes_the_gpu_out_of_placement(fleet: Any, agent_client: Any) -> None:
    client = agent_client(fleet.token_a)
    gpu = fleet.node.gpus.get(index=1)
    event = p.GpuEvent(gpu_uuid=gpu.uuid, kind="xid", at_s=time.time(), xid=79, fatal=True)
    beat = p.Heartbeat(
        node_id=str(fleet.node.pk), agent_version="0.1", sent_at_s=time.time(), events=(event,)
    )
    assert client.post(HEARTBEAT, beat.to_dict(), format="json").status_code == 200
    gpu.refresh_from_db()
    assert gpu.health == "unhealthy"
    assert gpu.events.get().xid == 79
    assert fleet.node.gpus.get(index=0).health == "healthy"


# ---- desired state -----------------------------------------------------------------------------------


def test_desired_state_carries_the_mig_layout_and_the_assigned_task(fleet: Any, agent_client: Any) -> None:
    fleet.task_a.command = ["python", "-c", "print(1)"]
    fleet.task_a.save(update_fields=["command"])
    assign(fleet.task_a, fleet.node, [fleet.mig_unit])
    state = p.DesiredState.from_dict(desired(agent_client(fleet.token_a)).json())
    mig_gpu = fleet.node.gpus.get(index=0)
    layouts = {layout.gpu_uuid: layout for layout in state.gpus}
    assert layouts[mig_gpu.uuid].mode is p.PartitionMode.MIG
    assert layouts[mig_gpu.uuid].instances == (p.MigInstanceSpec(profile="3g.40gb", start=0),)
    (spec,) = state.tasks
    assert spec.command == ("python", "-c", "print(1)")
    assert spec.unit == p.ComputeUnit(kind=p.UnitKind.MIG, mig_profile="3g.40gb", mig_start=0)
    assert spec.desired is p.DesiredTaskState.RUN and spec.gpu_uuid == mig_gpu.uuid


def test_the_long_poll_answers_204_when_nothing_changed(fleet: Any, agent_client: Any) -> None:
    client = agent_client(fleet.token_a)
    generation = desired(client).json()["generation"]
    started = time.monotonic()
    answer = desired(client, generation, wait_s=0.6)
    assert answer.status_code == 204
    assert time.monotonic() - started >= 0.5


def test_the_generation_rises_only_when_the_content_changes(fleet: Any, agent_client: Any) -> None:
    client = agent_client(fleet.token_a)
    first = desired(client).json()["generation"]
    assert desired(client).json()["generation"] == first
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    second = desired(client, first).json()
    assert second["generation"] == first + 1
    assert [t["task_id"] for t in second["tasks"]] == [str(fleet.task_a.pk)]


def test_a_cancelled_running_task_is_listed_as_stop_until_the_agent_says_it_ended(
    fleet: Any, agent_client: Any
) -> None:
    from apps.workloads.services import task_cancel

    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    assert (
        report(client, fleet.node, 1, task_report(fleet.task_a, p.TaskState.RUNNING, pid=42)).status_code
        == 200
    )
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "running"
    task_cancel(task=fleet.task_a, by=fleet.alice)
    (spec,) = p.DesiredState.from_dict(desired(client).json()).tasks
    assert spec.desired is p.DesiredTaskState.STOP
    report(
        client, fleet.node, 2, task_report(fleet.task_a, p.TaskState.STOPPED, reason="stopped by the plane")
    )
    assert p.DesiredState.from_dict(desired(client).json()).tasks == ()
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "cancelled"


def test_a_new_task_on_a_unit_still_held_by_a_stopping_task_waits(fleet: Any, agent_client: Any) -> None:
    from apps.workloads.services import task_cancel

    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(client, fleet.node, 1, task_report(fleet.task_a, p.TaskState.RUNNING, pid=42))
    fleet.task_a.refresh_from_db()
    task_cancel(task=fleet.task_a, by=fleet.alice)
    assign(fleet.task_b, fleet.node, [fleet.whole_unit])
    listed = {t.task_id: t.desired for t in p.DesiredState.from_dict(desired(client).json()).tasks}
    assert listed == {str(fleet.task_a.pk): p.DesiredTaskState.STOP}
    report(client, fleet.node, 2, task_report(fleet.task_a, p.TaskState.STOPPED))
    listed = {t.task_id: t.desired for t in p.DesiredState.from_dict(desired(client).json()).tasks}
    assert listed == {str(fleet.task_b.pk): p.DesiredTaskState.RUN}


# ---- reports -----------------------------------------------------------------------------------------


def test_reports_move_the_task_to_running_then_succeeded_with_its_exit_code(
    fleet: Any, agent_client: Any
) -> None:
    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(client, fleet.node, 1, task_report(fleet.task_a, p.TaskState.RUNNING, pid=7))
    answer = report(client, fleet.node, 2, task_report(fleet.task_a, p.TaskState.SUCCEEDED, exit_code=0))
    assert answer.json() == {"stored_seq": 2}
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.exit_code) == ("succeeded", 0)
    assert [e.actor for e in fleet.task_a.events.all()][-2:] == ["agent:gpu-001", "agent:gpu-001"]
    assert holder_of(fleet.whole_unit) is None


def test_a_resent_report_changes_nothing(fleet: Any, agent_client: Any) -> None:
    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    body = task_report(fleet.task_a, p.TaskState.FAILED, exit_code=3, reason="exit code 3")
    assert report(client, fleet.node, 5, body).status_code == 200
    events = fleet.task_a.events.count()
    assert report(client, fleet.node, 5, body).json() == {"stored_seq": 5}
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.exit_code) == ("failed", 3)
    assert fleet.task_a.events.count() == events


def test_a_task_the_agent_could_not_start_is_requeued_with_an_attempt_counted(
    fleet: Any, agent_client: Any
) -> None:
    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.mig_unit])
    report(
        client, fleet.node, 1, task_report(fleet.task_a, p.TaskState.REJECTED, reason="MIG instance missing")
    )
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    assert "MIG instance missing" in fleet.task_a.why_pending


def test_a_preempted_task_returns_to_pending_when_the_agent_stopped_it(fleet: Any, agent_client: Any) -> None:
    from apps.workloads.services import task_transition

    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(client, fleet.node, 1, task_report(fleet.task_a, p.TaskState.RUNNING, pid=9))
    fleet.task_a.refresh_from_db()
    task_transition(task=fleet.task_a, to_state="preempted", actor="scheduler", reason="priority preemption")
    (spec,) = p.DesiredState.from_dict(desired(client).json()).tasks
    assert spec.desired is p.DesiredTaskState.STOP
    report(client, fleet.node, 2, task_report(fleet.task_a, p.TaskState.STOPPED, signal=15))
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)


def test_a_lost_gpu_partition_report_marks_the_gpu_unhealthy(fleet: Any, agent_client: Any) -> None:
    gpu = fleet.node.gpus.get(index=0)
    part = p.PartitionReport(
        gpu_uuid=gpu.uuid, state=p.PartitionState.GPU_LOST, at_s=time.time(), generation=1
    )
    assert report(agent_client(fleet.token_a), fleet.node, 1, parts=(part,)).status_code == 200
    gpu.refresh_from_db()
    assert gpu.health == "unhealthy"
    assert gpu.partition.state == "gpu_lost"


def test_one_check_of_the_long_poll_costs_a_fixed_number_of_queries(
    fleet: Any, django_assert_num_queries: Any
) -> None:
    """Pinned: the poll re-checks every 0.25 s per waiting node, so its cost must not grow with tasks."""
    from apps.fleet.agents import desired_state_current
    from apps.workloads.services import TaskSubmission, task_submit

    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    more, _ = task_submit(
        tenant=fleet.tenant_a, request=TaskSubmission(queue="train"), submitted_by=fleet.alice
    )
    assign(more, fleet.node, [fleet.mig_unit])
    desired_state_current(node=fleet.node)
    with django_assert_num_queries(6):
        state = desired_state_current(node=fleet.node)
    assert len(state.tasks) == 2


def test_an_agent_that_lost_its_state_continues_numbering_above_what_the_plane_stored(
    fleet: Any, agent_client: Any
) -> None:
    """Reports are deduplicated by (node, seq). An agent whose state directory was wiped (a reimaged
    node, a replaced disk) restarts at seq 1: without knowing where the plane stands, its next reports
    would be acknowledged as repeats and dropped, leaving its tasks `assigned` forever."""
    client = agent_client(fleet.token_a)
    assert p.Registered.from_dict(register(client).json()).stored_seq == 0
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    for seq in (1, 2, 3):
        report(client, fleet.node, seq, task_report(fleet.task_a, p.TaskState.STARTING, pid=seq))
    # The agent comes back with nothing on disk: registration tells it where to continue.
    registered = p.Registered.from_dict(register(client).json())
    assert registered.stored_seq == 3
    ended = task_report(fleet.task_a, p.TaskState.SUCCEEDED, exit_code=0)
    assert report(client, fleet.node, registered.stored_seq + 1, ended).json()["stored_seq"] == 4
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "succeeded"


def test_a_late_running_report_does_not_revive_a_run_that_ended(fleet: Any, agent_client: Any) -> None:
    from apps.fleet.models import TaskRun

    client = agent_client(fleet.token_a)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(client, fleet.node, 2, task_report(fleet.task_a, p.TaskState.SUCCEEDED, exit_code=0))
    # The "running" report sent before it arrives last (a retry that was overtaken).
    assert (
        report(client, fleet.node, 1, task_report(fleet.task_a, p.TaskState.RUNNING, pid=7)).status_code
        == 200
    )
    run = TaskRun.objects.get(task=fleet.task_a)
    assert (run.state, run.exit_code) == ("succeeded", 0)
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "succeeded"


def test_an_older_layouts_partition_report_does_not_overwrite_a_newer_one(
    fleet: Any, agent_client: Any
) -> None:
    gpu = fleet.node.gpus.get(index=0)
    client = agent_client(fleet.token_a)

    def part(generation: int, state: p.PartitionState) -> p.PartitionReport:
        return p.PartitionReport(gpu_uuid=gpu.uuid, state=state, at_s=time.time(), generation=generation)

    report(client, fleet.node, 2, parts=(part(5, p.PartitionState.OK),))
    report(client, fleet.node, 1, parts=(part(4, p.PartitionState.BLOCKED),))
    gpu.partition.refresh_from_db()
    assert (gpu.partition.generation, gpu.partition.state) == (5, "ok")


def test_a_multi_gpu_tasks_running_event_names_every_gpu_it_holds(fleet: Any, agent_client: Any) -> None:
    """Before: the event named only the device the report carried, the first of the task's GPUs."""
    from apps.workloads.services import TaskSubmission, task_submit

    task, _ = task_submit(
        tenant=fleet.tenant_a, request=TaskSubmission(queue="train", gpu_count=2), submitted_by=fleet.alice
    )
    assign(task, fleet.node, [fleet.mig_unit, fleet.whole_unit])
    client = agent_client(fleet.token_a)
    running = task_report(task, p.TaskState.RUNNING, pid=42, device_uuid="GPU-first")
    assert report(client, fleet.node, 1, running).status_code == 200
    event = task.events.get(to_state="running")
    assert event.reason == "running (pid 42 on gpu-001 GPUs 0,1)"
