"""Writes for the agent side of the plane: node credentials, registration, heartbeats, the desired-state
generation, reports that drive the task state machine, node loss, cordon and drain.

Every function acts on one node, the one the caller authenticated as (agents) or named (operators).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    FloatField,
    Max,
    OuterRef,
    PositiveBigIntegerField,
    Q,
    Value,
    When,
)
from django.utils import timezone

from apps.common.errors import Conflict, NotAllowed
from apps.fleet import changes, liveness
from apps.fleet.credentials import credentials_changed
from apps.fleet.models import (
    AgentReport,
    FleetIngestion,
    GpuEvent,
    GpuPartition,
    GpuSample,
    NodeAgent,
    NodeJoin,
    TaskRun,
    TaskSample,
)
from apps.fleet.selectors import (
    credential_hash,
    desired_digest,
    desired_state_build,
    node_gpus,
    parse_run,
)
from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.logs.services import log_chunks_check, log_chunks_store
from apps.scheduling.models import Assignment
from apps.workloads.models import Quota, Task
from apps.workloads.services import task_transition
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")

LIVE_TASK_STATES = frozenset({Task.State.ASSIGNED, Task.State.RUNNING})


class ProtocolMismatch(Conflict):
    """The agent speaks another major protocol version (409)."""


def _when(at_s: float | None, default: datetime) -> datetime:
    return datetime.fromtimestamp(at_s, tz=UTC) if at_s else default


# ---------------------------------------------------------------------------------------- credentials


def node_token_issue(*, node: Node) -> str:
    """A new agent credential for `node`; the old one stops working. Plaintext returned once."""
    raw = "wgn_" + secrets.token_urlsafe(32)
    Node.objects.filter(pk=node.pk).update(agent_credential_hash=credential_hash(raw))
    node.agent_credential_hash = credential_hash(raw)
    credentials_changed()  # the old credential is forgotten by the heartbeat path of this process now
    # And by every process's shortcut (its fingerprint holds the credential), now and once committed.
    liveness.forget([node.pk])
    transaction.on_commit(lambda: liveness.forget([node.pk]))
    return raw


# ----------------------------------------------------------------------------------- register / beat


def _check_version(version: str) -> None:
    if not p.compatible(version):
        raise ProtocolMismatch(
            f"agent protocol {version} is not compatible with the plane's {p.PROTOCOL_VERSION} "
            "(major versions must match)"
        )


def _sync_inventory(
    *, node: Node, inventory: tuple[p.GpuInventory, ...], lost: set[str], now: datetime
) -> dict[str, Gpu]:
    """Match reported GPUs to ours by NVML index; the agent's UUID is the truth (ours may be seeded).
    Returns the node's GPUs by (adopted) UUID, in index order, as `node_gpus` reads them (the
    heartbeat's desired state is built from them)."""
    gpus = {gpu.index: gpu for gpu in node_gpus(node=node)}
    for item in inventory:
        gpu = gpus.get(item.index)
        if gpu is None:
            log.warning(
                "node %s reports unknown GPU %d (%s)",
                node.name,
                item.index,
                item.uuid,
                extra={"node": node.name},
            )
            continue
        if gpu.uuid != item.uuid:
            if Gpu.objects.filter(uuid=item.uuid).exclude(pk=gpu.pk).exists():
                log.error(
                    "node %s: GPU UUID %s is another GPU's; kept %s",
                    node.name,
                    item.uuid,
                    gpu.uuid,
                    extra={"node": node.name},
                )
            else:
                Gpu.objects.filter(pk=gpu.pk).update(uuid=item.uuid, updated_at=now)
                gpu.uuid = item.uuid
        if (item.lost or item.uuid in lost) and gpu.health != Gpu.Health.UNHEALTHY:
            _gpu_unhealthy(gpu=gpu, kind="lost", xid=None, now=now)
    return {gpu.uuid: gpu for gpu in gpus.values()}


def _gpu_unhealthy(*, gpu: Gpu, kind: str, xid: int | None, now: datetime) -> None:
    """Take a GPU out of placement (health sticks: a lost GPU needs a reset and an operator)."""
    if (
        Gpu.objects.filter(pk=gpu.pk)
        .exclude(health=Gpu.Health.UNHEALTHY)
        .update(health=Gpu.Health.UNHEALTHY, updated_at=now)
    ):
        GpuEvent.objects.create(gpu=gpu, kind=kind, xid=xid, fatal=True, at=now)
        Node.objects.filter(pk=gpu.node_id).update(version=F("version") + 1)


def _seen(*, node: Node, now: datetime, agent_version: str) -> None:
    """A sign of life: record it, and bring a lost node back (its orphans are stopped via desired state).

    One UPDATE whatever the node's state (the heartbeat path stays cheap): the return from `lost` is
    decided in SQL on the row as it is, never on a copy read earlier.
    """
    # Back to what it was lost from: a node an operator cordoned (or was draining: its tasks were requeued
    # when it was lost, so the drain is done) stays out of placement until uncordoned.
    held = [Node.State.CORDONED, Node.State.DRAINING]
    was_lost = Q(state=Node.State.LOST)
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat_at=now,
        agent_version=agent_version[:32],
        state=Case(
            When(was_lost & Q(state_before_lost__in=held), then=Value(Node.State.CORDONED)),
            When(was_lost, then=Value(Node.State.READY)),
            default=F("state"),
        ),
        state_before_lost=Case(When(was_lost, then=Value("")), default=F("state_before_lost")),
        version=Case(
            When(was_lost, then=F("version") + 1),
            default=F("version"),
            output_field=PositiveBigIntegerField(),
        ),
    )
    if node.state == Node.State.LOST:
        node.refresh_from_db()
        log.info(
            "node %s is back after being lost (now %s)", node.name, node.state, extra={"node": node.name}
        )
    else:
        node.last_heartbeat_at = now


