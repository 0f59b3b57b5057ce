"""The runs the plane believes alive on a node, and putting a task whose run ended without it back in
its queue: used by the heartbeat (a run the agent stopped listing), reports (a run the node gave up
on) and node loss and drain (`apps.fleet.nodes`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from apps.common.errors import Conflict
from apps.fleet import changes
from apps.fleet.models import TaskRun
from apps.fleet.selectors import parse_run
from apps.inventory.models import Node
from apps.scheduling.models import Assignment
from apps.workloads.models import Quota, Task
from apps.workloads.services import task_transition
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")

LIVE_TASK_STATES = frozenset({Task.State.ASSIGNED, Task.State.RUNNING})


def task_move(task: Task, to_state: str, *, actor: str, reason: str, **fields: Any) -> bool:
    """One state change; False when another writer moved the task first (their move stands)."""
    try:
        task_transition(task=task, to_state=to_state, actor=actor, reason=reason[:500], **fields)
    except Conflict as error:
        log.info("task %s: %s not applied: %s", task.pk, to_state, error, extra={"task_id": task.pk})
        task.refresh_from_db()
        return False
    return True


def task_requeue(task: Task, *, via: str, actor: str, reason: str) -> None:
    """assigned/running → lost|preempted → pending in one transaction: the attempt is counted, the
    assignment released (a crash between the two steps would leave the task lost, in no queue)."""
    with transaction.atomic():
        if task.state in LIVE_TASK_STATES and not task_move(task, via, actor=actor, reason=reason):
            return
        if task.state in (Task.State.LOST, Task.State.PREEMPTED):
            task_move(
                task, Task.State.PENDING, actor=actor, reason=reason, why_pending=f"requeued: {reason}"[:500]
            )


def runs_missing(*, runs: list[TaskRun], running: tuple[p.RunningTask, ...], now: datetime) -> list[TaskRun]:
    """Runs the plane believes alive here (`TaskRun` starting/running) that the heartbeat does not list.

    A run first missing is stamped `missing_since`; listed again, the stamp clears. Missing for the grace
    period (as long as a node must be silent to be lost: `WHALEGEN_NODE_LOST_HEARTBEATS` ×
    `WHALEGEN_AGENT_HEARTBEAT_S`) it is to be declared `lost` (`run_lose`): the agent dropped it without
    a report (a report still on its way would have landed within the grace). `runs`: the node's alive
    runs, read by the caller. Returns those to declare.
    """
    listed = {run for item in running if (run := parse_run(item.task_id, item.attempt)) is not None}
    grace = timedelta(seconds=settings.WHALEGEN_NODE_LOST_HEARTBEATS * settings.WHALEGEN_AGENT_HEARTBEAT_S)
    declared: list[TaskRun] = []
    for run in runs:
        if (run.task_id, run.attempt) in listed:
            if run.missing_since is not None:
                TaskRun.objects.filter(pk=run.pk).update(missing_since=None)
                run.missing_since = None
            continue
        if run.missing_since is None:
            TaskRun.objects.filter(pk=run.pk, missing_since__isnull=True).update(missing_since=now)
            run.missing_since = now
            continue
        if now - run.missing_since < grace:
            continue
        declared.append(run)
    return declared


def run_lose(*, node: Node, run: TaskRun, now: datetime) -> None:
    """Declare a dropped run lost and, if it is its task's live attempt here, requeue the task: one
    transaction, quotas locked first (the cycle's lock order)."""
    assert run.missing_since is not None
    reason = (
        f"task {run.task_id} attempt {run.attempt} lost on {node.name}: the agent stopped listing it "
        f"{(now - run.missing_since).total_seconds():.0f} s ago and never reported how it ended"
    )
    with transaction.atomic():
        quotas_lock([run.task_id])
        # Compare-and-set on the state: a report of its end landing meanwhile wins.
        if not TaskRun.objects.filter(pk=run.pk, state=run.state).update(
            state=TaskRun.State.LOST, reason=reason[:500]
        ):
            return
        changes.node_changed([node.pk])  # no longer alive: no longer listed to stop, nor holding back a run
        log.warning(reason, extra={"task_id": run.task_id, "node": node.name})
        task = Task.objects.get(pk=run.task_id)
        live = (
            run.attempt == task.attempts
            and task.state in LIVE_TASK_STATES
            and Assignment.objects.filter(node=node, task=task, released_at__isnull=True).exists()
        )
        if live:
            task_requeue(task, via=Task.State.LOST, actor=f"agent:{node.name}", reason=reason)


def quotas_lock(task_ids: list[int]) -> None:
    """Lock the quota rows of these tasks, ids ascending: the first lock of every transaction that may
    give a quota charge back while it also touches nodes, as the scheduling cycle locks quotas, then
    nodes, then tasks."""
    tasks = Task.objects.filter(pk__in=task_ids, tenant_id=OuterRef("tenant_id"), pool_id=OuterRef("pool_id"))
    list(Quota.objects.select_for_update().filter(Exists(tasks)).order_by("pk").values_list("pk", flat=True))
