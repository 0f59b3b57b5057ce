"""Agent reports: task and partition state changes, numbered by `seq` and applied once, which drive the
task state machine (docs/fleet.md, "Late results").
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.common import hooks
from apps.common.errors import NotAllowed
from apps.fleet import changes, liveness
from apps.fleet.agents import agent_time, check_node, check_version, gpu_unhealthy
from apps.fleet.models import AgentReport, GpuPartition, NodeAgent, TaskRun
from apps.fleet.runs import LIVE_TASK_STATES, quotas_lock, task_move, task_requeue
from apps.fleet.selectors import parse_run
from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.fields import unit_ids_sql
from apps.scheduling.models import Assignment
from apps.workloads.models import Task
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")


def _late_result_stands(*, node: Node, task: Task, report: p.TaskReport, attempt: int) -> bool:
    """Whether the end of a run the plane gave up on becomes the task's result (docs/fleet.md, "Late
    results"; docs/faults.md, "A run that finished before the plane requeued it"). Always: the run is the
    attempt just before the task's current one, the task was last requeued from this node, and it is in
    no gang (a gang's ranks run together; one rank's result cannot stand for a gang requeued whole).

    Then either the task is still pending (nothing has taken the run's place), or the requeued attempt is
    placed (assigned, or running: the duplicate) and the run finished by itself — succeeded, or failed
    with an exit code — before the plane requeued it: its result was complete when the plane gave up on
    it, so the attempt placed since only repeats work already done. A task `admitted` is not taken over:
    the cycle admits and assigns in one transaction, so a report never sees that state committed.
    """
    if task.gang_id or attempt != task.attempts - 1:
        return False
    # The latest released assignment is the attempt the plane requeued (a requeue releases the
    # assignment and counts the attempt in one transaction; a final state would have ended the task).
    requeued = (
        Assignment.objects.filter(task=task, released_at__isnull=False)
        .order_by("-pk")
        .values_list("node_id", "released_at")
        .first()
    )
    if requeued is None or requeued[0] != node.pk:
        return False
    if task.state == Task.State.PENDING:
        return True
    if task.state not in LIVE_TASK_STATES:
        return False
    if report.state is p.TaskState.FAILED and report.exit_code is None:
        return False  # stopped, killed or never started: not a result of its own
    return _finished_before(node=node, finished_at_s=report.finished_at_s, moment=requeued[1])


def _finished_before(*, node: Node, finished_at_s: float | None, moment: datetime) -> bool:
    """Whether a run that ended at `finished_at_s` (the agent's clock) ended before `moment` (the
    plane's). The agent's clock is moved onto the plane's by the node's recorded offset, the lowest
    receive-minus-send a heartbeat showed: that includes the quickest delivery, so it errs towards
    "later", never towards taking a result that came after. No time given (0 or None): unknown, not
    before."""
    if not finished_at_s:
        return False
    offset_s = NodeAgent.objects.filter(node=node).values_list("clock_offset_s", flat=True).first()
    return datetime.fromtimestamp(finished_at_s + (offset_s or 0.0), tz=UTC) < moment


def _late_result_apply(*, node: Node, task: Task, report: p.TaskReport, attempt: int) -> bool:
    """End the task with the late result if it stands (`_late_result_stands`). Returns whether it did.

    Compare-and-set: the decision is made on the task as read, and the move applies only if the task is
    still in that state and version. A concurrent writer (a cycle placing the requeued attempt, the
    other node reporting it running or ended) moves it first: the decision is taken once more on the
    task as it is now, so a placement that lands meanwhile is withdrawn instead of double-booked, and a
    task that ended meanwhile keeps its end.
    """
    what = report.reason or report.state.value
    to_state = Task.State.SUCCEEDED if report.state is p.TaskState.SUCCEEDED else Task.State.FAILED
    for _ in range(2):
        if not _late_result_stands(node=node, task=task, report=report, attempt=attempt):
            return False
        reason = f"attempt {attempt} ended on {node.name} after the plane had requeued it"
        if task.state == Task.State.PENDING:
            reason += f", and nothing had taken its place: {what}"
        else:
            # Ending the task releases the new attempt's assignment: its node no longer lists it (not
            # started yet: withdrawn) or lists it as `stop` (started: the duplicate is stopped).
            reason += (
                f", having finished before the requeue: {what}; attempt {task.attempts} "
                f"({task.state}) is withdrawn"
            )
        if report.exit_code is not None:
            reason += f" (exit code {report.exit_code})"
        if task_move(task, to_state, actor=f"agent:{node.name}", reason=reason, exit_code=report.exit_code):
            return True
    return False


def _held_gpu_indexes(task: Task) -> str:
    """The device indexes of the GPUs a placed task holds, "0,1,2,3": one query, the units its live
    assignment lists (at most one per task, a unique constraint) read as a subquery of that list."""
    item, unit_id = unit_ids_sql("a.unit_ids", connection.vendor)
    listed = RawSQL(
        f"SELECT {unit_id} FROM {Assignment._meta.db_table} a, {item}"
        " WHERE a.task_id = %s AND a.released_at IS NULL",
        (task.pk,),
    )
    indexes = (
        ComputeUnit.objects.filter(pk__in=listed)
        .values_list("gpu__index", flat=True)
        .distinct()
        .order_by("gpu__index")
    )
    return ",".join(str(index) for index in indexes) or "?"


def _apply_task_report(*, node: Node, task: Task, report: p.TaskReport, live: bool, attempt: int) -> None:
    actor = f"agent:{node.name}"
    what = report.reason or report.state.value
    if report.state in (p.TaskState.STARTING, p.TaskState.RUNNING):
        if live and task.state == Task.State.ASSIGNED:
            where = f" on {report.device_uuid}" if report.device_uuid else ""
            if task.gpu_count > 1:  # the report names one device; the event names every GPU it holds
                where = f" on {node.name} GPUs {_held_gpu_indexes(task)}"
            task_move(task, Task.State.RUNNING, actor=actor, reason=f"{what} (pid {report.pid}{where})")
        return
    if report.state in (p.TaskState.SUCCEEDED, p.TaskState.FAILED):
        if not live and _late_result_apply(node=node, task=task, report=report, attempt=attempt):
            return
        if not live or task.state not in LIVE_TASK_STATES:
            return
        # It ran and ended between two reports: record the start the plane never saw.
        if (
            task.state == Task.State.ASSIGNED
            and report.state is p.TaskState.SUCCEEDED
            and not task_move(task, Task.State.RUNNING, actor=actor, reason="started (seen at its end)")
        ):
            return
        to_state = Task.State.SUCCEEDED if report.state is p.TaskState.SUCCEEDED else Task.State.FAILED
        reason = f"exit code {report.exit_code}" if report.exit_code is not None else what
        if report.signal is not None:
            reason += f", signal {report.signal}"
        if report.reason and report.reason not in reason:
            reason += f": {report.reason}"
        task_move(task, to_state, actor=actor, reason=reason, exit_code=report.exit_code)
        return
    # stopped / lost / rejected.
    if task.state == Task.State.PREEMPTED:
        task_move(
            task,
            Task.State.PENDING,
            actor=actor,
            reason=f"stopped on {node.name} after preemption",
            why_pending="preempted; waiting for the next cycle",
        )
    elif live and task.state in LIVE_TASK_STATES:
        # The node gave up on a task the plane still wanted: not the task's fault, so it runs again.
        reason = f"{report.state.value} on {node.name}: {what}"
        task_requeue(task, via=Task.State.LOST, actor=actor, reason=reason)


# Run states only the agent's own process exit produces; a later "running" about the same run is stale.
_ENDED_BY_AGENT = (
    TaskRun.State.SUCCEEDED,
    TaskRun.State.FAILED,
    TaskRun.State.STOPPED,
    TaskRun.State.REJECTED,
)
_ALIVE_REPORTS = frozenset({p.TaskState.STARTING, p.TaskState.RUNNING})


def agent_report(*, node: Node, message: p.Report, now: datetime | None = None) -> p.ReportAck:
    """Store a report once per (node, seq) and apply it; a repeat is acknowledged and ignored.

    Every task and GPU named must be this node's (a task it was ever assigned, a GPU it holds), and
    every output chunk a run of this node's, otherwise nothing is applied (403). Output chunks are
    stored after the task reports (a run's first report creates its TaskRun) in the same transaction.
    """
    now = now or timezone.now()
    check_node(node, message.node_id)
    check_version(message.protocol_version)
    # 1. Ownership: all or nothing, before anything is written.
    named, existing, gpus = _check_ownership(node=node, message=message)
    agent, _ = NodeAgent.objects.get_or_create(node=node)
    # 2. Store and apply in one transaction; the unique (node, seq) makes a concurrent repeat fail here.
    try:
        with transaction.atomic():
            # The scheduling cycle's lock order: quotas (a report may end a task and give its charge
            # back), then the node, then tasks. Rows of this node written below (reports, runs) take a
            # share lock on the node row, which must not be held while waiting for a quota.
            quotas_lock(sorted(existing))
            node_lock(node)
            if AgentReport.objects.filter(node=node, seq=message.seq).exists():
                raise _Repeat
            # The output itself is stored once, in apps.logs (capped there); the report keeps its outline.
            payload = message.to_dict()
            payload["logs"] = [{**chunk, "lines": len(chunk["lines"])} for chunk in payload.get("logs", [])]
            AgentReport.objects.create(node=node, seq=message.seq, payload=payload)
            _apply_task_reports(node=node, message=message, named=named, existing=existing)
            _apply_partitions(node=node, message=message, gpus=gpus, now=now)
            hooks.agent_logs_store(node=node, chunks=message.logs)
    except (_Repeat, IntegrityError):
        pass
    # 3. Acknowledge what is stored, and tell the heartbeat paths the node's runs may have moved.
    stored = AgentReport.objects.filter(node=node).aggregate(top=Max("seq"))["top"] or 0
    NodeAgent.objects.filter(pk=agent.pk).update(stored_seq=stored)
    # Runs may have changed state: the next heartbeat compares them the full way (apps.fleet.liveness).
    liveness.forget([node.pk])
    if message.tasks:
        # A run that ended leaves the stop list and releases a run held back behind it (no double
        # occupancy): the node's waiting poll must rebuild.
        changes.node_changed([node.pk])
    return p.ReportAck(stored_seq=stored)


def node_lock(node: Node) -> None:
    """Lock the node's own row for the report's transaction, and nothing else. Without `of` and with
    the model's ordering (cluster name, then name) the statement joined the cluster and locked its row
    too, so every report of a cluster waited for every other one there, and for a report whose web
    thread was starved of CPU (docs/notes/agent-fleet.md, run 5).

    What remains must be held until the transaction ends: the report moves tasks on what this node
    holds (its live assignments, its runs), which the node-health check (marking the node lost and
    requeueing its tasks) and the cycle (placing on it) change under the same lock; taken later, a
    report could end a task that a concurrent loss had just requeued from this node. It is taken after
    the quota rows (the cycle's order) and before the first write naming the node. The heartbeat flush
    never waits on it (`apps.fleet.liveness.flush` skips a held node)."""
    Node.objects.select_for_update(of=("self",)).filter(pk=node.pk).order_by().values_list("pk").first()


def _check_ownership(*, node: Node, message: p.Report) -> tuple[set[int], set[int], dict[str, Gpu]]:
    """Raise NotAllowed unless every task, GPU and output chunk named is this node's. Returns the task
    ids named, those of them that still exist, and the node's GPUs by UUID."""
    named: set[int] = set()
    for item in message.tasks:
        run = parse_run(item.task_id, item.attempt)
        if run is None:
            raise NotAllowed(f"task {item.task_id!r} was never assigned to node {node.pk}")
        named.add(run[0])
    existing = set(Task.objects.filter(pk__in=named).values_list("pk", flat=True))
    mine = set(Assignment.objects.filter(node=node, task_id__in=named).values_list("task_id", flat=True))
    if existing - mine:
        raise NotAllowed(f"tasks {sorted(existing - mine)} were never assigned to node {node.pk}")
    gpus = {gpu.uuid: gpu for gpu in Gpu.objects.filter(node=node)}
    foreign = {item.gpu_uuid for item in message.partitions} - set(gpus)
    if foreign & set(Gpu.objects.filter(uuid__in=foreign).values_list("uuid", flat=True)):
        raise NotAllowed(f"GPUs {sorted(foreign)} are not on node {node.pk}")
    reported = {run for item in message.tasks if (run := parse_run(item.task_id, item.attempt)) is not None}
    hooks.agent_logs_check(node=node, chunks=message.logs, reported=reported)
    return named, existing, gpus


def _apply_task_reports(*, node: Node, message: p.Report, named: set[int], existing: set[int]) -> None:
    """Each task report updates its run's TaskRun and, for the live run, moves the task."""
    ended_runs = set(
        TaskRun.objects.filter(node=node, task_id__in=named, state__in=_ENDED_BY_AGENT).values_list(
            "task_id", "attempt"
        )
    )
    for item in message.tasks:
        task_id, attempt = parse_run(item.task_id, item.attempt) or (0, 0)
        if task_id not in existing:
            continue  # deleted since: nothing to move
        if (task_id, attempt) in ended_runs and item.state in _ALIVE_REPORTS:
            # A process that exited does not run again: this report was overtaken by a later one.
            continue
        TaskRun.objects.update_or_create(
            node=node,
            task_id=task_id,
            attempt=attempt,
            defaults={
                "state": item.state.value,
                "pid": item.pid,
                "exit_code": item.exit_code,
                "device_uuid": item.device_uuid or "",
                "reason": item.reason[:500],
                "missing_since": None,  # the agent still knows this run
            },
        )
        task = Task.objects.get(pk=task_id)
        # Only the current attempt's live assignment here is moved by what the agent says;
        # a report about an older attempt (an orphan being stopped) only updates its TaskRun.
        live = (
            attempt == task.attempts
            and Assignment.objects.filter(node=node, task=task, released_at__isnull=True).exists()
        )
        _apply_task_report(node=node, task=task, report=item, live=live, attempt=attempt)


def _apply_partitions(*, node: Node, message: p.Report, gpus: dict[str, Gpu], now: datetime) -> None:
    """Each partition report replaces its GPU's layout, unless a newer generation's report came first."""
    applied = dict(GpuPartition.objects.filter(gpu__node=node).values_list("gpu__uuid", "generation"))
    for part in message.partitions:
        gpu = gpus.get(part.gpu_uuid)
        if gpu is None:
            continue
        if part.generation < applied.get(part.gpu_uuid, 0):
            continue  # an older layout's report, overtaken by a newer generation's
        GpuPartition.objects.update_or_create(
            gpu=gpu,
            defaults={
                "state": part.state.value,
                "generation": part.generation,
                "instances": [i.to_dict() for i in part.instances],
                "errors": [e.to_dict() for e in part.errors],
                "reason": part.reason[:500],
                "reported_at": agent_time(part.at_s, now),
            },
        )
        if part.state is p.PartitionState.GPU_LOST:
            gpu_unhealthy(gpu=gpu, kind="lost", xid=None, now=now)


class _Repeat(Exception):
    pass