@transaction.atomic
def agent_register(*, node: Node, message: p.Register, now: datetime | None = None) -> p.Registered:
    now = now or timezone.now()
    _check_version(message.protocol_version)
    # The node row first, the agent row after: the scheduling cycle's lock order (no deadlock with it).
    _seen(node=node, now=now, agent_version=message.agent_version)
    agent, _ = NodeAgent.objects.get_or_create(node=node)
    NodeAgent.objects.filter(pk=agent.pk).update(
        hostname=message.hostname[:255], protocol_version=message.protocol_version[:16], registered_at=now
    )
    _sync_inventory(node=node, inventory=message.inventory, lost=set(), now=now)
    return p.Registered(
        node_id=str(node.pk),
        heartbeat_interval_s=float(settings.WHALEGEN_AGENT_HEARTBEAT_S),
        poll_wait_s=float(settings.WHALEGEN_AGENT_POLL_WAIT_S),
        # An agent that lost its state restarts at seq 1; it must number above this, or its reports
        # are taken for repeats (acknowledged, never applied).
        stored_seq=AgentReport.objects.filter(node=node).aggregate(top=Max("seq"))["top"] or 0,
        lease_s=run_lease_s(),
    )


def run_lease_s() -> float:
    """How long a run may go on after its agent's last acknowledged heartbeat (protocol 1.4's fence).

    The plane declares a node lost after WHALEGEN_NODE_LOST_HEARTBEATS heartbeat intervals of silence
    and then places its work elsewhere; the run must be gone by then, stop grace included, with one
    interval of margin for a heartbeat in flight. Floored at two intervals, so one late heartbeat never
    stops a healthy run (with the defaults: 3 × 10 − 10 − 10 = 10 s, floored to 20 s).
    """
    interval = float(settings.WHALEGEN_AGENT_HEARTBEAT_S)
    lease = (
        interval * settings.WHALEGEN_NODE_LOST_HEARTBEATS - settings.WHALEGEN_AGENT_STOP_GRACE_S - interval
    )
    return max(lease, 2 * interval)


def _check_node(node: Node, node_id: str) -> None:
    if node_id != str(node.pk):
        raise NotAllowed(f"this credential belongs to node {node.pk}; it cannot act for node {node_id!r}")


def agent_heartbeat(*, node: Node, message: p.Heartbeat, now: datetime | None = None) -> p.HeartbeatAck:
    """Record a heartbeat; answer the desired-state generation (`agent_heartbeat_outcome`)."""
    return agent_heartbeat_outcome(node=node, message=message, now=now).ack


@dataclass(frozen=True)
class HeartbeatOutcome:
    """A heartbeat taken the full way: the answer, and whether it left nothing for the next heartbeat
    to check (`quiet`: the node is not lost and every run the plane believes alive there was listed,
    so a next heartbeat with the same content may skip PostgreSQL, `apps.fleet.liveness`)."""

    ack: p.HeartbeatAck
    quiet: bool
    telemetry_at: datetime | None


def agent_heartbeat_outcome(
    *, node: Node, message: p.Heartbeat, now: datetime | None = None
) -> HeartbeatOutcome:
    """Record a heartbeat; answer the desired-state generation.

    The steady state (docs/fleet.md, "Heartbeat load") of a node with nothing assigned and no run alive
    is three statements: one `UPDATE … RETURNING` of the node row, one of the agent row (pace, telemetry
    claim, and whether anything is assigned to the node or alive on it), the GPUs; telemetry, due once
    per WHALEGEN_TELEMETRY_SAMPLE_S, is one multi-row INSERT. A node with work reads its alive runs and
    live assignments too; nothing is written that does not change, and the desired state is built from
    the rows the heartbeat read rather than read again.
    """
    now = now or timezone.now()
    _check_node(node, message.node_id)
    _check_version(message.protocol_version)
    declared: list[TaskRun] = []
    with transaction.atomic():
        # 0. The node row first, the agent row after: the scheduling cycle locks them in that order (and
        # quotas before both, which a heartbeat never touches here), so the two can never deadlock.
        _seen_beat(node=node, now=now, agent_version=message.agent_version)
        beat = _agent_beat(node=node, message=message, now=now)
        gpus = _sync_inventory(node=node, inventory=message.inventory, lost=set(message.lost_gpus), now=now)
        # 1. Events: Xid 79 (fatal) or a double-bit ECC error takes the GPU out of placement.
        for event in message.events:
            gpu = gpus.get(event.gpu_uuid)
            if gpu is None:
                continue
            at = _when(event.at_s, now)
            if event.fatal or event.xid == 79 or event.kind == "ecc_double":
                _gpu_unhealthy(gpu=gpu, kind=event.kind, xid=event.xid, now=at)
            else:
                GpuEvent.objects.create(gpu=gpu, kind=event.kind, xid=event.xid, fatal=False, at=at)
        # 2. Telemetry for profiles: one row per GPU sample, one per task process sample, at most once
        # per WHALEGEN_TELEMETRY_SAMPLE_S per node (claimed in the agent row's UPDATE).
        if beat.telemetry_claimed:
            _store_telemetry(node=node, message=message, gpus=gpus, now=now)
        # 3. Runs the agent no longer supervises but never reported ended (1.1 agents list them).
        alive = list(TaskRun.objects.filter(node=node, state__in=TaskRun.ALIVE)) if beat.any_alive else []
        if message.running is not None and alive:
            declared = _runs_missing(runs=alive, running=message.running, now=now)
    # 4. Runs missing past the grace are declared lost, each in its own transaction with quotas locked
    # first (the cycle's order). A crash before one commits leaves it alive and missing: the next
    # heartbeat declares it again.
    for run in declared:
        _run_lose(node=node, run=run, now=now)
    if declared:  # runs and tasks changed under the rows read above: build from fresh reads
        ack = p.HeartbeatAck(generation=desired_state_current(node=node, now=now).generation)
        return HeartbeatOutcome(ack=ack, quiet=False, telemetry_at=beat.agent.telemetry_at)
    desired = desired_state_current(
        node=node,
        now=now,
        agent=beat.agent,
        gpus=list(gpus.values()),
        alive_runs=[(run.task_id, run.attempt) for run in alive],
        # Nothing assigned here (not even a released-but-unreleased row): no live assignment to read.
        nothing_assigned=not beat.any_assigned,
    )
    listed = (
        None
        if message.running is None
        else {run for item in message.running if (run := parse_run(item.task_id, item.attempt)) is not None}
    )
    quiet = node.state != Node.State.LOST and (
        listed is None or listed == {(run.task_id, run.attempt) for run in alive}
    )
    return HeartbeatOutcome(
        ack=p.HeartbeatAck(generation=desired.generation), quiet=quiet, telemetry_at=beat.agent.telemetry_at
    )


