"""Protocol 1.1 on the agent: every GPU of a multi-GPU task visible, runs named by (task, attempt),
heartbeats listing the runs, and an outbox that drops reports the plane refuses for good."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agents.agent import Agent, AgentConfig
from agents.client import PlaneRejected
from tests.agents.conftest import TOKEN
from tests.agents.test_agent_process import final, gpu_uuids, spec
from whalegen.protocol import (
    ComputeUnit,
    DesiredState,
    HeartbeatAck,
    Registered,
    Report,
    ReportAck,
    TaskReport,
    TaskSpec,
    TaskState,
    UnitKind,
)

SHOW_DEVICES = ("sh", "-c", 'echo "devices=$CUDA_VISIBLE_DEVICES"; sleep 1.5')


@pytest.mark.e2e
def test_a_multi_gpu_task_sees_all_its_gpus_in_order_and_heartbeats_list_it(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "l40s"}, {"sku": "l40s"}, {"sku": "l40s"}))
    agent.start()
    g0, _g1, g2 = gpu_uuids(plane, 3)
    task = TaskSpec("wide", SHOW_DEVICES, g2, ComputeUnit(UnitKind.WHOLE), gpu_uuids=(g2, g0))
    plane.set_desired(TOKEN, DesiredState(1, tasks=(task,)))
    started = plane.wait_for(lambda: plane.task_reports("wide"), what="the task to start")[0]
    listed = plane.wait_for(
        lambda: next((h.running for h in reversed(plane.heartbeats) if h.running), None),
        what="a heartbeat listing the run",
    )
    assert [(r.task_id, r.attempt, r.pid) for r in listed] == [("wide", 0, started.pid)]
    assert final(plane, "wide").state is TaskState.SUCCEEDED
    assert agent.task_file("wide", "stdout.log") == f"devices={g2},{g0}\n"  # the middle GPU is not the task's
    # Once it ended, heartbeats list nothing.
    count = len(plane.heartbeats)
    assert plane.wait_for(lambda: plane.heartbeats[count:], what="a later heartbeat")[-1].running == ()


@pytest.mark.e2e
def test_a_new_attempt_of_an_ended_task_is_a_new_run(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "l40s"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    command = ("sh", "-c", 'echo "attempt $WHALEGEN_ATTEMPT"; exit 4')

    def run(generation: int, attempt: int) -> None:
        env = {"WHALEGEN_ATTEMPT": str(attempt)}
        task = TaskSpec("t", command, gpu, ComputeUnit(UnitKind.WHOLE), env=env, attempt=attempt)
        plane.set_desired(TOKEN, DesiredState(generation, tasks=(task,)))

    def ends(attempt: int) -> list[TaskReport]:
        return [r for r in plane.task_reports("t") if r.attempt == attempt and r.state is TaskState.FAILED]

    run(1, 0)
    plane.wait_for(lambda: ends(0), what="attempt 0 to end")
    run(2, 1)  # the plane requeued it and handed it back to this node: same task id, next attempt
    plane.wait_for(lambda: ends(1), what="attempt 1 to end")
    run(3, 1)  # a new generation still listing the ended attempt does not rerun it
    time.sleep(1.5)
    starts = [(r.attempt, r.state) for r in plane.task_reports("t") if r.state is TaskState.RUNNING]
    assert starts == [(0, TaskState.RUNNING), (1, TaskState.RUNNING)]
    assert ends(1)[0].exit_code == 4
    assert agent.task_file("t", "stdout.log") == "attempt 0\n"
    assert agent.task_file("t_1", "stdout.log") == "attempt 1\n"  # its own task directory


class RefusingClient:
    """Answers each report with the next status in `statuses` (200 once they run out)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.delivered: list[int] = []

    def report(self, report: Report) -> ReportAck:
        status = self.statuses.pop(0) if self.statuses else 200
        if status != 200:
            raise PlaneRejected(status, "refused")
        self.delivered.append(report.seq)
        return ReportAck(report.seq)


def outbox_agent(tmp_path: Path, statuses: list[int]) -> tuple[Agent, RefusingClient]:
    agent = Agent(AgentConfig(server="http://127.0.0.1:9", token="t", state_dir=tmp_path), backend=None)  # type: ignore[arg-type]
    agent.node_id = "node-a"
    client = RefusingClient(statuses)
    agent.client = client  # type: ignore[assignment]
    for seq in (1, 2):
        agent.outbox.put(
            seq, Report("node-a", seq, 1.0, (TaskReport("x", TaskState.RUNNING, 1.0),)).to_dict()
        )
    return agent, client


