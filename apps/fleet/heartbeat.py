"""A node's heartbeat, one module: the fast path (Redis only) and the full path (PostgreSQL) (docs/fleet.md,
"Heartbeat load").

`answer` takes the request's `Authorization` header, `Content-Type` and body and returns the status, the
JSON body and extra headers. Two thin callers: `whalegen.config.wsgi`, which answers `POST` at the
protocol's path before Django's middleware and URL resolution (2,000 nodes beating every 10 s are 200
requests a second, and the framework's per-request work cost more than the heartbeat itself), and the
Django view at that path (`apps.fleet.api.views.heartbeat_view`: tests, the embedded default). The answers
are the ones a DRF view gave: 401 with `WWW-Authenticate` for a missing or unknown credential, 415 for a
body that is not JSON, 400 for a message that does not decode (`whalegen.protocol.decode_checked`), 403
for another node's id, 409 for another major protocol version, 200 with the `HeartbeatAck`.

The two paths:
- fast (`shortcut`, the WSGI front's heartbeats): a heartbeat that changes nothing since the node's last
  full one is recorded in Redis only (`apps.fleet.liveness.beat`: one Lua script instead of a
  transaction); its answer carries the generation last served. A node whose desired state was marked
  changed since (`apps.fleet.changes`) takes the full way, which answers the new generation: an agent
  holding an older one fetches.
- full (`agent_heartbeat_outcome`): the node and agent rows, the inventory, GPU events, telemetry and
  the runs the agent lists, then the desired state's generation; when it left nothing pending, the
  node's fingerprint is stored (`apps.fleet.liveness.remember`) so that its next unchanged heartbeats
  take the fast path.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, FloatField, Q, Value, When
from django.utils import timezone

from apps.common.errors import ApplicationError
from apps.fleet import changes, liveness
from apps.fleet.agents import (
    agent_time,
    check_node,
    check_version,
    desired_state_current,
    gpu_unhealthy,
    node_seen,
    sync_inventory,
)
from apps.fleet.credentials import credentials
from apps.fleet.models import GpuEvent, NodeAgent, TaskRun
from apps.fleet.runs import run_lose, runs_missing
from apps.fleet.selectors import credential_hash, parse_run
from apps.fleet.telemetry import samples_store
from apps.inventory.models import Node
from apps.scheduling.models import Assignment
from whalegen import protocol as p
from whalegen.config.logging import log_environ_add

log = logging.getLogger("whalegen.fleet")


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="agent"'}
_NEEDS_BEARER = "agent endpoints need `Authorization: Bearer <node token>`"

Answer = tuple[int, dict[str, Any], dict[str, str]]


@functools.lru_cache(maxsize=4096)
def _ack(generation: int) -> dict[str, Any]:
    return p.HeartbeatAck(generation=generation).to_dict()


def _refused(status: int, detail: str, headers: dict[str, str] | None = None) -> Answer:
    return status, {"detail": detail}, headers or {}


def answer(
    *,
    authorization: str,
    content_type: str,
    body: bytes,
    shortcut: bool = False,
    environ: dict[str, Any] | None = None,
) -> Answer:
    """One heartbeat request: 1. the credential (first, as DRF did), 2. the body, 3. the fast path when
    `shortcut` and the node's fingerprint holds, else 4. the full path: the message decoded and checked,
    recorded (`agent_heartbeat_outcome`), and 5. the node's fingerprint left when nothing is pending.
    `environ` is the request's WSGI environ (Django's `request.META`): the node's name is left there for
    the request's log lines, gunicorn's access line included, as the agent endpoints' authentication does."""
    # 1. The fast path's credential check is the fingerprint in Redis, which holds the credential's hash;
    # a credential this process has not seen yet (each web process has its own memory) is looked up
    # once (one indexed query) and may take the fast path too.
    parts = authorization.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return _refused(401, _NEEDS_BEARER, CHALLENGE)
    known = credentials.known(parts[1], within_s=liveness.FINGERPRINT_TTL_S) if shortcut else None
    node = None if known is not None else credentials.node_for(parts[1])
    if known is None and node is None:
        return _refused(401, "unknown node token", CHALLENGE)
    if shortcut and known is None:
        known = credentials.known(parts[1], within_s=liveness.FINGERPRINT_TTL_S)
    if environ is not None:  # the node on this request's log lines, as the agent endpoints' authentication
        log_environ_add(environ, node=known.name if known is not None else getattr(node, "name", None))
    # 2. The body.
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return _refused(415, f'Unsupported media type "{content_type}" in request.')
    try:
        data = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError) as error:
        return _refused(400, f"JSON parse error - {error}")
    now = timezone.now()
    # 3. The fast path: Redis only, when the heartbeat repeats the node's fingerprint.
    if known is not None:
        generation = liveness.beat(
            node_id=known.node_id, data=data, body=body, now=now, credential=known.digest
        )
        if generation is not None:
            # The protocol's encoding, remembered per generation (a copy: the caller owns its answer).
            return 200, dict(_ack(generation)), {}
        node = node or credentials.node_for(parts[1])
        if node is None:
            return _refused(401, "unknown node token", CHALLENGE)
    # 4. The full path.
    try:
        message = p.decode_checked(p.Heartbeat, data)
    except p.ProtocolError as error:
        return _refused(400, str(error))
    assert node is not None
    # Read before the desired state is built: a writer committing meanwhile moves the mark past this one,
    # so the next beat takes the full way and answers the generation with that change.
    mark = changes.read(node.pk) if shortcut else None
    try:
        outcome = agent_heartbeat_outcome(node=node, message=message, now=now)
    except ApplicationError as error:
        return _refused(error.status, error.message)
    except Node.DoesNotExist:  # deleted since its credential was remembered
        credentials.forget(node.pk)
        return _refused(401, "unknown node token", CHALLENGE)
    # 5. The fingerprint, for the node's next heartbeats that change nothing.
    if shortcut and outcome.quiet:
        digest = credential_hash(parts[1])
        # Checked against the row, not the memory: a credential replaced in another process within
        # WHALEGEN_AUTH_CACHE_S must not be remembered as the node's (its fingerprint would outlive it).
        if Node.objects.filter(pk=node.pk, agent_credential_hash=digest).exists():
            liveness.remember(
                node_id=node.pk,
                data=data,
                message=message,
                credential=digest,
                generation=outcome.ack.generation,
                telemetry_at=outcome.telemetry_at,
                mark=mark,
            )
    return 200, outcome.ack.to_dict(), {}