_NODE = Node._meta.db_table
_AGENT = NodeAgent._meta.db_table
_ASSIGNMENT = Assignment._meta.db_table
_RUN = TaskRun._meta.db_table

# The node row of a heartbeat, in one statement: the return from `lost` is decided on the row as it is
# (locked by the UPDATE), and the state before and after come back with it.
_NODE_BEAT_SQL = f"""
UPDATE {_NODE} AS n SET
    last_heartbeat_at = %(now)s,
    agent_version = %(agent_version)s,
    state = CASE WHEN old.state <> %(lost)s THEN old.state
                 WHEN old.state_before_lost = ANY(%(held)s) THEN %(cordoned)s ELSE %(ready)s END,
    state_before_lost = CASE WHEN old.state = %(lost)s THEN '' ELSE old.state_before_lost END,
    version = CASE WHEN old.state = %(lost)s THEN old.version + 1 ELSE old.version END
FROM (SELECT id, state, state_before_lost, version FROM {_NODE} WHERE id = %(node)s FOR UPDATE) AS old
WHERE n.id = old.id
RETURNING old.state, n.state
"""


def _seen_beat(*, node: Node, now: datetime, agent_version: str) -> None:
    """`_seen` for the heartbeat path: the same change as one `UPDATE … RETURNING` (no ORM expression
    compilation; the heartbeat's largest single cost was building that statement)."""
    if connection.vendor != "postgresql":  # the embedded SQLite default: the ORM's portable UPDATE
        _seen(node=node, now=now, agent_version=agent_version)
        return
    held = [Node.State.CORDONED.value, Node.State.DRAINING.value]
    params = {"now": now, "agent_version": agent_version[:32], "node": node.pk, "held": held,
              "lost": Node.State.LOST.value, "cordoned": Node.State.CORDONED.value,
              "ready": Node.State.READY.value}  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_NODE_BEAT_SQL, params)
        row = cursor.fetchone()
    if row is None:
        raise Node.DoesNotExist(f"node {node.pk} is gone")
    before, after = row
    node.last_heartbeat_at = now
    node.state = after
    if before == Node.State.LOST:
        node.refresh_from_db()
        log.info(
            "node %s is back after being lost (now %s)", node.name, node.state, extra={"node": node.name}
        )


@dataclass(frozen=True)
class _Beat:
    """What the agent row's UPDATE answered: the row's desired-state columns, whether this heartbeat
    claimed the telemetry slot, and whether anything is assigned to or alive on the node."""

    agent: NodeAgent
    telemetry_claimed: bool
    any_assigned: bool
    any_alive: bool


# How fast the recorded clock offset follows a receive-minus-send difference above it: slow enough that
# a minute of plane congestion still shows as lag, fast enough to follow an agent clock that drifts or
# steps (2 % a heartbeat: half of a step is absorbed after ~35 heartbeats).
_OFFSET_CREEP = 0.02

# The agent row of a heartbeat, in one statement (docs/fleet.md, "Node health" 3): `raw` = receive
# time − the agent's send time = the agents' clock offset + delivery delay. The lowest `raw` seen
# (`clock_offset_s`) stands for the offset; how far this heartbeat is above it is the delay the plane
# added (`heartbeat_lag_s`). The agent's own send gap (its clock only, so skew-free) shows a loop slowed
# down by a slow plane. Telemetry is claimed here when due (the row lock makes one of two racing
# heartbeats the one that stores it). Every right-hand side reads the row as it was.
_AGENT_BEAT_SQL = f"""
UPDATE {_AGENT} AS a SET
    generation_applied = %(applied)s,
    protocol_version = %(protocol)s,
    last_sent_s = CASE WHEN last_sent_s IS NULL OR last_sent_s < %(sent)s THEN %(sent)s
                       ELSE last_sent_s END,
    heartbeat_gap_s = CASE WHEN last_sent_s IS NULL THEN NULL
                           WHEN last_sent_s < %(sent)s THEN %(sent)s - last_sent_s
                           ELSE heartbeat_gap_s END,
    clock_offset_s = CASE WHEN clock_offset_s IS NULL OR clock_offset_s >= %(raw)s THEN %(raw)s
                          ELSE clock_offset_s + %(creep)s * (%(raw)s - clock_offset_s) END,
    heartbeat_lag_s = CASE WHEN clock_offset_s IS NULL OR clock_offset_s >= %(raw)s THEN 0.0
                           ELSE (1 - %(creep)s) * (%(raw)s - clock_offset_s) END,
    telemetry_at = CASE WHEN old.due THEN %(now)s ELSE old.telemetry_at END
FROM (SELECT node_id, telemetry_at, telemetry_at IS NULL OR telemetry_at <= %(due_before)s AS due
      FROM {_AGENT} WHERE node_id = %(node)s FOR UPDATE) AS old
WHERE a.node_id = old.node_id
RETURNING a.generation, a.desired_digest, a.protocol_version, a.telemetry_at, old.due,
    EXISTS (SELECT 1 FROM {_ASSIGNMENT} WHERE node_id = %(node)s AND released_at IS NULL),
    EXISTS (SELECT 1 FROM {_RUN} WHERE node_id = %(node)s AND state = ANY(%(alive)s))
"""


