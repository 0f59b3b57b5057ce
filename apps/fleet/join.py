"""Writes for nodes that join themselves (docs/agent.md, "Joining"): join tokens, the join itself, the
approval of a joined node, and taking a node's credential away so that its host may join again.

A join token is made by a platform admin for one pool of one cluster, lives `ttl` seconds and may be used
once, N times or without limit until it expires or is revoked. A GPU host presents it with a description
of itself (what NVML says, never what a person typed) and gets back its own node credential, once. The
plane keeps only hashes of both secrets.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.common.errors import ApplicationError, Conflict, NotAllowed
from apps.fleet import liveness
from apps.fleet.agents import ProtocolMismatch
from apps.fleet.credentials import credentials_changed
from apps.fleet.models import JoinToken, NodeJoin
from apps.fleet.nodes import node_token_issue
from apps.fleet.reports import node_lock
from apps.fleet.selectors import credential_hash
from apps.inventory.models import Cluster, Gpu, Node, Pool
from apps.inventory.services import cluster_create, gpu_add, pool_create
from whalegen import protocol as p
from whalegen.gpus import UnknownGpuModel, get_model

log = logging.getLogger("whalegen.fleet")

TOKEN_PREFIX = "wgj_"
PREFIX_CHARS = 12  # "wgj_" and 8 characters of the secret: enough to tell tokens apart in a list
# A node name is a host name as `hostname` prints it (RFC 1123 labels, dots allowed), or a short form.
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
# A bootstrap secret is chosen by a person (docs/operations.md, "Compose"): at least this long, so that
# it is a secret rather than a word.
BOOTSTRAP_MIN_CHARS = 20


class JoinUnauthorized(ApplicationError):
    """The join token is not one the plane knows (401)."""

    status = 401


@dataclass(frozen=True)
class JoinOutcome:
    """What a successful join made: the node, and its credential in plaintext (shown once)."""

    node: Node
    credential: str
    pending_approval: bool

    def joined(self) -> p.Joined:
        return p.Joined(
            node_id=str(self.node.pk),
            node_name=self.node.name,
            cluster=self.node.cluster.name,
            pool=self.node.pool.name,
            credential=self.credential,
            pending_approval=self.pending_approval,
        )


# ---------------------------------------------------------------------------------------- join tokens


def _new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _token_name(pool: Pool, secret: str) -> str:
    return f"{pool.name}-{credential_hash(secret)[:6]}"[:64]


def join_token_create(
    *,
    pool: Pool,
    cluster: Cluster,
    ttl_s: float,
    max_uses: int | None = 1,
    requires_approval: bool = False,
    name: str = "",
    created_by: str = "",
    now: datetime | None = None,
) -> tuple[JoinToken, str]:
    """A join token for `pool` in `cluster` and its secret, which is never stored and never shown again.

    `max_uses` None: any number of hosts may join with it until it expires (a fleet's provisioning run);
    1: one host (the default, as `kubeadm token create` makes a token for one purpose)."""
    now = now or timezone.now()
    if ttl_s <= 0:
        raise ValidationError({"ttl": ["a join token must expire: give a positive lifetime, e.g. 1h"]})
    if max_uses is not None and max_uses < 1:
        raise ValidationError({"uses": ["at least 1 (or unlimited)"]})
    raw = _new_secret()
    token = JoinToken(
        name=name or _token_name(pool, raw),
        pool=pool,
        cluster=cluster,
        token_hash=credential_hash(raw),
        prefix=raw[:PREFIX_CHARS],
        created_at=now,
        created_by=created_by[:150],
        expires_at=now + timedelta(seconds=ttl_s),
        max_uses=max_uses,
        requires_approval=requires_approval,
    )
    token.full_clean()
    token.save()
    log.info("%s made join token %s for pool %s", created_by or "someone", token.name, pool.name)
    return token, raw


def join_token_revoke(*, token: JoinToken, actor: str, now: datetime | None = None) -> JoinToken:
    """The token joins no more hosts; nodes that joined with it keep their own credentials. Revoking a
    revoked token changes nothing (the first revocation's time and actor stay)."""
    now = now or timezone.now()
    live = JoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True)
    live.update(revoked_at=now, revoked_by=actor[:150])
    token.refresh_from_db()
    return token


def join_token_bootstrap(
    *, secret: str, pool_name: str, cluster_name: str, ttl_s: float, now: datetime | None = None
) -> tuple[JoinToken, bool]:
    """The join token of a stack that starts from nothing (docker/compose.yaml): the operator chose its
    secret (`WHALEGEN_BOOTSTRAP_JOIN_TOKEN`), so the agent beside the plane can join without anyone
    running a command. Makes the cluster and pool if missing (the pool runs `process` tasks: the compose
    agent has no container engine), then makes the token or, when it exists, pushes its expiry to
    `ttl_s` from now. A revoked bootstrap token stays revoked: choose a new secret. Returns the token
    and whether it was made now."""
    now = now or timezone.now()
    if len(secret) < BOOTSTRAP_MIN_CHARS:
        raise ValidationError(
            {"secret": [f"a bootstrap join token needs at least {BOOTSTRAP_MIN_CHARS} characters"]}
        )
    with transaction.atomic():
        cluster = Cluster.objects.filter(name=cluster_name).first() or cluster_create(name=cluster_name)
        pool = Pool.objects.filter(name=pool_name).first() or pool_create(
            name=pool_name,
            description="made by the stack's bootstrap join token",
            runtime=Pool.Runtime.PROCESS,
        )
        digest = credential_hash(secret)
        token = JoinToken.objects.filter(token_hash=digest).first()
        if token is not None:
            if token.revoked_at is None:
                JoinToken.objects.filter(pk=token.pk).update(expires_at=now + timedelta(seconds=ttl_s))
                token.refresh_from_db()
            return token, False
        token = JoinToken.objects.create(
            name=f"bootstrap-{digest[:8]}",
            pool=pool,
            cluster=cluster,
            token_hash=digest,
            prefix=secret[:PREFIX_CHARS],
            created_at=now,
            created_by="system:bootstrap",
            expires_at=now + timedelta(seconds=ttl_s),
            max_uses=None,
        )
    return token, True


# ----------------------------------------------------------------------------------------------- join


def _token_refusal(token: JoinToken, now: datetime) -> ApplicationError | None:
    """Why `token` joins nothing now, in one sentence; None when it may still be used."""
    if token.revoked_at is not None:
        return NotAllowed(
            f"join token {token.name} was revoked at {token.revoked_at:%Y-%m-%d %H:%M:%S} UTC; "
            "ask an admin for a new one"
        )
    if token.expires_at <= now:
        return NotAllowed(
            f"join token {token.name} expired at {token.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            "ask an admin for a new one (whalegen create join-token)"
        )
    if token.max_uses is not None and token.uses >= token.max_uses:
        uses = "its one use" if token.max_uses == 1 else f"all {token.max_uses} of its uses"
        return NotAllowed(f"join token {token.name} has been used up ({uses}); ask an admin for a new one")
    return None


def _pool_refusal(token: JoinToken, asked: str) -> NotAllowed | None:
    if asked == token.pool.name:
        return None
    if not Pool.objects.filter(name=asked).exists():
        return NotAllowed(f"there is no pool {asked!r}; this join token is for pool {token.pool.name!r}")
    return NotAllowed(f"this join token is for pool {token.pool.name!r}, not {asked!r}")


def _gpu_problem(item: p.GpuInventory) -> str | None:
    where = f"GPU {item.index} ({item.name or item.uuid or 'unnamed'})"
    if item.lost:
        return f"{where} is lost (NVML cannot reach it); repair or remove it, then join"
    if not item.uuid.startswith("GPU-"):
        return f"{where}: {item.uuid!r} is not an NVML GPU UUID"
    if item.model is None:
        return f"{where} is not a model the plane's catalogue knows"
    try:
        spec = get_model(item.model)
    except UnknownGpuModel:
        return f"{where}: the plane's catalogue has no model {item.model!r}"
    if spec.mem_mib is None:
        return f"{where}: {spec.name} is a trace-only model with unknown memory"
    if item.mig_current and not spec.mig_capable:
        return f"{where} says MIG is on, but {spec.name} has no MIG"
    return None


def _host_problems(message: p.Join) -> dict[str, list[str]]:
    """What makes the host's description unusable, field by field (a 400 names them all)."""
    problems: dict[str, list[str]] = {}
    if not NODE_NAME.fullmatch(message.node_name):
        problems["node_name"] = [
            "a host name: letters, digits, '.', '-' and '_', at most 128, starting and ending with a "
            "letter or digit"
        ]
    if message.cpu_milli <= 0:
        problems["cpu_milli"] = ["the host's CPUs in thousandths of a core: a positive number"]
    if message.mem_mib <= 0:
        problems["mem_mib"] = ["the host's memory in MiB: a positive number"]
    gpus: list[str] = []
    if not message.inventory:
        gpus.append("the host reports no GPU; a node of a GPU pool needs at least one")
    indexes = [item.index for item in message.inventory]
    uuids = [item.uuid for item in message.inventory]
    if len(set(indexes)) != len(indexes):
        gpus.append("two GPUs share an NVML index")
    if len(set(uuids)) != len(uuids):
        gpus.append("two GPUs share a UUID")
    gpus += [problem for item in message.inventory if (problem := _gpu_problem(item))]
    if gpus:
        problems["inventory"] = gpus
    return problems


def _gpus_add(node: Node, inventory: tuple[p.GpuInventory, ...]) -> None:
    """The node's GPUs as the host reported them: MIG ones carved into the instances found on them (the
    plane may re-carve later, as for any MIG GPU), the others one whole unit each. A GPU the node
    already has at that index (a node declared before its host joined) is left to the agent's
    registration, which adopts its UUID."""
    known = set(Gpu.objects.filter(node=node).values_list("index", flat=True))
    for item in sorted(inventory, key=lambda gpu: gpu.index):
        if item.index in known:
            continue
        assert item.model is not None  # _gpu_problem refused the rest
        mig = item.mig_capable and item.mig_current
        gpu_add(
            node=node,
            index=item.index,
            model=item.model,
            uuid=item.uuid,
            partition_mode=Gpu.PartitionMode.MIG if mig else Gpu.PartitionMode.WHOLE,
            mig_layout=[(instance.profile, instance.start) for instance in item.instances] if mig else [],
        )


def _node_take(token: JoinToken, message: p.Join) -> Node | None:
    """The node of that name in the token's cluster when one may be taken over (declared, never given
    a credential), None when there is none; refused when it has a live credential or another pool."""
    node = (
        Node.objects.select_for_update()
        .select_related("cluster", "pool")
        .filter(cluster=token.cluster, name=message.node_name)
        .first()
    )
    if node is None:
        return None
    where = f"{token.cluster.name}/{node.name}"
    if node.agent_credential_hash:
        # Refused, not rotated: whoever holds a join token must not be able to take over a running node
        # (its work, its tenants' secrets) by naming it. A reinstalled host joins after an admin takes
        # the old credential away (`whalegen delete node-credential`).
        raise Conflict(
            f"node {where} has already joined and holds a live credential; to join this host under that "
            f"name, an admin first revokes it (whalegen delete node-credential {where})"
        )
    if node.pool_id != token.pool_id:
        raise NotAllowed(f"node {where} belongs to pool {node.pool.name!r}, not {token.pool.name!r}")
    return node


def _gpu_clash(node: Node | None, message: p.Join) -> Conflict | None:
    uuids = [item.uuid for item in message.inventory]
    clash = Gpu.objects.filter(uuid__in=uuids).select_related("node__cluster")
    if node is not None:
        clash = clash.exclude(node=node)
    gpu = clash.first()
    if gpu is None:
        return None
    return Conflict(
        f"GPU {gpu.uuid} already belongs to node {gpu.node.cluster.name}/{gpu.node.name}; a GPU is in one "
        "node at a time (revoke and delete that node first if the card moved)"
    )


def _claim(token: JoinToken, now: datetime) -> bool:
    """Count one use, if the token still allows one: a conditional UPDATE that touches one row or none.
    Two hosts racing for the last use both run it; PostgreSQL makes the second wait for the first's
    commit and re-check the condition on the row as it now is, so exactly one of them gets the use."""
    usable = Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses"))
    claimed = JoinToken.objects.filter(
        usable, pk=token.pk, revoked_at__isnull=True, expires_at__gt=now
    ).update(uses=F("uses") + 1)
    return claimed == 1


def node_join(*, message: p.Join, now: datetime | None = None) -> JoinOutcome:
    """Make the host a node of the token's pool and give it its credential.

    1. The token: known, not revoked, not expired, not used up, for the pool the host asked for.
    2. The host's description: a usable node name, CPUs and memory, GPUs the catalogue knows.
    3. In one transaction: the node of that name (new, or declared earlier without a credential), its
       GPUs from the host's inventory, one use of the token, the credential. A refusal after the use
       was counted rolls it back with the rest, so a refused host never spends the token.
    """
    now = now or timezone.now()
    if not p.compatible(message.protocol_version):
        raise ProtocolMismatch(
            f"agent protocol {message.protocol_version} is not compatible with the plane's "
            f"{p.PROTOCOL_VERSION} (major versions must match); install an agent of this plane's release"
        )
    # 1.
    token = (
        JoinToken.objects.select_related("pool", "cluster")
        .filter(token_hash=credential_hash(message.join_token))
        .first()
    )
    if token is None:
        raise JoinUnauthorized("unknown join token; check it was copied whole, or ask an admin for a new one")
    refusal = _token_refusal(token, now) or _pool_refusal(token, message.pool)
    if refusal is not None:
        raise refusal
    # 2.
    problems = _host_problems(message)
    if problems:
        raise ValidationError(problems)
    # 3.
    try:
        with transaction.atomic():
            node = _node_take(token, message)
            clash = _gpu_clash(node, message)
            if clash is not None:
                raise clash
            if not _claim(token, now):
                token.refresh_from_db()
                raise _token_refusal(token, now) or NotAllowed(f"join token {token.name} has been used up")
            approval = token.requires_approval or token.pool.join_requires_approval
            state = Node.State.CORDONED if approval else Node.State.READY
            if node is None:
                node = Node.objects.create(
                    cluster=token.cluster,
                    pool=token.pool,
                    name=message.node_name,
                    cpu_milli=message.cpu_milli,
                    mem_mib=message.mem_mib,
                    state=state,
                )
            else:
                Node.objects.filter(pk=node.pk).update(
                    cpu_milli=message.cpu_milli,
                    mem_mib=message.mem_mib,
                    state=Node.State.CORDONED if approval else F("state"),
                    version=F("version") + 1,
                )
                node.refresh_from_db()
            _gpus_add(node, message.inventory)
            NodeJoin.objects.update_or_create(
                node=node,
                defaults={
                    "join_token": token,
                    "joined_at": now,
                    "hostname": message.hostname[:255],
                    "approval_required": approval,
                    "approved_at": None,
                    "approved_by": "",
                },
            )
            credential = node_token_issue(node=node)
    except IntegrityError:
        # Another host took the same node name or one of these GPU UUIDs between our checks and our
        # insert; nothing of this join was kept, the token's use included.
        raise Conflict(
            f"another host joined as node {token.cluster.name}/{message.node_name} (or with one of these "
            "GPUs) at the same moment; nothing was changed here"
        ) from None
    log.info(
        "host %s joined as node %s/%s in pool %s with join token %s%s",
        message.hostname,
        token.cluster.name,
        node.name,
        token.pool.name,
        token.name,
        " (waiting for approval)" if approval else "",
        extra={"node": node.name},
    )
    return JoinOutcome(node=node, credential=credential, pending_approval=approval)


# ------------------------------------------------------------------------------------------- approval


def node_approve(*, node: Node, actor: str, now: datetime | None = None) -> Node:
    """Let a node that joined with an approval token take work: it is uncordoned (or, while lost, comes
    back ready). Approving an approved node changes nothing."""
    now = now or timezone.now()
    with transaction.atomic():
        # The node row before the join row: the order the scheduling cycle locks a node's rows in. Its own
        # row only (`node_lock`): a plain select_for_update joined and locked the cluster's row too.
        node_lock(node)
        joined = NodeJoin.objects.select_for_update().filter(node=node).first()
        if joined is None or not joined.approval_required:
            raise Conflict(
                f"node {node.name} did not join with a token that needs approval; there is nothing to approve"
            )
        if joined.approved_at is not None:
            node.refresh_from_db()
            return node
        NodeJoin.objects.filter(pk=joined.pk).update(approved_at=now, approved_by=actor[:150])
        Node.objects.filter(pk=node.pk, state=Node.State.CORDONED).update(
            state=Node.State.READY, version=F("version") + 1
        )
        # Lost while waiting: it comes back ready, not to the approval's cordon.
        Node.objects.filter(pk=node.pk, state=Node.State.LOST).update(state_before_lost="")
    log.info("%s approved node %s", actor, node.name, extra={"node": node.name})
    node.refresh_from_db()
    return node


def node_pending_approval(*, node: Node) -> bool:
    return NodeJoin.objects.filter(node=node, approval_required=True, approved_at__isnull=True).exists()


def node_credential_revoke(*, node: Node, actor: str) -> Node:
    """Take the node's agent credential away: its agent is refused from now on (401), and a host may
    join under the node's name again (a reinstalled machine). The node, its GPUs and its history stay."""
    Node.objects.filter(pk=node.pk).update(agent_credential_hash="")
    node.agent_credential_hash = ""
    credentials_changed()
    liveness.forget([node.pk])
    transaction.on_commit(lambda: liveness.forget([node.pk]))
    log.info("%s revoked the credential of node %s", actor, node.name, extra={"node": node.name})
    return node