@pytest.mark.parametrize("status", [403, 404, 409, 400])
def test_a_report_refused_for_good_is_dropped_and_the_next_one_sent(tmp_path: Path, status: int) -> None:
    agent, client = outbox_agent(tmp_path, [status])
    agent._flush_reports(100.0)
    assert client.delivered == [2]
    assert list(agent.outbox.pending()) == []


@pytest.mark.parametrize("status", [408, 429, 401])
def test_a_report_refused_for_now_stays_first_in_the_outbox(tmp_path: Path, status: int) -> None:
    agent, client = outbox_agent(tmp_path, [status])
    agent._flush_reports(100.0)
    assert client.delivered == []
    assert [seq for seq, _ in agent.outbox.pending()] == [1, 2]
    agent._flush_reports(200.0)
    assert client.delivered == [1, 2]


class RestartedPlaneClient(RefusingClient):
    """A plane that already holds reports 1..7 of this node (from the agent's life before its state
    directory was wiped) and treats a known seq as a repeat."""

    def __init__(self) -> None:
        super().__init__([])
        self.stored = set(range(1, 8))

    def register(self, message: object) -> Registered:
        return Registered("node-a", stored_seq=max(self.stored))

    def report(self, report: Report) -> ReportAck:
        if report.seq not in self.stored:  # a repeat is acknowledged and dropped
            self.stored.add(report.seq)
            self.delivered.append(report.seq)
        return ReportAck(max(self.stored))


def test_an_agent_that_lost_its_state_numbers_its_reports_above_the_planes(tmp_path: Path) -> None:
    agent, _ = outbox_agent(tmp_path, [])  # seq 1 and 2 queued before it registered
    client = RestartedPlaneClient()
    agent.client = client  # type: ignore[assignment]
    agent.seq = agent.outbox.last_seq()
    agent._register(0.0)
    assert [seq for seq, data in agent.outbox.pending()] == [8, 9]
    assert [data["seq"] for _, data in agent.outbox.pending()] == [8, 9]
    agent._flush_reports(1.0)
    assert client.delivered == [8, 9]  # both applied, neither taken for a repeat
    agent.pending_tasks.append(TaskReport("x", TaskState.SUCCEEDED, 2.0, exit_code=0))
    agent._queue_reports(2.0)
    agent._flush_reports(2.0)
    assert client.delivered == [8, 9, 10]


def test_an_agent_with_its_state_keeps_its_numbering_on_registration(tmp_path: Path) -> None:
    agent, _ = outbox_agent(tmp_path, [])
    client = RestartedPlaneClient()
    client.stored = {1}  # report 1 was stored, its ack lost; 2 was never sent
    agent.client = client  # type: ignore[assignment]
    agent.seq = agent.outbox.last_seq()
    agent._register(0.0)
    assert [seq for seq, _ in agent.outbox.pending()] == [1, 2]
    agent._flush_reports(1.0)
    assert client.delivered == [2]  # 1 was a repeat


class ReachableAgainClient(RefusingClient):
    """The plane after an outage: heartbeats and reports both answered."""

    def __init__(self) -> None:
        super().__init__([])
        self.heartbeats = 0

    def heartbeat(self, message: object) -> HeartbeatAck:
        self.heartbeats += 1
        return HeartbeatAck(generation=0)


class NoGpus:
    def inventory(self) -> list[object]:
        return []


def test_a_heartbeat_answered_after_an_outage_sends_the_held_reports_in_the_same_pass(tmp_path: Path) -> None:
    # During the outage the reports' own back-off grew (here to 30 s); the first heartbeat that gets
    # through no longer lists the runs that ended, so their ends must follow at once, not 30 s later.
    agent, _ = outbox_agent(tmp_path, [])
    agent.backend = NoGpus()  # type: ignore[assignment]
    client = ReachableAgainClient()
    agent.client = client  # type: ignore[assignment]
    for _ in range(8):
        agent._backoff["report"].failed(100.0)
    assert not agent._backoff["report"].ready(101.0)
    agent._heartbeat(101.0)
    assert client.heartbeats == 1 and agent._backoff["report"].ready(101.0)
    agent._flush_reports(101.0)
    assert client.delivered == [1, 2]