def _agent_beat(*, node: Node, message: p.Heartbeat, now: datetime) -> _Beat:
    """Record the heartbeat on the agent row (one `UPDATE … RETURNING` in the steady state; the first
    heartbeat creates the row first)."""
    if connection.vendor != "postgresql":
        return _agent_beat_portable(node=node, message=message, now=now)
    params = {
        "applied": message.generation_applied,
        "protocol": message.protocol_version[:16],
        "sent": message.sent_at_s,
        "raw": now.timestamp() - message.sent_at_s,
        "creep": _OFFSET_CREEP,
        "now": now,
        "due_before": now - timedelta(seconds=settings.WHALEGEN_TELEMETRY_SAMPLE_S),
        "node": node.pk,
        "alive": sorted(TaskRun.ALIVE),
    }
    for _ in range(2):
        with connection.cursor() as cursor:
            cursor.execute(_AGENT_BEAT_SQL, params)
            row = cursor.fetchone()
        if row is not None:
            break
        NodeAgent.objects.get_or_create(node=node)
    assert row is not None
    generation, digest, protocol, telemetry_at, claimed, assigned, alive = row
    agent = NodeAgent(
        node_id=node.pk,
        generation=generation,
        desired_digest=digest,
        protocol_version=protocol,
        telemetry_at=telemetry_at,
    )
    agent._state.adding = False
    agent._state.db = connection.alias
    return _Beat(agent=agent, telemetry_claimed=claimed, any_assigned=bool(assigned), any_alive=bool(alive))


def _agent_beat_portable(*, node: Node, message: p.Heartbeat, now: datetime) -> _Beat:
    """`_agent_beat` for the embedded SQLite default, which has no `FOR UPDATE`, no arrays and no
    `RETURNING` of a joined row: the same changes through the ORM in a few statements (SQLite holds
    the database's one write lock for the whole transaction, so the reads cannot race)."""
    raw = now.timestamp() - message.sent_at_s
    sent = message.sent_at_s
    fresh = Q(clock_offset_s__isnull=True) | Q(clock_offset_s__gte=raw)
    pace = {
        "last_sent_s": Case(
            When(Q(last_sent_s__isnull=True) | Q(last_sent_s__lt=sent), then=Value(sent)),
            default=F("last_sent_s"),
        ),
        "heartbeat_gap_s": Case(
            When(last_sent_s__isnull=True, then=Value(None)),
            When(last_sent_s__lt=sent, then=Value(sent) - F("last_sent_s")),
            default=F("heartbeat_gap_s"),
            output_field=FloatField(),
        ),
        "clock_offset_s": Case(
            When(fresh, then=Value(raw)),
            default=F("clock_offset_s") + _OFFSET_CREEP * (Value(raw) - F("clock_offset_s")),
            output_field=FloatField(),
        ),
        "heartbeat_lag_s": Case(
            When(fresh, then=Value(0.0)),
            default=(1 - _OFFSET_CREEP) * (Value(raw) - F("clock_offset_s")),
            output_field=FloatField(),
        ),
    }
    rows = NodeAgent.objects.filter(node_id=node.pk)
    updates = {
        "generation_applied": message.generation_applied,
        "protocol_version": message.protocol_version[:16],
    }
    if not rows.update(**updates, **pace):
        NodeAgent.objects.get_or_create(node=node)
        rows.update(**updates, **pace)
    agent = rows.get()
    due_before = now - timedelta(seconds=settings.WHALEGEN_TELEMETRY_SAMPLE_S)
    claimed = agent.telemetry_at is None or agent.telemetry_at <= due_before
    if claimed:
        claimed = rows.filter(telemetry_at=agent.telemetry_at).update(telemetry_at=now) == 1
        agent.telemetry_at = now if claimed else agent.telemetry_at
    assigned = Assignment.objects.filter(node_id=node.pk, released_at__isnull=True).exists()
    alive = TaskRun.objects.filter(node_id=node.pk, state__in=TaskRun.ALIVE).exists()
    return _Beat(agent=agent, telemetry_claimed=claimed, any_assigned=assigned, any_alive=alive)


_SAMPLES_SQL = (
    f"INSERT INTO {GpuSample._meta.db_table} (gpu_id, at, mem_used_mib, mem_total_mib, util_gpu_pct, "
    "util_mem_pct, power_w, temperature_c, sm_clock_mhz, ecc_uncorrected_aggregate) VALUES "
)
_SAMPLE_ROW = "(" + ", ".join(["%s"] * 10) + ")"


def _store_telemetry(*, node: Node, message: p.Heartbeat, gpus: dict[str, Gpu], now: datetime) -> None:
    """Stamped with the plane's clock (agents' clocks may drift); within a heartbeat of the truth."""
    rows = [
        (gpus[s.gpu_uuid].pk, now, s.mem_used_mib, s.mem_total_mib, s.util_gpu_pct, s.util_mem_pct, s.power_w,
         s.temperature_c, s.sm_clock_mhz, s.ecc_uncorrected_aggregate)
        for s in message.telemetry
        if s.gpu_uuid in gpus
    ]  # fmt: skip
    if rows:  # one multi-row INSERT (the ORM's bulk_create cost more CPU to build than the insert took)
        with connection.cursor() as cursor:
            sql = _SAMPLES_SQL + ", ".join([_SAMPLE_ROW] * len(rows))
            cursor.execute(sql, [value for row in rows for value in row])
    runs = {s.pid: parse_run(s.task_id, s.attempt) for s in message.processes if s.task_id}
    task_ids = {run[0] for run in runs.values() if run is not None}
    if not task_ids:  # no task process sampled: nothing to check or store (not even a query to build)
        return
    # Only tasks this node was given: a process claiming another node's task is not recorded.
    mine = set(Assignment.objects.filter(node=node, task_id__in=task_ids).values_list("task_id", flat=True))
    TaskSample.objects.bulk_create(
        TaskSample(task_id=run[0], gpu=gpus[s.gpu_uuid], at=now, pid=s.pid, used_mib=s.used_mib)
        for s in message.processes
        if (run := runs.get(s.pid)) is not None and run[0] in mine and s.gpu_uuid in gpus
    )


