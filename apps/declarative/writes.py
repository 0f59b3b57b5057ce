"""Writes `apply` needs that the owning apps do not offer yet: changing and deleting clusters, pools,
nodes and tenants, removing a membership or a quota, setting a GPU price.

Why here and not in each app's services.py: while issue #38 is built, apps/tenants, apps/fleet and
apps/workloads are being changed by others in the same checkout, and a second writer in those files
would tangle the commits. Each function is small, validates with the model's `full_clean` and refuses
with a reason; moving them into their apps later changes no caller but `apps.declarative.kinds`.

Every `*_delete_refusal` says why an object may not go ("" when it may); the deletes themselves assume
the refusal was asked first, inside the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F

from apps.accounting.models import Budget
from apps.common.errors import Conflict
from apps.declarative.models import GpuPrice
from apps.fleet.nodes import node_cordon, node_uncordon
from apps.inventory.models import Cluster, Node, Pool
from apps.scheduling.models import Assignment
from apps.tenants.callers import forget_callers
from apps.tenants.models import Membership, Tenant
from apps.workloads.models import Quota, Task
from apps.workloads.state_machine import FINAL


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _save(obj: Any, values: dict[str, Any]) -> Any:
    for key, value in values.items():
        setattr(obj, key, value)
    obj.full_clean()
    obj.save()
    return obj


# -------------------------------------------------------------------------------------------- clusters


def cluster_update(*, cluster: Cluster, values: dict[str, Any]) -> Cluster:
    """Region and the whole-cluster cordon (the scheduler reads `cordoned` on every cycle)."""
    return _save(cluster, {k: v for k, v in values.items() if k in ("region", "cordoned")})


def cluster_delete_refusal(cluster: Cluster) -> str:
    nodes = cluster.nodes.count()
    if nodes:
        return f"cluster {cluster.name!r} still has {_plural(nodes, 'node')}; remove them first"
    return ""


# ----------------------------------------------------------------------------------------------- pools


def pool_update(*, pool: Pool, values: dict[str, Any]) -> Pool:
    """Description and runtime settings: a new runtime or image rule applies to tasks submitted
    afterwards (each task keeps what it got at submission)."""
    allowed = (
        "description",
        "runtime",
        "allowed_image_prefixes",
        "image_pull_policy",
        "join_requires_approval",
    )
    return _save(pool, {k: v for k, v in values.items() if k in allowed})


def pool_delete_refusal(pool: Pool) -> str:
    live = Task.objects.filter(pool=pool).exclude(state__in=FINAL).count()
    if live:
        return f"pool {pool.name!r} has {_plural(live, 'live task')}; they must finish or be cancelled"
    for related, what in ((pool.nodes, "node"), (pool.queues, "queue"), (pool.quotas, "quota")):
        count = related.count()
        if count:
            return f"pool {pool.name!r} still has {_plural(count, what)}; remove or move them first"
    if Task.objects.filter(pool=pool).exists():
        return f"pool {pool.name!r} has task history, which keeps it"
    return ""


# ----------------------------------------------------------------------------------------------- nodes


def _live_assignments(node: Node) -> int:
    return Assignment.objects.filter(node=node, released_at__isnull=True).count()


def node_update(*, node: Node, values: dict[str, Any], actor: str) -> Node:
    """Labels, capacity, pool and cordon. A node moves to another pool only while it runs nothing: its
    live assignments were placed by the old pool's cycle and are charged to the old pool's quotas."""
    if "pool" in values and values["pool"].pk != node.pool_id:
        live = _live_assignments(node)
        if live:
            raise Conflict(
                f"node {node.name} runs {_plural(live, 'task')} in pool {node.pool.name!r}; "
                "drain it before moving it to another pool"
            )
    plain = {k: v for k, v in values.items() if k in ("labels", "cpu_milli", "mem_mib", "pool")}
    if plain:
        _save(node, plain)
        # Placement reads labels, capacity and pool: the cycle's compare-and-set must see the change.
        Node.objects.filter(pk=node.pk).update(version=F("version") + 1)
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


def node_cordoned(node: Node) -> bool:
    """Whether an operator holds the node out of placement (a draining node is on its way to cordoned; a
    lost node keeps the state it was lost from)."""
    held = (Node.State.CORDONED, Node.State.DRAINING)
    return node.state in held or (node.state == Node.State.LOST and node.state_before_lost in held)


def node_delete_refusal(node: Node) -> str:
    live = _live_assignments(node)
    if live:
        return f"node {node.name} runs {_plural(live, 'task')}; drain it first"
    if Assignment.objects.filter(node=node).exists():
        return f"node {node.name} has task history (assignments keep it); cordon it instead"
    return ""


def node_delete(*, node: Node) -> None:
    node.delete()  # its GPUs and units go with it (CASCADE); nothing refers to them once it holds nothing


# --------------------------------------------------------------------------------------------- tenants


def tenant_update(*, tenant: Tenant, values: dict[str, Any]) -> Tenant:
    parent = values.get("parent", tenant.parent)
    if parent is not None and parent.kind != Tenant.Kind.ORG:
        raise Conflict(f"tenant {parent.slug!r} is a team; teams cannot hold tenants")
    _save(tenant, {k: v for k, v in values.items() if k in ("name", "kind", "parent", "run_uid")})
    forget_callers()  # roles flow down the tree: a moved tenant changes who may see what
    return tenant


def tenant_delete_refusal(tenant: Tenant) -> str:
    tasks = tenant.tasks.count()
    if tasks:
        return f"tenant {tenant.slug!r} has {_plural(tasks, 'task')} (history is kept)"
    for related, what in (
        (tenant.children, "child tenant"),
        (tenant.queues, "queue"),
        (tenant.quotas, "quota"),
    ):
        count = related.count()
        if count:
            return f"tenant {tenant.slug!r} still has {_plural(count, what)}; remove them first"
    return ""


def tenant_delete(*, tenant: Tenant) -> None:
    tenant.delete()  # memberships and tokens go with it
    forget_callers()


def membership_remove(*, membership: Membership) -> None:
    membership.delete()
    forget_callers()  # the member's remembered access must not outlive the membership


# ---------------------------------------------------------------------------------------------- quotas


def live_tasks(quota: Quota) -> int:
    """The tenant's tasks in the quota's pool that have not ended (pending ones included)."""
    return Task.objects.filter(tenant=quota.tenant_id, pool=quota.pool_id).exclude(state__in=FINAL).count()


def quota_delete_refusal(quota: Quota) -> str:
    live = live_tasks(quota)
    if live:
        return (
            f"tenant {quota.tenant.slug!r} has {_plural(live, 'live task')} in pool {quota.pool.name!r}; "
            "they must finish or be cancelled first"
        )
    if Budget.objects.filter(quota=quota).exists():
        return "the quota carries a budget; remove the Budget document first"
    return ""


def quota_delete(*, quota: Quota) -> None:
    quota.delete()


def budget_delete_refusal(budget: Budget) -> str:
    # A budget's changes are its audit trail and go with it: deleting is an admin's act, with the trail in
    # view, never a side effect of a file that no longer names it.
    changes = budget.changes.count()
    return (
        f"a budget keeps its audit trail ({_plural(changes, 'change')}); set gpu_hours instead, or delete "
        "it in the admin"
    )


# ---------------------------------------------------------------------------------------------- prices


def gpu_price_set(*, model: str, per_gpu_hour: float, actor: str) -> GpuPrice:
    price = GpuPrice.objects.filter(model=model).first() or GpuPrice(model=model)
    return _save(price, {"per_gpu_hour": per_gpu_hour, "updated_by": actor[:150]})


def gpu_price_delete(*, price: GpuPrice) -> None:
    price.delete()
