"""A run that finished before the plane requeued it keeps its result (issue 37, item 5).

Node A ran attempt 0 of task A and went silent; the plane declared it lost at `requeued_at` and requeued
the task (attempt 1). When A's agent comes back and reports attempt 0 `succeeded` (or `failed` with an
exit code) having finished before `requeued_at`, the task ends with that result, whatever attempt 1 has
reached: not placed yet (the rule of docs/fleet.md, "Late results"), assigned (withdrawn before it
starts) or running on node B (stopped: it is the duplicate). A run that finished after the requeue, or
that says nothing of when it finished, is only recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.factories import held_milli
from tests.apps.fleet.conftest import assign
from whalegen import protocol as p

pytestmark = pytest.mark.django_db

LOST_AFTER_S = 31  # past the test settings' loss threshold (3 × 10 s)


def heartbeat(node: Any, at: datetime, *, sent_at: datetime | None = None) -> None:
    from apps.fleet.heartbeat import agent_heartbeat

    sent = (sent_at or at).timestamp()
    agent_heartbeat(
        node=node, message=p.Heartbeat(node_id=str(node.pk), agent_version="0.1", sent_at_s=sent), now=at
    )


def report(node: Any, seq: int, *tasks: p.TaskReport) -> None:
    from apps.fleet.reports import agent_report

    agent_report(node=node, message=p.Report(node_id=str(node.pk), seq=seq, sent_at_s=0.0, tasks=tasks))


@dataclass
class Requeued:
    task: Any
    requeued_at: datetime  # the plane's clock


def requeued_from_a(fleet: Any, *, agent_ahead_s: float = 0.0) -> Requeued:
    """Task A ran on node A (attempt 0); node A was lost and the task requeued (attempt 1, pending).
    `agent_ahead_s`: how far node A's clock runs ahead of the plane's (learnt from its heartbeat)."""
    from apps.fleet.nodes import nodes_mark_lost

    now = timezone.now()
    heartbeat(fleet.node, now, sent_at=now + timedelta(seconds=agent_ahead_s))
    heartbeat(fleet.node_b, now + timedelta(seconds=LOST_AFTER_S - 1))
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(fleet.node, 1, p.TaskReport(str(fleet.task_a.pk), p.TaskState.RUNNING, 0.0, pid=7, attempt=0))
    assert nodes_mark_lost(now=now + timedelta(seconds=LOST_AFTER_S)) == [fleet.node.pk]
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    # The requeue's own moment (its transition's clock): when the assignment was released.
    requeued_at = fleet.task_a.assignments.get(node=fleet.node).released_at
    return Requeued(task=fleet.task_a, requeued_at=requeued_at)


def place_attempt_1_on_b(fleet: Any, task: Any, *, started: bool) -> None:
    """The cycle places attempt 1 on node B; `started`: B's agent has reported it running."""
    assign(task, fleet.node_b, [fleet.node_b.gpus.get().units.get()])
    if started:
        report(fleet.node_b, 1, p.TaskReport(str(task.pk), p.TaskState.RUNNING, 0.0, pid=9, attempt=1))
    task.refresh_from_db()
    assert task.state == ("running" if started else "assigned")


def ended(task: Any, outcome: str, *, at: datetime | None, exit_code: int | None = 0) -> p.TaskReport:
    """Attempt 0's end as node A's agent reports it, finished at `at` (None: the agent does not say)."""
    return p.TaskReport(
        str(task.pk),
        p.TaskState(outcome),
        timezone.now().timestamp(),
        exit_code=exit_code,
        finished_at_s=at.timestamp() if at is not None else None,
        attempt=0,
    )


def b_desired(fleet: Any, task: Any) -> p.DesiredTaskState | None:
    from apps.fleet.selectors import desired_state_build

    desired = desired_state_build(node=fleet.node_b, now=timezone.now())
    return {spec.attempt: spec.desired for spec in desired.tasks if spec.task_id == str(task.pk)}.get(1)