def store_telemetry_rows(
    *,
    batch: list[tuple[int, datetime, tuple[p.TelemetrySample, ...], tuple[p.ProcessSample, ...]]],
    gpus: dict[int, dict[str, Gpu]],
) -> None:
    """Telemetry of many heartbeats at once (the liveness flush): (node id, when, GPU samples, process
    samples) each, `gpus` by node id then UUID. The same rows `_store_telemetry` writes: GPU samples in
    multi-row INSERTs, task-process samples only for tasks the node was given."""
    rows = [
        (node_gpus[s.gpu_uuid].pk, at, s.mem_used_mib, s.mem_total_mib, s.util_gpu_pct, s.util_mem_pct,
         s.power_w, s.temperature_c, s.sm_clock_mhz, s.ecc_uncorrected_aggregate)
        for node_id, at, telemetry, _ in batch
        for s in telemetry
        if s.gpu_uuid in (node_gpus := gpus.get(node_id, {}))
    ]  # fmt: skip
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 1_000):  # bounded statements (10 parameters a row)
            chunk = rows[start : start + 1_000]
            sql = _SAMPLES_SQL + ", ".join([_SAMPLE_ROW] * len(chunk))
            cursor.execute(sql, [value for row in chunk for value in row])
    claimed = [(node_id, at, s) for node_id, at, _, processes in batch for s in processes if s.task_id]
    if not claimed:
        return
    wanted = {(node_id, run[0]) for node_id, _, s in claimed if (run := parse_run(s.task_id, s.attempt))}
    mine = set(
        Assignment.objects.filter(
            node_id__in={node_id for node_id, _ in wanted}, task_id__in={task_id for _, task_id in wanted}
        ).values_list("node_id", "task_id")
    )
    samples = []
    for node_id, at, s in claimed:
        run = parse_run(s.task_id, s.attempt)
        gpu = gpus.get(node_id, {}).get(s.gpu_uuid)
        if run is not None and (node_id, run[0]) in mine and gpu is not None:
            samples.append(TaskSample(task_id=run[0], gpu=gpu, at=at, pid=s.pid, used_mib=s.used_mib))
    TaskSample.objects.bulk_create(samples)