# ------------------------------------------------------------------------------------------ full path


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
    check_node(node, message.node_id)
    check_version(message.protocol_version)
    declared: list[TaskRun] = []
    with transaction.atomic():
        # 0. The node row first, the agent row after: the scheduling cycle locks them in that order (and
        # quotas before both, which a heartbeat never touches here), so the two can never deadlock.
        _seen_beat(node=node, now=now, agent_version=message.agent_version)
        beat = _agent_beat(node=node, message=message, now=now)
        gpus = sync_inventory(node=node, inventory=message.inventory, lost=set(message.lost_gpus), now=now)
        # 1. Events: Xid 79 (fatal) or a double-bit ECC error takes the GPU out of placement.
        for event in message.events:
            gpu = gpus.get(event.gpu_uuid)
            if gpu is None:
                continue
            at = agent_time(event.at_s, now)
            if event.fatal or event.xid == 79 or event.kind == "ecc_double":
                gpu_unhealthy(gpu=gpu, kind=event.kind, xid=event.xid, now=at)
            else:
                GpuEvent.objects.create(gpu=gpu, kind=event.kind, xid=event.xid, fatal=False, at=at)
        # 2. Telemetry for profiles: one row per GPU sample, one per task process sample, at most once
        # per WHALEGEN_TELEMETRY_SAMPLE_S per node (claimed in the agent row's UPDATE).
        if beat.telemetry_claimed:
            samples_store(node=node, message=message, gpus=gpus, now=now)
        # 3. Runs the agent no longer supervises but never reported ended (1.1 agents list them).
        alive = list(TaskRun.objects.filter(node=node, state__in=TaskRun.ALIVE)) if beat.any_alive else []
        if message.running is not None and alive:
            declared = runs_missing(runs=alive, running=message.running, now=now)
    # 4. Runs missing past the grace are declared lost, each in its own transaction with quotas locked
    # first (the cycle's order). A crash before one commits leaves it alive and missing: the next
    # heartbeat declares it again.
    for run in declared:
        run_lose(node=node, run=run, now=now)
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
    """`node_seen` for the heartbeat path: the same change as one `UPDATE … RETURNING` (no ORM expression
    compilation; the heartbeat's largest single cost was building that statement)."""
    if connection.vendor != "postgresql":  # the embedded SQLite default: the ORM's portable UPDATE
        node_seen(node=node, now=now, agent_version=agent_version)
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


# The agent row of a heartbeat, in one statement (docs/fleet.md, "Node health" 3): `raw` = receive
# time − the agent's send time = the agents' clock offset + delivery delay. The lowest `raw` seen
# (`clock_offset_s`) stands for the offset; how far this heartbeat is above it is the delay the plane
# added (`heartbeat_lag_s`). The agent's own send gap (its clock only, so skew-free) shows a loop slowed
# down by a slow plane. Telemetry is claimed here when due (the row lock makes one of two racing
# heartbeats the one that stores it). Every right-hand side reads the row as it was. The offset follows
# a `raw` above it by `liveness.OFFSET_CREEP` a heartbeat.
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
        "creep": liveness.OFFSET_CREEP,
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
            default=F("clock_offset_s") + liveness.OFFSET_CREEP * (Value(raw) - F("clock_offset_s")),
            output_field=FloatField(),
        ),
        "heartbeat_lag_s": Case(
            When(fresh, then=Value(0.0)),
            default=(1 - liveness.OFFSET_CREEP) * (Value(raw) - F("clock_offset_s")),
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