@pytest.mark.parametrize(
    ("attempt_1", "finished_s", "outcome", "exit_code", "want_state", "want_b"),
    [
        ("pending", -10, "succeeded", 0, "succeeded", None),
        ("pending", +10, "succeeded", 0, "succeeded", None),  # nothing took its place: stands whenever
        ("assigned", -10, "succeeded", 0, "succeeded", None),  # withdrawn before it started
        ("running", -10, "succeeded", 0, "succeeded", p.DesiredTaskState.STOP),  # the duplicate stops
        ("running", -10, "failed", 3, "failed", p.DesiredTaskState.STOP),
        ("assigned", +10, "succeeded", 0, "assigned", p.DesiredTaskState.RUN),  # ran past the requeue
        ("running", +10, "succeeded", 0, "running", p.DesiredTaskState.RUN),
        ("running", -10, "failed", None, "running", p.DesiredTaskState.RUN),  # no exit code: no result
    ],
    ids=[
        "finished before the requeue, attempt 1 pending: the result stands",
        "finished after the requeue, attempt 1 pending: the result stands",
        "finished before the requeue, attempt 1 assigned: withdrawn, the result stands",
        "finished before the requeue, attempt 1 running: stopped, the result stands",
        "failed with an exit code before the requeue, attempt 1 running: the task fails with it",
        "finished after the requeue, attempt 1 assigned: only recorded",
        "finished after the requeue, attempt 1 running: only recorded",
        "failed without an exit code, attempt 1 running: only recorded",
    ],
)
def test_a_late_result_stands_when_the_run_finished_before_the_requeue(
    fleet: Any,
    attempt_1: str,
    finished_s: float,
    outcome: str,
    exit_code: int | None,
    want_state: str,
    want_b: p.DesiredTaskState | None,
) -> None:
    from apps.fleet.models import TaskRun
    from apps.workloads.models import Quota

    requeued = requeued_from_a(fleet)
    task = requeued.task
    if attempt_1 != "pending":
        place_attempt_1_on_b(fleet, task, started=attempt_1 == "running")
    quota = Quota.objects.get(tenant=task.tenant, pool=task.pool)
    held = held_milli(quota)
    at = requeued.requeued_at + timedelta(seconds=finished_s)
    report(fleet.node, 2, ended(task, outcome, at=at, exit_code=exit_code))
    task.refresh_from_db()
    assert task.state == want_state
    assert TaskRun.objects.get(node=fleet.node, task=task, attempt=0).state == outcome  # recorded always
    assert b_desired(fleet, task) == want_b
    if want_state == outcome:
        assert task.exit_code == exit_code
        assert "after the plane had requeued it" in task.events.order_by("-pk").first().reason
        # Admitted again (attempt 1 placed), it held quota until this result ended it; pending, none.
        assert held_milli(quota) == held - (task.charge_milli if attempt_1 != "pending" else 0)
        assert not task.assignments.filter(released_at__isnull=True).exists()
    else:
        assert held_milli(quota) == held


def test_the_event_says_which_attempt_was_withdrawn(fleet: Any) -> None:
    requeued = requeued_from_a(fleet)
    place_attempt_1_on_b(fleet, requeued.task, started=True)
    report(fleet.node, 2, ended(requeued.task, "succeeded", at=requeued.requeued_at - timedelta(seconds=5)))
    event = requeued.task.events.order_by("-pk").first()
    assert (event.from_state, event.to_state, event.actor) == ("running", "succeeded", "agent:gpu-001")
    assert "having finished before the requeue" in event.reason
    assert "attempt 1 (running) is withdrawn" in event.reason
    assert event.reason.endswith("(exit code 0)")


def test_the_agents_clock_is_read_on_the_planes(fleet: Any) -> None:
    """Node A's clock runs 100 s ahead: a run that ended at requeue + 60 s by A's clock ended 40 s before
    the requeue by the plane's."""
    requeued = requeued_from_a(fleet, agent_ahead_s=100.0)
    place_attempt_1_on_b(fleet, requeued.task, started=True)
    at = requeued.requeued_at + timedelta(seconds=60)
    report(fleet.node, 2, ended(requeued.task, "succeeded", at=at))
    requeued.task.refresh_from_db()
    assert requeued.task.state == "succeeded"