def _runs_missing(*, runs: list[TaskRun], running: tuple[p.RunningTask, ...], now: datetime) -> list[TaskRun]:
    """Runs the plane believes alive here (`TaskRun` starting/running) that the heartbeat does not list.

    A run first missing is stamped `missing_since`; listed again, the stamp clears. Missing for the grace
    period (as long as a node must be silent to be lost: `WHALEGEN_NODE_LOST_HEARTBEATS` ×
    `WHALEGEN_AGENT_HEARTBEAT_S`) it is to be declared `lost` (`_run_lose`): the agent dropped it without
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


def _run_lose(*, node: Node, run: TaskRun, now: datetime) -> None:
    """Declare a dropped run lost and, if it is its task's live attempt here, requeue the task: one
    transaction, quotas locked first (the cycle's lock order)."""
    assert run.missing_since is not None
    reason = (
        f"task {run.task_id} attempt {run.attempt} lost on {node.name}: the agent stopped listing it "
        f"{(now - run.missing_since).total_seconds():.0f} s ago and never reported how it ended"
    )
    with transaction.atomic():
        _lock_quotas([run.task_id])
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
            _requeue(task, via=Task.State.LOST, actor=f"agent:{node.name}", reason=reason)


def _lock_quotas(task_ids: list[int]) -> None:
    """Lock the quota rows of these tasks, ids ascending: the first lock of every transaction that may
    give a quota charge back while it also touches nodes, as the scheduling cycle locks quotas, then
    nodes, then tasks."""
    tasks = Task.objects.filter(pk__in=task_ids, tenant_id=OuterRef("tenant_id"), pool_id=OuterRef("pool_id"))
    list(Quota.objects.select_for_update().filter(Exists(tasks)).order_by("pk").values_list("pk", flat=True))


# ------------------------------------------------------------------------------------- desired state


def desired_state_current(
    *,
    node: Node,
    now: datetime | None = None,
    agent: NodeAgent | None = None,
    gpus: list[Gpu] | None = None,
    alive_runs: list[tuple[int, int]] | None = None,
    nothing_assigned: bool = False,
) -> p.DesiredState:
    """The node's desired state with its generation, raised when the content changed since last served.

    The generation is a counter on NodeAgent, bumped by compare-and-set on (generation, digest): the
    plane's writers (cycles, cancels, drains) need not know about agents, and two polls racing on one
    change bump it once. A caller that has just read the agent row, the GPUs (units prefetched) or the
    alive runs passes them (the heartbeat); the rest is read here. `nothing_assigned`: the caller has
    just seen that the node has no unreleased assignment (the heartbeat's agent-row UPDATE answers it).
    """
    now = now or timezone.now()
    if agent is None:
        agent, _ = NodeAgent.objects.get_or_create(node=node)
    desired = desired_state_build(
        node=node,
        now=now,
        agent_protocol=agent.protocol_version or p.PROTOCOL_VERSION,
        gpus=gpus,
        alive_runs=alive_runs,
        live=[] if nothing_assigned else None,
    )
    digest = desired_digest(desired)
    while agent.desired_digest != digest:
        bumped = NodeAgent.objects.filter(
            pk=agent.pk, generation=agent.generation, desired_digest=agent.desired_digest
        ).update(generation=agent.generation + 1, desired_digest=digest)
        agent.refresh_from_db()
        if bumped:
            break
    return p.DesiredState(
        generation=agent.generation,
        gpus=desired.gpus,
        tasks=desired.tasks,
        allow_mig_mode_change=desired.allow_mig_mode_change,
    )


def desired_state_wait(
    *, node: Node, known_generation: int, wait_s: float, step_s: float = 0.25
) -> p.DesiredState | None:
    """Long poll: the desired state as soon as its generation differs from the agent's, else None after
    `wait_s` (capped at 30 s).

    Waits on the node's change mark (`apps.fleet.changes`), not on rebuilds: 1. read the mark, then build
    (a writer committing in between moves the mark past what was read, so its change is built next);
    2. answer if the generation moved; 3. give the database connection back and wait for the mark to move
    (a waiting poll holds no connection: every idle agent would hold one); 4. rebuild when it moved, or
    answer nothing at the deadline. The safety net for a writer that did not mark is the rebuild each
    poll starts with: such a change waits at most one poll (`wait_s`), it is never stranded.
    """
    deadline = time.monotonic() + max(0.0, min(wait_s, 30.0))
    mark = changes.read(node.pk)
    while True:
        desired = desired_state_current(node=node)
        if desired.generation != known_generation:
            return desired
        _release_connection()
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return None
            seen, mark = mark, changes.wait(node.pk, mark, remaining_s, step_s)
            if mark is None or mark != seen:
                break  # moved (or unreadable: rebuild, at most once a step)


def _release_connection() -> None:
    """Close this thread's database connection before a long wait, unless a caller's transaction holds
    it (tests wrap each test in one). The next rebuild opens a new one: a connect per change or per poll,
    instead of a connection per idle agent."""
    if not connection.in_atomic_block:
        connection.close()


# ------------------------------------------------------------------------------------------ reports


def _move(task: Task, to_state: str, *, actor: str, reason: str, **fields: Any) -> bool:
    """One state change; False when another writer moved the task first (their move stands)."""
    try:
        task_transition(task=task, to_state=to_state, actor=actor, reason=reason[:500], **fields)
    except Conflict as error:
        log.info("task %s: %s not applied: %s", task.pk, to_state, error, extra={"task_id": task.pk})
        task.refresh_from_db()
        return False
    return True


def _requeue(task: Task, *, via: str, actor: str, reason: str) -> None:
    """assigned/running → lost|preempted → pending in one transaction: the attempt is counted, the
    assignment released (a crash between the two steps would leave the task lost, in no queue)."""
    with transaction.atomic():
        if task.state in LIVE_TASK_STATES and not _move(task, via, actor=actor, reason=reason):
            return
        if task.state in (Task.State.LOST, Task.State.PREEMPTED):
            _move(
                task, Task.State.PENDING, actor=actor, reason=reason, why_pending=f"requeued: {reason}"[:500]
            )


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
        if _move(task, to_state, actor=f"agent:{node.name}", reason=reason, exit_code=report.exit_code):
            return True
    return False


def _held_gpu_indexes(task: Task) -> str:
    """The device indexes of the GPUs a placed task holds, "0,1,2,3" (two small queries)."""
    live = Assignment.objects.filter(task=task, released_at__isnull=True)
    unit_ids = live.values_list("unit_ids", flat=True).first()
    indexes = sorted(
        set(ComputeUnit.objects.filter(pk__in=unit_ids or []).values_list("gpu__index", flat=True))
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
            _move(task, Task.State.RUNNING, actor=actor, reason=f"{what} (pid {report.pid}{where})")
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
            and not _move(task, Task.State.RUNNING, actor=actor, reason="started (seen at its end)")
        ):
            return
        to_state = Task.State.SUCCEEDED if report.state is p.TaskState.SUCCEEDED else Task.State.FAILED
        reason = f"exit code {report.exit_code}" if report.exit_code is not None else what
        if report.signal is not None:
            reason += f", signal {report.signal}"
        if report.reason and report.reason not in reason:
            reason += f": {report.reason}"
        _move(task, to_state, actor=actor, reason=reason, exit_code=report.exit_code)
        return
    # stopped / lost / rejected.
    if task.state == Task.State.PREEMPTED:
        _move(
            task,
            Task.State.PENDING,
            actor=actor,
            reason=f"stopped on {node.name} after preemption",
            why_pending="preempted; waiting for the next cycle",
        )
    elif live and task.state in LIVE_TASK_STATES:
        # The node gave up on a task the plane still wanted: not the task's fault, so it runs again.
        reason = f"{report.state.value} on {node.name}: {what}"
        _requeue(task, via=Task.State.LOST, actor=actor, reason=reason)


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
    _check_node(node, message.node_id)
    _check_version(message.protocol_version)
    # 1. Ownership: all or nothing, before anything is written.
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
    log_chunks_check(node=node, chunks=message.logs, reported=reported)
    agent, _ = NodeAgent.objects.get_or_create(node=node)
    # 2. Store and apply in one transaction; the unique (node, seq) makes a concurrent repeat fail here.
    try:
        with transaction.atomic():
            # The scheduling cycle's lock order: quotas (a report may end a task and give its charge
            # back), then the node, then tasks. Rows of this node written below (reports, runs) take a
            # share lock on the node row, which must not be held while waiting for a quota.
            _lock_quotas(sorted(existing))
            Node.objects.select_for_update().filter(pk=node.pk).values_list("pk").first()
            if AgentReport.objects.filter(node=node, seq=message.seq).exists():
                raise _Repeat
            # The output itself is stored once, in apps.logs (capped there); the report keeps its outline.
            payload = message.to_dict()
            payload["logs"] = [{**chunk, "lines": len(chunk["lines"])} for chunk in payload.get("logs", [])]
            AgentReport.objects.create(node=node, seq=message.seq, payload=payload)
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
                        "reported_at": _when(part.at_s, now),
                    },
                )
                if part.state is p.PartitionState.GPU_LOST:
                    _gpu_unhealthy(gpu=gpu, kind="lost", xid=None, now=now)
            log_chunks_store(node=node, chunks=message.logs)
    except (_Repeat, IntegrityError):
        pass
    stored = AgentReport.objects.filter(node=node).aggregate(top=Max("seq"))["top"] or 0
    NodeAgent.objects.filter(pk=agent.pk).update(stored_seq=stored)
    # Runs may have changed state: the next heartbeat compares them the full way (apps.fleet.liveness).
    liveness.forget([node.pk])
    if message.tasks:
        # A run that ended leaves the stop list and releases a run held back behind it (no double
        # occupancy): the node's waiting poll must rebuild.
        changes.node_changed([node.pk])
    return p.ReportAck(stored_seq=stored)


