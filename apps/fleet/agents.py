"""Agent services: registration, the desired state, and the checks and inventory writes that the
agent's three messages (register, heartbeat: `apps.fleet.heartbeat`, report: `apps.fleet.reports`)
share.

Every function acts on one node, the one the caller authenticated as.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Max, PositiveBigIntegerField, Q, Value, When
from django.utils import timezone

from apps.common.errors import Conflict, NotAllowed
from apps.fleet import changes
from apps.fleet.models import AgentReport, GpuEvent, NodeAgent
from apps.fleet.selectors import desired_digest, desired_state_build, node_gpus
from apps.inventory.models import Gpu, Node
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")


class ProtocolMismatch(Conflict):
    """The agent speaks another major protocol version (409)."""


def agent_time(at_s: float | None, default: datetime) -> datetime:
    """A time the agent sent (epoch seconds, its clock), or `default` when it sent none."""
    return datetime.fromtimestamp(at_s, tz=UTC) if at_s else default


def check_version(version: str) -> None:
    if not p.compatible(version):
        raise ProtocolMismatch(
            f"agent protocol {version} is not compatible with the plane's {p.PROTOCOL_VERSION} "
            "(major versions must match)"
        )


def check_node(node: Node, node_id: str) -> None:
    if node_id != str(node.pk):
        raise NotAllowed(f"this credential belongs to node {node.pk}; it cannot act for node {node_id!r}")


def sync_inventory(
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
            gpu_unhealthy(gpu=gpu, kind="lost", xid=None, now=now)
    return {gpu.uuid: gpu for gpu in gpus.values()}


def gpu_unhealthy(*, gpu: Gpu, kind: str, xid: int | None, now: datetime) -> None:
    """Take a GPU out of placement (health sticks: a lost GPU needs a reset and an operator)."""
    if (
        Gpu.objects.filter(pk=gpu.pk)
        .exclude(health=Gpu.Health.UNHEALTHY)
        .update(health=Gpu.Health.UNHEALTHY, updated_at=now)
    ):
        GpuEvent.objects.create(gpu=gpu, kind=kind, xid=xid, fatal=True, at=now)
        Node.objects.filter(pk=gpu.node_id).update(version=F("version") + 1)


def node_seen(*, node: Node, now: datetime, agent_version: str) -> None:
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
    check_version(message.protocol_version)
    # The node row first, the agent row after: the scheduling cycle's lock order (no deadlock with it).
    node_seen(node=node, now=now, agent_version=message.agent_version)
    agent, _ = NodeAgent.objects.get_or_create(node=node)
    NodeAgent.objects.filter(pk=agent.pk).update(
        hostname=message.hostname[:255], protocol_version=message.protocol_version[:16], registered_at=now
    )
    sync_inventory(node=node, inventory=message.inventory, lost=set(), now=now)
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


# ------------------------------------------------------------------------------------- desired state


def desired_generation(*, node: Node, now: datetime) -> int:
    """The node's desired-state generation once a writer below fleet changed what it must run (a cycle's
    re-carve; apps.common.hooks.desired_generation): raised when the content changed since last served."""
    return desired_state_current(node=node, now=now).generation


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
