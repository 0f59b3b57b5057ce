"""Node services: the agent credential, node health (a node the plane stopped hearing is lost and its
work requeued), the operator's cordon, uncordon and drain, and the node changes and deletes
`whalegen apply` asks for.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from apps.common.errors import Conflict
from apps.common.words import plural
from apps.fleet import liveness
from apps.fleet.credentials import credentials_changed
from apps.fleet.models import FleetIngestion, NodeAgent, NodeJoin
from apps.fleet.runs import LIVE_TASK_STATES, quotas_lock, task_requeue
from apps.fleet.selectors import credential_hash
from apps.inventory.models import Node
from apps.inventory.selectors import node_cordoned
from apps.inventory.services import node_settings_update
from apps.scheduling.models import Assignment
from apps.workloads.models import Task

log = logging.getLogger("whalegen.fleet")


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
    # A node whose row a request held during the flush beat since the last one: its beat waits in Redis.
    candidates = candidates.exclude(pk__in=flushed.held)
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
            quotas_lock([task.pk for task in _live_tasks(node)])
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
                task_requeue(task, via=Task.State.LOST, actor="system:node-health", reason=reason)
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
        quotas_lock([task.pk for task in _live_tasks(node)])
        Node.objects.filter(pk=node.pk).update(state=Node.State.DRAINING, version=F("version") + 1)
    reason = f"node {node.name} drained by {actor}"
    for task in _live_tasks(node):
        if task.preemptible and task.state in LIVE_TASK_STATES:
            with transaction.atomic():
                quotas_lock([task.pk])
                task_requeue(task, via=Task.State.PREEMPTED, actor=actor, reason=reason)
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


# ------------------------------------------------------------------------------- operator's changes


def _live_assignments(node: Node) -> int:
    return Assignment.objects.filter(node=node, released_at__isnull=True).count()


def node_update(*, node: Node, values: dict[str, Any], actor: str) -> Node:
    """Labels, capacity, pool and cordon. A node moves to another pool only while it runs nothing: its
    live assignments were placed by the old pool's cycle and are charged to the old pool's quotas."""
    if "pool" in values and values["pool"].pk != node.pool_id:
        live = _live_assignments(node)
        if live:
            raise Conflict(
                f"node {node.name} runs {plural(live, 'task')} in pool {node.pool.name!r}; "
                "drain it before moving it to another pool"
            )
    node_settings_update(node=node, values=values)
    if "cordoned" in values:
        node.refresh_from_db()
        if values["cordoned"] and node.state == Node.State.READY:
            node_cordon(node=node, actor=actor)
        elif not values["cordoned"] and node.state in (Node.State.CORDONED, Node.State.DRAINING):
            node_uncordon(node=node, actor=actor)
        elif node.state == Node.State.LOST and values["cordoned"] != node_cordoned(node):
            raise Conflict(f"node {node.name} is lost; its cordon can change once its agent heartbeats")
    node.refresh_from_db()
    return node


def node_delete_refusal(node: Node) -> str:
    """Why `node` may not be deleted ("" when it may: then apps.inventory.services.node_delete)."""
    live = _live_assignments(node)
    if live:
        return f"node {node.name} runs {plural(live, 'task')}; drain it first"
    if Assignment.objects.filter(node=node).exists():
        return f"node {node.name} has task history (assignments keep it); cordon it instead"
    return ""