class _Repeat(Exception):
    pass


# ------------------------------------------------------------------------------------- node health


def _live_tasks(node: Node) -> list[Task]:
    task_ids = Assignment.objects.filter(node=node, released_at__isnull=True).values("task_id")
    return list(Task.objects.filter(pk__in=task_ids).order_by("pk"))


@dataclass(frozen=True)
class FleetPace:
    """How the plane hears its agents right now (docs/fleet.md, "Node health").

    `interval_s`: the heartbeat interval that counts, at least `WHALEGEN_AGENT_HEARTBEAT_S`, stretched to
    the slowest send gap agents heard lately report (a plane slow to answer slows the agents' loops),
    at most twice it. `lag_s`: the largest intake delay of those heartbeats (how much later than its
    quickest a heartbeat arrives), at most the loss threshold. Silence counts only past
    `NODE_LOST_HEARTBEATS × interval_s + lag_s`: what the plane failed to receive, not its own slowness.
    """

    interval_s: float
    lag_s: float
    lost_after_s: float
    deaf_after_s: float


def fleet_pace(*, now: datetime) -> FleetPace:
    """One aggregate over the agents heard within the loss threshold."""
    beat_s = float(settings.WHALEGEN_AGENT_HEARTBEAT_S)
    count = settings.WHALEGEN_NODE_LOST_HEARTBEATS
    recent = NodeAgent.objects.filter(node__last_heartbeat_at__gte=now - timedelta(seconds=count * beat_s))
    seen = recent.aggregate(gap=Max("heartbeat_gap_s"), lag=Max("heartbeat_lag_s"))
    interval_s = min(max(beat_s, seen["gap"] or 0.0), 2 * beat_s)
    lag_s = min(max(seen["lag"] or 0.0, 0.0), count * beat_s)
    return FleetPace(
        interval_s=interval_s,
        lag_s=lag_s,
        lost_after_s=count * interval_s + lag_s,
        # Deaf sooner than any healthy node could be lost: a healthy node's last heartbeat is at most one
        # interval older than the fleet's latest, so `(count − 1) intervals` of total silence comes first.
        deaf_after_s=max(count - 1, 1) * interval_s + lag_s,
    )


def _ingestion_check(*, now: datetime, pace: FleetPace) -> datetime | None:
    """Whether the plane hears its fleet; records deafness and its end on the one FleetIngestion row
    (locked: concurrent checks take turns). Returns None while deaf (declare nobody lost), else the
    instant silence may be counted from (when hearing last resumed; the epoch if never deaf)."""
    epoch = datetime.fromtimestamp(0, tz=UTC)
    with transaction.atomic():
        FleetIngestion.objects.get_or_create(pk=1)
        ingestion = FleetIngestion.objects.select_for_update().get(pk=1)
        # With one node heard, "all silent" is that node's own silence: the plane cannot tell, and a node
        # that stops must be found. From two up, all of them falling silent at once is the plane's fault.
        heard = Node.objects.exclude(state=Node.State.LOST).filter(last_heartbeat_at__isnull=False)
        seen = heard.aggregate(at=Max("last_heartbeat_at"), nodes=Count("pk"))
        latest = seen["at"]
        deaf = seen["nodes"] >= 2 and (now - latest).total_seconds() > pace.deaf_after_s
        if deaf and ingestion.deaf_since is None:
            ingestion.deaf_since = latest
            log.warning(
                "no heartbeat from any node since %s: the plane's own intake looks down (web tier, proxy); "
                "no node is declared lost until heartbeats arrive again",
                latest.isoformat(timespec="seconds") if latest else "never",
            )
        elif not deaf and ingestion.deaf_since is not None:
            log.warning(
                "heartbeats arrive again after a gap since %s: every node gets %.0f s from now",
                ingestion.deaf_since.isoformat(timespec="seconds"),
                pace.lost_after_s,
            )
            ingestion.deaf_since = None
            ingestion.resumed_at = now
        ingestion.checked_at = now
        ingestion.save()
    if deaf:
        return None
    return ingestion.resumed_at or epoch


