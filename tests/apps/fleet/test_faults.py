"""Faults on the plane's side of the fleet (issue #11): node loss that survives a crash, a plane that
cannot hear its fleet, heartbeats delayed by a busy plane, late reports, bounded requeues."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.factories import held_milli
from tests.apps.fleet.conftest import assign
from whalegen import protocol as p

pytestmark = pytest.mark.django_db


def heartbeat(node: Any, at: datetime, *, sent_at: datetime | None = None, running: Any = None) -> None:
    """A heartbeat the plane receives at `at`, sent by the agent at `sent_at` (default: the same)."""
    from apps.fleet.heartbeat import agent_heartbeat

    sent = (sent_at or at).timestamp()
    message = p.Heartbeat(node_id=str(node.pk), agent_version="0.1", sent_at_s=sent, running=running)
    agent_heartbeat(node=node, message=message, now=at)


def report(node: Any, seq: int, *tasks: p.TaskReport) -> None:
    from apps.fleet.reports import agent_report

    agent_report(node=node, message=p.Report(node_id=str(node.pk), seq=seq, sent_at_s=0.0, tasks=tasks))


def refreshed(*rows: Any) -> None:
    for row in rows:
        row.refresh_from_db()


# ------------------------------------------------------------------------------ 1. loss is atomic


def test_a_crash_while_requeueing_a_lost_nodes_tasks_is_finished_by_the_next_check(
    fleet: Any, monkeypatch: Any
) -> None:
    """Before: the node's `lost` state was committed first, the crash left its task assigned, and later
    checks skipped the node (already lost) — the task stayed on a dead node forever."""
    from apps.fleet import nodes
    from apps.scheduling.models import Assignment

    now = timezone.now()
    heartbeat(fleet.node, now)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    real = nodes.task_requeue
    calls: list[int] = []

    def crash_once(task: Any, **kwargs: Any) -> None:
        calls.append(task.pk)
        if len(calls) == 1:
            raise RuntimeError("worker killed mid node-loss")
        real(task, **kwargs)

    monkeypatch.setattr(nodes, "task_requeue", crash_once)
    later = now + timedelta(seconds=31)
    assert fleet.node.pk not in nodes.nodes_mark_lost(now=later)
    refreshed(fleet.node, fleet.task_a)
    assert (fleet.node.state, fleet.task_a.state) == ("ready", "assigned")  # all of it rolled back

    assert fleet.node.pk in nodes.nodes_mark_lost(now=later + timedelta(seconds=5))
    refreshed(fleet.node, fleet.task_a)
    assert (fleet.node.state, fleet.task_a.state, fleet.task_a.attempts) == ("lost", "pending", 1)
    assert not Assignment.objects.filter(task=fleet.task_a, released_at__isnull=True).exists()


def test_live_work_left_on_a_node_already_lost_is_requeued_by_the_next_check(fleet: Any) -> None:
    """What a crashed check (or an older plane) left behind: the node is lost, its task still assigned."""
    from apps.fleet.nodes import nodes_mark_lost
    from apps.inventory.models import Node

    now = timezone.now()
    heartbeat(fleet.node, now)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    Node.objects.filter(pk=fleet.node.pk).update(state=Node.State.LOST, state_before_lost=Node.State.READY)
    nodes_mark_lost(now=now + timedelta(seconds=1))
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    assert "is lost" in fleet.task_a.why_pending


def test_requeue_after_loss_is_one_step(fleet: Any, monkeypatch: Any) -> None:
    """lost → pending commits with running → lost: a crash in between never leaves a task `lost`, in no
    queue and picked up by nothing."""
    from apps.fleet import nodes, runs
    from apps.workloads import services as workloads

    now = timezone.now()
    heartbeat(fleet.node, now)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    real = workloads.task_transition

    def crash_on_pending(**kwargs: Any) -> Any:
        if kwargs["to_state"] == "pending":
            raise RuntimeError("database connection dropped")
        return real(**kwargs)

    monkeypatch.setattr(runs, "task_transition", crash_on_pending)
    nodes.nodes_mark_lost(now=now + timedelta(seconds=31))
    fleet.task_a.refresh_from_db()
    assert fleet.task_a.state == "assigned"


# -------------------------------------------------------------------- 2. the plane's own outage


def test_when_every_node_falls_silent_at_once_no_node_is_lost(fleet: Any) -> None:
    """The web tier stopped for 40 s: neither node could report. Before: both were lost and their tasks
    requeued while the agents ran them to completion."""
    from apps.fleet.nodes import nodes_mark_lost

    now = timezone.now()
    heartbeat(fleet.node, now)
    heartbeat(fleet.node_b, now - timedelta(seconds=5))
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    for after_s in range(5, 65, 5):
        assert nodes_mark_lost(now=now + timedelta(seconds=after_s)) == []
    refreshed(fleet.node, fleet.node_b, fleet.task_a)
    assert (fleet.node.state, fleet.node_b.state, fleet.task_a.state) == ("ready", "ready", "assigned")


def test_after_the_plane_hears_again_each_node_gets_a_full_threshold_then_a_silent_one_is_lost(
    fleet: Any,
) -> None:
    from apps.fleet.nodes import nodes_mark_lost

    now = timezone.now()
    heartbeat(fleet.node, now)
    heartbeat(fleet.node_b, now)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    assert nodes_mark_lost(now=now + timedelta(seconds=25)) == []  # deaf: no heartbeat from anyone
    back = now + timedelta(seconds=60)
    heartbeat(fleet.node_b, back)  # intake is back; node A's agent has not come through yet
    assert nodes_mark_lost(now=back + timedelta(seconds=1)) == []
    for after_s in (10, 20, 30):  # node B at its pace again (its first gap, 60 s, counted once)
        heartbeat(fleet.node_b, back + timedelta(seconds=after_s))
        assert nodes_mark_lost(now=back + timedelta(seconds=after_s)) == []  # 3 × 10 s from hearing again
    assert nodes_mark_lost(now=back + timedelta(seconds=32)) == [fleet.node.pk]
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)


def test_a_single_silent_node_among_heard_ones_is_still_lost(fleet: Any) -> None:
    from apps.fleet.nodes import nodes_mark_lost

    now = timezone.now()
    heartbeat(fleet.node, now)
    for after_s in range(0, 40, 10):
        heartbeat(fleet.node_b, now + timedelta(seconds=after_s))
    assert nodes_mark_lost(now=now + timedelta(seconds=31)) == [fleet.node.pk]


def _requeued_after_loss(fleet: Any) -> Any:
    """Task A ran on node A (attempt 0), node A was lost, the task requeued (attempt 1, pending)."""
    from apps.fleet.nodes import nodes_mark_lost

    now = timezone.now()
    heartbeat(fleet.node, now)
    heartbeat(fleet.node_b, now + timedelta(seconds=30))
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(fleet.node, 1, p.TaskReport(str(fleet.task_a.pk), p.TaskState.RUNNING, 0.0, pid=7, attempt=0))
    assert nodes_mark_lost(now=now + timedelta(seconds=31)) == [fleet.node.pk]
    fleet.task_a.refresh_from_db()
    assert (fleet.task_a.state, fleet.task_a.attempts) == ("pending", 1)
    return fleet.task_a


@pytest.mark.parametrize(("outcome", "exit_code"), [("succeeded", 0), ("failed", 3)])
def test_a_result_for_a_run_the_plane_gave_up_on_is_kept_when_nothing_took_its_place(
    fleet: Any, outcome: str, exit_code: int
) -> None:
    """Before: the finished run was thrown away and the task ran again."""
    from apps.workloads.models import Quota

    task = _requeued_after_loss(fleet)
    quota = Quota.objects.get(tenant=task.tenant, pool=task.pool)
    held = held_milli(quota)
    done = p.TaskReport(str(task.pk), p.TaskState(outcome), 0.0, exit_code=exit_code, attempt=0)
    report(fleet.node, 2, done)
    task.refresh_from_db()
    assert (task.state, task.exit_code) == (outcome, exit_code)
    assert "after the plane had requeued it" in task.events.order_by("-pk").first().reason
    assert held_milli(quota) == held  # requeued to pending, it held nothing; ended, it still holds nothing


def test_a_late_result_does_not_overwrite_the_attempt_that_replaced_it(fleet: Any) -> None:
    task = _requeued_after_loss(fleet)
    assign(task, fleet.node, [fleet.whole_unit])  # attempt 1 placed: the old run is superseded
    report(fleet.node, 2, p.TaskReport(str(task.pk), p.TaskState.SUCCEEDED, 0.0, exit_code=0, attempt=0))
    task.refresh_from_db()
    assert (task.state, task.attempts) == ("assigned", 1)


# ---------------------------------------------------------------- 6. a busy plane is not silence


def test_heartbeats_the_plane_receives_late_do_not_make_a_healthy_node_lost(fleet: Any) -> None:
    """The agents send every 10 s, but a congested plane takes up to 8 s to take each one in: the time
    between two rows written reaches 18 s. Counted in wall time since the last row, 3 × 10 s passes
    between two received heartbeats under a slightly longer stall; counted against the intake delay
    the plane measures, the node stays."""
    from apps.fleet.nodes import fleet_pace, nodes_mark_lost

    start = timezone.now()
    for node in (fleet.node, fleet.node_b):
        heartbeat(node, start, sent_at=start)  # delivered at once: the offset is learnt
    delay_s = 8.0
    sent = start
    for _ in range(3):
        sent += timedelta(seconds=10)
        for node in (fleet.node, fleet.node_b):
            heartbeat(node, sent + timedelta(seconds=delay_s), sent_at=sent)
    pace = fleet_pace(now=sent + timedelta(seconds=delay_s))
    assert 7.0 < pace.lag_s < delay_s  # the offset creeps up 2 % a heartbeat; the delay still shows
    # The next heartbeat was sent on time but is stuck in the plane's queue for 25 s (31 s of silence).
    assert nodes_mark_lost(now=sent + timedelta(seconds=delay_s + 31)) == []


def test_the_heartbeat_path_costs_a_fixed_number_of_queries(
    fleet: Any, django_assert_num_queries: Any
) -> None:
    """Steady state (agent row present, telemetry not due, runs listed): pinned, whatever the fleet.
    Savepoint, two `UPDATE … RETURNING`s (node; agent row, which answers whether anything is assigned or
    alive), the GPUs and the units of its MIG GPU, the alive runs, release, the live assignment and its
    units: nothing written that did not change, nothing read twice (was 13: the GPUs, the agent row and
    the alive runs were read again for the desired state, and the newest telemetry sample was looked up
    on every heartbeat; then 10, with the agent row read after its UPDATE). A node with nothing assigned
    and nothing alive skips the last three reads."""
    now = timezone.now()
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(fleet.node, 1, p.TaskReport(str(fleet.task_a.pk), p.TaskState.RUNNING, 0.0, pid=7))
    running = (p.RunningTask(str(fleet.task_a.pk), 0, 7),)
    heartbeat(fleet.node, now, running=running)
    with django_assert_num_queries(9):
        heartbeat(fleet.node, now + timedelta(seconds=10), running=running)
    from apps.fleet.models import TaskRun
    from apps.scheduling.models import Assignment

    Assignment.objects.filter(task=fleet.task_a).update(released_at=now)
    TaskRun.objects.filter(node=fleet.node).update(state=TaskRun.State.SUCCEEDED)
    heartbeat(fleet.node, now + timedelta(seconds=20), running=())  # the desired state changed: bumped
    with django_assert_num_queries(6):  # savepoint, node, agent row, GPUs, MIG units, release
        heartbeat(fleet.node, now + timedelta(seconds=30), running=())


# --------------------------------------------------------- 4. the desired state keeps a started run


def test_a_late_running_report_of_an_older_attempt_does_not_take_back_the_newer_run(fleet: Any) -> None:
    """Attempt 0 was lost and the task handed back to the same GPU as attempt 1, which started. A
    `running` line about attempt 0 then arrives. Before: the desired state held attempt 1 back (its unit
    "still busy" with attempt 0), so the agent stopped it and the plane requeued it as lost."""
    from apps.fleet.selectors import desired_state_build

    task = _requeued_after_loss(fleet)
    heartbeat(fleet.node, timezone.now())
    assign(task, fleet.node, [fleet.whole_unit])
    report(fleet.node, 2, p.TaskReport(str(task.pk), p.TaskState.RUNNING, 0.0, pid=9, attempt=1))
    report(fleet.node, 3, p.TaskReport(str(task.pk), p.TaskState.RUNNING, 0.0, pid=7, attempt=0))
    desired = desired_state_build(node=fleet.node, now=timezone.now())
    runs = {(spec.task_id, spec.attempt): spec.desired for spec in desired.tasks}
    assert runs[(str(task.pk), 1)] is p.DesiredTaskState.RUN
    assert runs[(str(task.pk), 0)] is p.DesiredTaskState.STOP
    task.refresh_from_db()
    assert (task.state, task.attempts) == ("running", 1)


def test_a_run_not_started_yet_still_waits_for_the_stopping_one_on_its_unit(fleet: Any) -> None:
    """The double-occupancy guard stays for runs the agent has not started."""
    from apps.fleet.selectors import desired_state_build

    task = _requeued_after_loss(fleet)
    heartbeat(fleet.node, timezone.now())
    assign(task, fleet.node, [fleet.whole_unit])
    desired = desired_state_build(node=fleet.node, now=timezone.now())
    assert [(s.attempt, s.desired) for s in desired.tasks] == [(0, p.DesiredTaskState.STOP)]


# ------------------------------------------------------------------------------ bounded requeues


def test_a_requeued_task_backs_off_and_the_cycle_does_not_place_it_before_then(fleet: Any) -> None:
    from apps.scheduling.snapshot import snapshot_for_pool

    task = _requeued_after_loss(fleet)
    assert task.not_before_at is not None
    assert "backing off after attempt 1 until" in task.why_pending
    assert task.why_pending_code == "backing_off"
    before = snapshot_for_pool(task.pool_id, task.not_before_at - timedelta(seconds=1))
    after = snapshot_for_pool(task.pool_id, task.not_before_at)
    assert task.pk not in {info.pk for info in before.pending.values()}
    assert task.pk in {info.pk for info in after.pending.values()}


def test_back_off_doubles_per_attempt_up_to_its_cap(settings: Any) -> None:
    from apps.workloads.services import requeue_backoff_s

    waits = [requeue_backoff_s(attempt=n, base_s=5, cap_s=60) for n in range(1, 7)]
    assert waits == [5, 10, 20, 40, 60, 60]


def test_a_task_lost_on_every_attempt_fails_after_the_last_with_its_history(
    fleet: Any, settings: Any
) -> None:
    from apps.fleet.nodes import nodes_mark_lost
    from apps.inventory.models import Node
    from apps.workloads.models import Quota

    settings.WHALEGEN_MAX_ATTEMPTS = 3
    task = fleet.task_a
    quota = Quota.objects.get(tenant=task.tenant, pool=task.pool)
    held = held_milli(quota)
    for attempt in range(3):
        now = timezone.now()
        Node.objects.filter(pk=fleet.node.pk).update(state=Node.State.READY, last_heartbeat_at=now)
        heartbeat(fleet.node_b, now + timedelta(seconds=30))
        task.refresh_from_db()
        assign(task, fleet.node, [fleet.whole_unit])
        assert nodes_mark_lost(now=now + timedelta(seconds=31)) == [fleet.node.pk]
        task.refresh_from_db()
        assert task.state == ("pending" if attempt < 2 else "failed")
    last = task.events.order_by("-pk").first()
    assert last.reason.startswith("gave up after 3 attempts (WHALEGEN_MAX_ATTEMPTS=3): 1: lost (node gpu-001")
    assert "; 3: lost (" in last.reason
    assert held_milli(quota) == held  # pending before, failed now: it holds nothing either way