def test_a_result_without_its_finishing_time_does_not_replace_a_placed_attempt(fleet: Any) -> None:
    requeued = requeued_from_a(fleet)
    place_attempt_1_on_b(fleet, requeued.task, started=True)
    report(fleet.node, 2, ended(requeued.task, "succeeded", at=None))
    requeued.task.refresh_from_db()
    assert (requeued.task.state, requeued.task.attempts) == ("running", 1)


def test_the_same_late_result_twice_ends_the_task_once(fleet: Any) -> None:
    from apps.workloads.models import Quota

    requeued = requeued_from_a(fleet)
    task = requeued.task
    place_attempt_1_on_b(fleet, task, started=True)
    quota = Quota.objects.get(tenant=task.tenant, pool=task.pool)
    held = held_milli(quota)
    done = ended(task, "succeeded", at=requeued.requeued_at - timedelta(seconds=5))
    report(fleet.node, 2, done)
    report(fleet.node, 3, done)  # the outbox sent it again under a new seq
    assert held_milli(quota) == held - task.charge_milli
    assert task.events.filter(to_state="succeeded").count() == 1


def test_the_duplicates_own_end_afterwards_changes_nothing(fleet: Any) -> None:
    """B stops attempt 1 (listed `stop`) and reports it: the task keeps attempt 0's result."""
    requeued = requeued_from_a(fleet)
    task = requeued.task
    place_attempt_1_on_b(fleet, task, started=True)
    report(fleet.node, 2, ended(task, "succeeded", at=requeued.requeued_at - timedelta(seconds=5)))
    stopped = p.TaskReport(str(task.pk), p.TaskState.STOPPED, 0.0, signal=15, attempt=1, reason="stop")
    report(fleet.node_b, 2, stopped)
    task.refresh_from_db()
    assert (task.state, task.exit_code) == ("succeeded", 0)
    assert b_desired(fleet, task) is None  # ended: no longer listed


@pytest.mark.parametrize(
    "meanwhile",
    ["the cycle placed attempt 1", "attempt 1 ended on B"],
)
def test_a_writer_that_moved_the_task_first_is_seen_before_deciding_again(fleet: Any, meanwhile: str) -> None:
    """Compare-and-set: the report decided on the task as it read it; another writer committed first.
    The decision is taken again on the task as it is: a placement landing meanwhile is withdrawn, an
    end landing meanwhile stands."""
    from apps.fleet.reports import _late_result_apply
    from apps.workloads.models import Task

    requeued = requeued_from_a(fleet)
    stale = Task.objects.get(pk=requeued.task.pk)  # read while pending
    place_attempt_1_on_b(fleet, requeued.task, started=True)
    if meanwhile == "attempt 1 ended on B":
        done_b = p.TaskReport(str(stale.pk), p.TaskState.FAILED, 0.0, exit_code=1, attempt=1)
        report(fleet.node_b, 2, done_b)
    done = ended(stale, "succeeded", at=requeued.requeued_at - timedelta(seconds=5))
    took = _late_result_apply(node=fleet.node, task=stale, report=done, attempt=0)
    task = Task.objects.get(pk=stale.pk)
    if meanwhile == "the cycle placed attempt 1":
        assert took and task.state == "succeeded"
    else:
        assert not took and (task.state, task.exit_code) == ("failed", 1)


def test_a_gang_members_late_result_never_replaces_its_placed_attempt(fleet: Any) -> None:
    from apps.workloads.models import Task

    requeued = requeued_from_a(fleet)
    Task.objects.filter(pk=requeued.task.pk).update(gang_id="g1")
    requeued.task.refresh_from_db()
    place_attempt_1_on_b(fleet, requeued.task, started=True)
    report(fleet.node, 2, ended(requeued.task, "succeeded", at=requeued.requeued_at - timedelta(seconds=5)))
    requeued.task.refresh_from_db()
    assert requeued.task.state == "running"