def nodes_mark_lost(*, now: datetime | None = None) -> list[int]:
    """Mark lost every node the plane failed to hear from, and requeue its tasks. Returns the node ids.

    Steps: 1. finish what an earlier check started (live work on a node already lost is requeued:
    a crash mid-way never strands it); 2. if no node at all was heard lately, the plane is deaf, not the
    fleet dead: nobody is lost; 3. a node is lost once silent past `FleetPace.lost_after_s`, counted
    from its last heartbeat or from when the plane heard again after being deaf, whichever is later
    (a node that never heartbeated counts from its creation). Each node is lost and its tasks requeued
    in one transaction (quotas, then the node, then its tasks: the cycle's lock order).
    """
    now = now or timezone.now()
    # 0. Heartbeats recorded in Redis only (apps.fleet.liveness) reach PostgreSQL first: silence is
    # judged on every heartbeat received, whichever way it was taken.
    flushed = liveness.flush()
    stranded = Assignment.objects.filter(released_at__isnull=True, node__state=Node.State.LOST)
    for node in Node.objects.filter(pk__in=stranded.values("node_id")).order_by("pk"):
        _node_lose(node=node, now=now, reason=f"node {node.name} is lost (requeued by a later check)")
    if not flushed.complete:
        return []  # heartbeats held in Redis did not all reach PostgreSQL: silence cannot be judged now
    pace = fleet_pace(now=now)
    heard_from = _ingestion_check(now=now, pace=pace)
    if heard_from is None:
        return []
    deadline = now - timedelta(seconds=pace.lost_after_s)
    if heard_from > deadline:
        return []  # hearing again only lately: every node still has its full threshold
    candidates = Node.objects.exclude(state=Node.State.LOST).filter(
        Q(last_heartbeat_at__lt=deadline) | Q(last_heartbeat_at__isnull=True, created_at__lt=deadline)
    )
    lost: list[int] = []
    for node in candidates.order_by("pk"):
        seen = node.last_heartbeat_at.isoformat(timespec="seconds") if node.last_heartbeat_at else "never"
        reason = (
            f"node {node.name} lost: no heartbeat for {pace.lost_after_s:.0f} s "
            f"({settings.WHALEGEN_NODE_LOST_HEARTBEATS} × {pace.interval_s:.0f} s"
            f"{f' + {pace.lag_s:.1f} s intake delay' if pace.lag_s >= 0.1 else ''}; last {seen})"
        )
        if _node_lose(node=node, now=now, reason=reason, expect=node):
            lost.append(node.pk)
    return lost


def _node_lose(*, node: Node, now: datetime, reason: str, expect: Node | None = None) -> bool:
    """In one transaction: lock the quotas of the node's live tasks, mark the node lost (compare-and-set
    on what the check saw, `expect`, so a heartbeat landing meanwhile keeps it; without `expect` the node
    must still be lost), requeue its live tasks. A failure rolls all of it back for the next check."""
    try:
        with transaction.atomic():
            _lock_quotas([task.pk for task in _live_tasks(node)])
            if expect is not None:
                went = Node.objects.filter(
                    pk=node.pk, state=expect.state, last_heartbeat_at=expect.last_heartbeat_at
                ).update(state=Node.State.LOST, state_before_lost=expect.state, version=F("version") + 1)
                if not went:
                    return False
                log.warning(reason, extra={"node": node.name})
                # Its next heartbeat must take the full way (which brings a node back from lost).
                transaction.on_commit(lambda: liveness.forget([node.pk]))
            elif not Node.objects.select_for_update().filter(pk=node.pk, state=Node.State.LOST).exists():
                return False  # its agent came back meanwhile: its work is its own again
            for task in _live_tasks(node):
                _requeue(task, via=Task.State.LOST, actor="system:node-health", reason=reason)
    except Exception:
        # One node's failure must not stop the others' checks; nothing of this node was kept.
        log.exception(
            "node %s: marking it lost failed; the next check retries", node.name, extra={"node": node.name}
        )
        return False
    return True


def node_cordon(*, node: Node, actor: str) -> Node:
    """Take nothing new; what runs keeps running."""
    if node.state == Node.State.LOST:
        raise Conflict(f"node {node.name} is lost; it becomes ready again when its agent heartbeats")
    Node.objects.filter(pk=node.pk).update(state=Node.State.CORDONED, version=F("version") + 1)
    log.info("%s cordoned node %s", actor, node.name, extra={"node": node.name})
    node.refresh_from_db()
    return node


def node_uncordon(*, node: Node, actor: str) -> Node:
    if node.state == Node.State.LOST:
        raise Conflict(f"node {node.name} is lost; it becomes ready again when its agent heartbeats")
    if NodeJoin.objects.filter(node=node, approval_required=True, approved_at__isnull=True).exists():
        # The approval's cordon is lifted only by approving (apps.fleet.join.node_approve).
        raise Conflict(
            f"node {node.name} joined with a token that needs approval and is not approved yet; approve "
            f"it (POST /api/v1/nodes/{node.pk}/approve/ or whalegen approve node "
            f"{node.cluster.name}/{node.name})"
        )
    Node.objects.filter(pk=node.pk).update(state=Node.State.READY, version=F("version") + 1)
    log.info("%s uncordoned node %s", actor, node.name, extra={"node": node.name})
    node.refresh_from_db()
    return node


def node_drain(*, node: Node, actor: str) -> Node:
    """Cordon, preempt the preemptible tasks (back to pending, attempt counted, stopped on the agent),
    let the others finish. The node stays `draining` until it holds no task, then becomes `cordoned`."""
    if node.state == Node.State.LOST:
        raise Conflict(f"node {node.name} is lost; there is nothing on it to drain")
    with transaction.atomic():
        # Quotas before the node (the cycle's order): a task out of attempts fails here and gives its
        # charge back.
        _lock_quotas([task.pk for task in _live_tasks(node)])
        Node.objects.filter(pk=node.pk).update(state=Node.State.DRAINING, version=F("version") + 1)
    reason = f"node {node.name} drained by {actor}"
    for task in _live_tasks(node):
        if task.preemptible and task.state in LIVE_TASK_STATES:
            with transaction.atomic():
                _lock_quotas([task.pk])
                _requeue(task, via=Task.State.PREEMPTED, actor=actor, reason=reason)
    drains_complete()
    node.refresh_from_db()
    return node


def drains_complete() -> list[int]:
    """Draining nodes that hold no live task become cordoned (the drain is done)."""
    busy = Assignment.objects.filter(released_at__isnull=True).values("node_id")
    idle = Node.objects.filter(state=Node.State.DRAINING).exclude(pk__in=busy)
    done = list(idle.values_list("pk", flat=True))
    Node.objects.filter(pk__in=done, state=Node.State.DRAINING).update(
        state=Node.State.CORDONED, version=F("version") + 1
    )
    return done
