"""The kinds `whalegen apply` knows, one class each: the document's identity and spec fields, how the
current object reads back into that form, who may write it, and how it is created, changed and deleted
— always through the owning app's services (GPU prices, this app's own rows, through `prices`).

A document:

    apiVersion: whalegen/v1      # optional
    kind: Quota
    metadata: {tenant: vision, pool: h100-train}   # identity (+ labels where the object has them)
    spec: {guaranteed_gpus: 8, borrow_limit_gpus: 4}
    status: {...}                # what `get` adds; apply ignores it

Fields a document leaves out take their defaults (the file is the whole truth about what it names), except
`KEEP` fields (a node's capacity, which its agent knows better) and fields that are read only at creation
(`create_only`: a node's GPUs, a member's e-mail).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from apps.accounting.models import Budget
from apps.accounting.services import budget_delete_refusal, budget_set, quota_budget_refusal
from apps.common.errors import ApplicationError
from apps.declarative import fields as f
from apps.declarative.models import GpuPrice
from apps.declarative.prices import gpu_price_delete, gpu_price_set
from apps.fleet.nodes import node_delete_refusal, node_update
from apps.inventory import selectors as inventory
from apps.inventory.models import Cluster, Gpu, Node, Pool
from apps.inventory.services import (
    cluster_create,
    cluster_delete_refusal,
    cluster_update,
    gpu_add,
    node_delete,
    node_register,
    pool_create,
    pool_update,
)
from apps.tenants.models import Membership, Tenant
from apps.tenants.selectors import Access, tenant_list
from apps.tenants.services import (
    membership_remove,
    membership_set,
    tenant_create,
    tenant_delete,
    tenant_delete_refusal,
    tenant_update,
)
from apps.workloads import selectors as workloads
from apps.workloads.models import Queue, Quota
from apps.workloads.services import (
    pool_delete_refusal,
    queue_create,
    queue_delete,
    queue_update,
    quota_delete,
    quota_delete_refusal,
    quota_set,
)
from whalegen.gpus import UnknownGpuModel, get_model, mig_profiles, model_names

REQUIRED = object()  # the document must give it
KEEP = object()  # left out: the object keeps what it has (required when the object is new)


class Refused(ApplicationError):
    """This object cannot be applied as written; the message says why (a missing reference, a change
    the object does not allow, a caller without the role)."""

    status = 409


@dataclass(frozen=True)
class Field:
    parse: f.Parser
    default: Any = REQUIRED
    create_only: bool = False  # read when the object is made; afterwards shown, never compared
    compared: bool = True  # False: an input of the write (a budget's reason), not a property of the object


@dataclass
class Context:
    access: Access
    user: Any
    actor: str  # "user:root"
    source: str
    spec: dict[str, Any] = field(default_factory=dict)  # the document's whole spec
    notes: list[str] = field(default_factory=list)  # said with this object's result


class Kind:
    name: ClassVar[str]
    plural: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    order: ClassVar[int]  # apply in increasing order, prune in decreasing: what others refer to first
    identity: ClassVar[tuple[str, ...]] = ("name",)
    has_labels: ClassVar[bool] = False
    fields: ClassVar[dict[str, Field]]
    writers: ClassVar[str] = "platform admins"  # for the refusal's sentence

    # -- identity
    @classmethod
    def key(cls, ident: dict[str, str]) -> str:
        return "/".join(ident[part] for part in cls.identity)

    @classmethod
    def ident_from_key(cls, key: str) -> dict[str, str]:
        return dict(zip(cls.identity, key.split("/"), strict=False))

    # -- reads
    def visible(self, access: Access) -> QuerySet:
        raise NotImplementedError

    def ident_of(self, obj: Any) -> dict[str, str]:
        raise NotImplementedError

    def find(self, ident: dict[str, str]) -> Any | None:
        raise NotImplementedError

    def current(self, obj: Any) -> dict[str, Any]:
        """The object's spec in document form: every field of `fields`."""
        raise NotImplementedError

    def labels_of(self, obj: Any) -> dict[str, str]:
        return {}

    def status(self, obj: Any) -> dict[str, Any]:
        return {}

    # -- writes
    def write_refusal(self, access: Access, ident: dict[str, str]) -> str:
        """Why this caller may not write the object ("" when they may)."""
        if access.platform_admin:
            return ""
        return f"writing {self.plural} is for {self.writers}"

    def create(
        self, ident: dict[str, str], labels: dict[str, str], spec: dict[str, Any], ctx: Context
    ) -> Any:
        raise NotImplementedError

    def update(self, obj: Any, changes: dict[str, Any], labels: dict[str, str] | None, ctx: Context) -> None:
        raise NotImplementedError

    def delete_refusal(self, obj: Any) -> str:
        return ""

    def delete(self, obj: Any, ctx: Context) -> None:
        obj.delete()


# ------------------------------------------------------------------------------------------- lookups


def _pool(name: str) -> Pool:
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        raise Refused(f"pool {name!r} does not exist (nor does any document before this one make it)")
    return pool


def _tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise Refused(f"tenant {slug!r} does not exist (nor does any document before this one make it)")
    return tenant


def _cluster(name: str) -> Cluster:
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise Refused(f"cluster {name!r} does not exist (nor does any document before this one make it)")
    return cluster


def _tenant_admin_refusal(access: Access, slug: str, plural: str) -> str:
    """Tenant-scoped kinds: the tenant's admins (and platform admins) write them. A tenant the caller
    cannot see is unknown to them, as the API's 404s have it."""
    if access.platform_admin:
        return ""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None or not access.can_see(tenant.pk):
        return f"unknown tenant {slug!r}"
    if not access.has(tenant.pk, Membership.Role.ADMIN):
        held = access.role(tenant.pk) or "no role"
        return f"writing {plural} in tenant {slug!r} needs the admin role; you have {held}"
    return ""


# ------------------------------------------------------------------------------------------- the kinds


class ClusterKind(Kind):
    name, plural, aliases, order = "Cluster", "clusters", ("cluster", "cl"), 10
    fields = {"region": Field(f.text(64), ""), "cordoned": Field(f.boolean, False)}

    def visible(self, access: Access) -> QuerySet:
        return inventory.cluster_list(access=access)

    def ident_of(self, obj: Cluster) -> dict[str, str]:
        return {"name": obj.name}

    def find(self, ident: dict[str, str]) -> Cluster | None:
        return Cluster.objects.filter(name=ident["name"]).first()

    def current(self, obj: Cluster) -> dict[str, Any]:
        return {"region": obj.region, "cordoned": obj.cordoned}

    def status(self, obj: Cluster) -> dict[str, Any]:
        return {"nodes": obj.nodes.count()}

    def create(self, ident, labels, spec, ctx) -> Cluster:
        cluster = cluster_create(name=ident["name"], region=spec["region"])
        if spec["cordoned"]:
            cluster_update(cluster=cluster, values={"cordoned": True})
        return cluster

    def update(self, obj, changes, labels, ctx) -> None:
        cluster_update(cluster=obj, values=changes)

    def delete_refusal(self, obj: Cluster) -> str:
        return cluster_delete_refusal(obj)


class PoolKind(Kind):
    name, plural, aliases, order = "Pool", "pools", ("pool",), 20
    fields = {
        "description": Field(f.text(200), ""),
        "runtime": Field(f.choice(Pool.Runtime.values), Pool.Runtime.CONTAINER),
        "allowed_image_prefixes": Field(f.text_list(512), []),
        "image_pull_policy": Field(f.choice(Pool.PullPolicy.values), Pool.PullPolicy.MISSING),
        "join_requires_approval": Field(f.boolean, False),
    }

    def visible(self, access: Access) -> QuerySet:
        return inventory.pool_list(access=access)

    def ident_of(self, obj: Pool) -> dict[str, str]:
        return {"name": obj.name}

    def find(self, ident: dict[str, str]) -> Pool | None:
        return Pool.objects.filter(name=ident["name"]).first()

    def current(self, obj: Pool) -> dict[str, Any]:
        return {
            "description": obj.description,
            "runtime": obj.runtime,
            "allowed_image_prefixes": list(obj.allowed_image_prefixes),
            "image_pull_policy": obj.image_pull_policy,
            "join_requires_approval": obj.join_requires_approval,
        }

    def status(self, obj: Pool) -> dict[str, Any]:
        return {"nodes": obj.nodes.count(), "gpus": Gpu.objects.filter(node__pool=obj).count()}

    def create(self, ident, labels, spec, ctx) -> Pool:
        return pool_create(name=ident["name"], **spec)

    def update(self, obj, changes, labels, ctx) -> None:
        pool_update(pool=obj, values=changes)

    def delete_refusal(self, obj: Pool) -> str:
        return pool_delete_refusal(obj)


def _gpu_groups(value: Any) -> list[dict[str, Any]]:
    """A node's GPUs as groups: `{model: H100-80GB, count: 6}`, `{model: L4, partition: mps, shares: 4}`,
    `{model: H100-80GB, partition: mig, mig: ["3g.40gb@4", "2g.20gb@0"]}`; indexes follow the list."""
    if not isinstance(value, list):
        raise f.FieldError("is not a list; write a list of GPU groups: [{model: H100-80GB, count: 8}]")
    out = []
    allowed = {"model", "count", "partition", "mig", "shares"}
    for index, group in enumerate(value):
        at = f"[{index}]"
        if not isinstance(group, dict):
            raise f.FieldError("is not a mapping; write {model: H100-80GB, count: 8}", at)
        unknown = sorted(set(group) - allowed)
        if unknown:
            raise f.FieldError(
                f"unknown field; a GPU group has {', '.join(sorted(allowed))}", f"{at}.{unknown[0]}"
            )
        try:
            spec = get_model(str(group.get("model", "")))
        except UnknownGpuModel:
            known = ", ".join(model_names())
            raise f.FieldError(f"is not a catalogue GPU model; write one of {known}", f"{at}.model") from None
        partition = group.get("partition", Gpu.PartitionMode.WHOLE)
        if partition not in Gpu.PartitionMode.values:
            raise f.FieldError(f"write one of {', '.join(Gpu.PartitionMode.values)}", f"{at}.partition")
        item: dict[str, Any] = {"model": spec.name, "count": group.get("count", 1)}
        if (
            isinstance(item["count"], bool)
            or not isinstance(item["count"], int)
            or not 1 <= item["count"] <= 64
        ):
            raise f.FieldError("write a whole number of GPUs from 1 to 64", f"{at}.count")
        if partition != Gpu.PartitionMode.WHOLE:
            item["partition"] = partition
        if partition == Gpu.PartitionMode.MIG:
            names = {p.name for p in mig_profiles(spec.name)}
            if not names:
                raise f.FieldError(f"{spec.name} does not support MIG", f"{at}.partition")
            layout = group.get("mig")
            if not isinstance(layout, list) or not layout:
                raise f.FieldError(
                    'write the MIG instances as ["PROFILE@START", …], e.g. ["3g.40gb@0"]', f"{at}.mig"
                )
            for entry in layout:
                profile, _, start = str(entry).partition("@")
                if profile not in names or not start.isdigit():
                    raise f.FieldError(
                        f"{entry!r} is not PROFILE@START with a profile of {spec.name} "
                        f"({', '.join(sorted(names))})",
                        f"{at}.mig",
                    )
            item["mig"] = [str(entry) for entry in layout]
        elif partition in (Gpu.PartitionMode.MPS, Gpu.PartitionMode.TIME_SLICE):
            shares = group.get("shares")
            if isinstance(shares, bool) or not isinstance(shares, int) or not 1 <= shares <= 48:
                raise f.FieldError("write how many equal shares (1 to 48)", f"{at}.shares")
            item["shares"] = shares
        out.append(item)
    return out


def _gpu_group_of(gpu: Gpu) -> dict[str, Any]:
    item: dict[str, Any] = {"model": gpu.model, "count": 1}
    if gpu.partition_mode != Gpu.PartitionMode.WHOLE:
        item["partition"] = gpu.partition_mode
    units = list(gpu.units.all())
    if gpu.partition_mode == Gpu.PartitionMode.MIG:
        item["mig"] = [f"{unit.mig_profile}@{unit.mig_start}" for unit in units]
    elif gpu.partition_mode in (Gpu.PartitionMode.MPS, Gpu.PartitionMode.TIME_SLICE):
        item["shares"] = len(units)
    return item


def gpu_groups_of(node: Node) -> list[dict[str, Any]]:
    """The node's GPUs in index order, alike neighbours folded into one group with a count."""
    groups: list[dict[str, Any]] = []
    for gpu in node.gpus.order_by("index").prefetch_related("units"):
        item = _gpu_group_of(gpu)
        last = groups[-1] if groups else None
        if last is not None and {**last, "count": 1} == item:
            last["count"] += 1
        else:
            groups.append(item)
    return groups


class NodeKind(Kind):
    name, plural, aliases, order = "Node", "nodes", ("node", "no"), 30
    identity = ("cluster", "name")
    has_labels = True
    fields = {
        "pool": Field(f.text(64, blank=False)),
        "cordoned": Field(f.boolean, False),
        "cpu_milli": Field(f.integer(1), KEEP),
        "mem_mib": Field(f.integer(1, 2**63 - 1), KEEP),
        # The node's GPUs as registered before its agent first reports; after that the host is the truth
        # (its agent's inventory), so a file never re-carves or removes a GPU.
        "gpus": Field(_gpu_groups, [], create_only=True),
    }

    def visible(self, access: Access) -> QuerySet:
        return inventory.node_list(access=access)

    def ident_of(self, obj: Node) -> dict[str, str]:
        return {"cluster": obj.cluster.name, "name": obj.name}

    def find(self, ident: dict[str, str]) -> Node | None:
        return (
            Node.objects.select_related("cluster", "pool")
            .filter(cluster__name=ident["cluster"], name=ident["name"])
            .first()
        )

    def current(self, obj: Node) -> dict[str, Any]:
        return {
            "pool": obj.pool.name,
            "cordoned": inventory.node_cordoned(obj),
            "cpu_milli": obj.cpu_milli,
            "mem_mib": obj.mem_mib,
            "gpus": gpu_groups_of(obj),
        }

    def labels_of(self, obj: Node) -> dict[str, str]:
        return dict(obj.labels)

    def status(self, obj: Node) -> dict[str, Any]:
        heartbeat = obj.last_heartbeat_at.isoformat() if obj.last_heartbeat_at else None
        return {"state": obj.state, "last_heartbeat_at": heartbeat, "agent_version": obj.agent_version}

    def create(self, ident, labels, spec, ctx) -> Node:
        missing = [name for name in ("cpu_milli", "mem_mib") if spec.get(name, KEEP) is KEEP]
        if missing:
            raise Refused(f"a new node needs spec.{' and spec.'.join(missing)} (its host's capacity)")
        node, _credential = node_register(
            cluster=_cluster(ident["cluster"]),
            pool=_pool(spec["pool"]),
            name=ident["name"],
            cpu_milli=spec["cpu_milli"],
            mem_mib=spec["mem_mib"],
            labels=labels,
        )
        # The credential node_register made is dropped: shown nowhere, it works for nobody. The
        # operator issues the agent's own with `manage.py issue_node_token CLUSTER/NODE`.
        index = 0
        for group in spec["gpus"]:
            for _ in range(group["count"]):
                layout = [(entry.split("@")[0], int(entry.split("@")[1])) for entry in group.get("mig", [])]
                gpu_add(
                    node=node,
                    index=index,
                    model=group["model"],
                    partition_mode=group.get("partition", Gpu.PartitionMode.WHOLE),
                    mig_layout=layout,
                    mps_shares=group.get("shares", 0),
                )
                index += 1
        if spec["cordoned"]:
            node_update(node=node, values={"cordoned": True}, actor=ctx.actor)
        ctx.notes.append(
            "no agent credential yet: issue one with "
            f"`manage.py issue_node_token {ident['cluster']}/{ident['name']}`"
        )
        return node

    def update(self, obj, changes, labels, ctx) -> None:
        values = dict(changes)
        if "pool" in values:
            values["pool"] = _pool(values["pool"])
        if labels is not None:
            values["labels"] = labels
        node_update(node=obj, values=values, actor=ctx.actor)

    def delete_refusal(self, obj: Node) -> str:
        return node_delete_refusal(obj)

    def delete(self, obj: Node, ctx: Context) -> None:
        node_delete(node=obj)


class TenantKind(Kind):
    name, plural, aliases, order = "Tenant", "tenants", ("tenant", "tn"), 40
    fields = {
        "display_name": Field(f.text(200, blank=False), REQUIRED),
        "kind": Field(f.choice(Tenant.Kind.values), Tenant.Kind.TEAM),
        "parent": Field(f.optional(f.text(64, blank=False)), None),
        "run_uid": Field(f.optional(f.integer(0)), None),
    }

    def visible(self, access: Access) -> QuerySet:
        return tenant_list(access=access)

    def ident_of(self, obj: Tenant) -> dict[str, str]:
        return {"name": obj.slug}

    def find(self, ident: dict[str, str]) -> Tenant | None:
        return Tenant.objects.select_related("parent").filter(slug=ident["name"]).first()

    def current(self, obj: Tenant) -> dict[str, Any]:
        return {
            "display_name": obj.name,
            "kind": obj.kind,
            "parent": obj.parent.slug if obj.parent else None,
            "run_uid": obj.run_uid,
        }

    def status(self, obj: Tenant) -> dict[str, Any]:
        return {"members": obj.memberships.count(), "effective_run_uid": obj.run_uid_effective}

    def create(self, ident, labels, spec, ctx) -> Tenant:
        parent = _tenant(spec["parent"]) if spec["parent"] else None
        tenant = tenant_create(
            slug=ident["name"], name=spec["display_name"], kind=spec["kind"], parent=parent
        )
        if spec["run_uid"] is not None:
            tenant_update(tenant=tenant, values={"run_uid": spec["run_uid"]})
        return tenant

    def update(self, obj, changes, labels, ctx) -> None:
        values = {("name" if key == "display_name" else key): value for key, value in changes.items()}
        if "parent" in values:
            values["parent"] = _tenant(values["parent"]) if values["parent"] else None
        tenant_update(tenant=obj, values=values)

    def delete_refusal(self, obj: Tenant) -> str:
        return tenant_delete_refusal(obj)

    def delete(self, obj: Tenant, ctx: Context) -> None:
        tenant_delete(tenant=obj)


class MemberKind(Kind):
    """A membership: user + tenant + role. A user named here who does not exist is created without a
    usable password (apply never carries secrets): they sign in once an admin sets one, or work with an
    API token. Pruning a member removes the membership, never the user."""

    name, plural, aliases, order = "Member", "members", ("member", "mem"), 50
    identity = ("tenant", "user")
    writers = "the tenant's admins and platform admins"
    fields = {
        "role": Field(f.choice(Membership.Role.values), Membership.Role.MEMBER),
        "email": Field(f.text(254), "", create_only=True),
    }

    def visible(self, access: Access) -> QuerySet:
        queryset = Membership.objects.select_related("user", "tenant").order_by(
            "tenant__slug", "user__username"
        )
        return queryset if access.platform_admin else queryset.filter(tenant_id__in=access.tenant_ids)

    def ident_of(self, obj: Membership) -> dict[str, str]:
        return {"tenant": obj.tenant.slug, "user": obj.user.get_username()}

    def find(self, ident: dict[str, str]) -> Membership | None:
        return (
            Membership.objects.select_related("user", "tenant")
            .filter(tenant__slug=ident["tenant"], user__username=ident["user"])
            .first()
        )

    def current(self, obj: Membership) -> dict[str, Any]:
        return {"role": obj.role, "email": obj.user.email}

    def write_refusal(self, access: Access, ident: dict[str, str]) -> str:
        return _tenant_admin_refusal(access, ident["tenant"], self.plural)

    def create(self, ident, labels, spec, ctx) -> Membership:
        tenant = _tenant(ident["tenant"])
        user_model = get_user_model()
        user = user_model.objects.filter(username=ident["user"]).first()
        if user is None:
            user = user_model(username=ident["user"], email=spec["email"])
            user.set_unusable_password()
            user.full_clean()
            user.save()
            ctx.notes.append(f"user {ident['user']!r} created without a password (an admin sets one)")
        return membership_set(user=user, tenant=tenant, role=spec["role"])

    def update(self, obj, changes, labels, ctx) -> None:
        membership_set(user=obj.user, tenant=obj.tenant, role=changes.get("role", obj.role))

    def delete(self, obj: Membership, ctx: Context) -> None:
        membership_remove(membership=obj)


class QueueKind(Kind):
    name, plural, aliases, order = "Queue", "queues", ("queue", "q"), 60
    identity = ("tenant", "name")
    writers = "the tenant's admins and platform admins"
    fields = {
        "pool": Field(f.text(64, blank=False)),
        "default_priority": Field(f.integer(-(2**31), 2**31 - 1), 0),
        "weight": Field(f.integer(1), 1),
        "idle_reclaim": Field(f.choice(Queue.IdleReclaim.values), Queue.IdleReclaim.NOTIFY),
        "default_image": Field(f.text(512), ""),
    }

    def visible(self, access: Access) -> QuerySet:
        return workloads.queue_list(access=access)

    def ident_of(self, obj: Queue) -> dict[str, str]:
        return {"tenant": obj.tenant.slug, "name": obj.name}

    def find(self, ident: dict[str, str]) -> Queue | None:
        return (
            Queue.objects.select_related("tenant", "pool")
            .filter(tenant__slug=ident["tenant"], name=ident["name"])
            .first()
        )

    def current(self, obj: Queue) -> dict[str, Any]:
        return {
            "pool": obj.pool.name,
            "default_priority": obj.default_priority,
            "weight": obj.weight,
            "idle_reclaim": obj.idle_reclaim,
            "default_image": obj.default_image,
        }

    def write_refusal(self, access: Access, ident: dict[str, str]) -> str:
        return _tenant_admin_refusal(access, ident["tenant"], self.plural)

    def create(self, ident, labels, spec, ctx) -> Queue:
        values = {k: v for k, v in spec.items() if k != "pool"}
        return queue_create(
            tenant=_tenant(ident["tenant"]), pool=_pool(spec["pool"]), name=ident["name"], **values
        )

    def update(self, obj, changes, labels, ctx) -> None:
        if "pool" in changes:
            raise Refused(
                f"a queue's pool is fixed (its tasks point at pool {obj.pool.name!r}); "
                "make a new queue for the new pool"
            )
        queue_update(queue=obj, data=changes)

    def delete(self, obj: Queue, ctx: Context) -> None:
        queue_delete(queue=obj)  # refuses (Conflict, with the reason) a queue with live tasks or history


class QuotaKind(Kind):
    name, plural, aliases, order = "Quota", "quotas", ("quota", "quo"), 70
    identity = ("tenant", "pool")
    fields = {
        "guaranteed_gpus": Field(f.gpus),
        "borrow_limit_gpus": Field(f.gpus, 0),
        "gpu_mem_limit_mib": Field(f.optional(f.integer(0, 2**63 - 1)), None),
    }

    def visible(self, access: Access) -> QuerySet:
        return workloads.quota_list(access=access)

    def ident_of(self, obj: Quota) -> dict[str, str]:
        return {"tenant": obj.tenant.slug, "pool": obj.pool.name}

    def find(self, ident: dict[str, str]) -> Quota | None:
        return (
            Quota.objects.select_related("tenant", "pool")
            .filter(tenant__slug=ident["tenant"], pool__name=ident["pool"])
            .first()
        )

    def current(self, obj: Quota) -> dict[str, Any]:
        return {
            "guaranteed_gpus": f.gpus_from_milli(obj.guaranteed_milli),
            "borrow_limit_gpus": f.gpus_from_milli(obj.borrow_limit_milli),
            "gpu_mem_limit_mib": obj.gpu_mem_limit_mib,
        }

    def status(self, obj: Quota) -> dict[str, Any]:
        return {"live_tasks": workloads.quota_live_tasks(obj)}

    def _set(self, tenant: Tenant, pool: Pool, spec: dict[str, Any]) -> Quota:
        return quota_set(
            tenant=tenant,
            pool=pool,
            guaranteed_milli=f.gpus_to_milli(spec["guaranteed_gpus"]),
            borrow_limit_milli=f.gpus_to_milli(spec["borrow_limit_gpus"]),
            gpu_mem_limit_mib=spec["gpu_mem_limit_mib"],
        )

    def create(self, ident, labels, spec, ctx) -> Quota:
        return self._set(_tenant(ident["tenant"]), _pool(ident["pool"]), spec)

    def update(self, obj, changes, labels, ctx) -> None:
        self._set(obj.tenant, obj.pool, {**self.current(obj), **changes})

    def delete_refusal(self, obj: Quota) -> str:
        return quota_delete_refusal(obj) or quota_budget_refusal(obj)

    def delete(self, obj: Quota, ctx: Context) -> None:
        quota_delete(quota=obj)


class BudgetKind(Kind):
    """A monthly GPU-hour budget on a quota. Every set leaves an audit entry whose reason is the
    document's `spec.reason`, or "applied from SOURCE"."""

    name, plural, aliases, order = "Budget", "budgets", ("budget", "bu"), 80
    identity = ("tenant", "pool")
    fields = {
        "gpu_hours": Field(f.number(0.0)),
        "period": Field(f.choice(Budget.Period.values), Budget.Period.MONTH),
        "reason": Field(f.text(500), "", compared=False),
    }

    def visible(self, access: Access) -> QuerySet:
        queryset = Budget.objects.select_related("quota__tenant", "quota__pool")
        return queryset if access.platform_admin else queryset.filter(quota__tenant_id__in=access.tenant_ids)

    def ident_of(self, obj: Budget) -> dict[str, str]:
        return {"tenant": obj.quota.tenant.slug, "pool": obj.quota.pool.name}

    def find(self, ident: dict[str, str]) -> Budget | None:
        return (
            Budget.objects.select_related("quota__tenant", "quota__pool")
            .filter(quota__tenant__slug=ident["tenant"], quota__pool__name=ident["pool"])
            .first()
        )

    def current(self, obj: Budget) -> dict[str, Any]:
        # No reason: it belongs to each change (the audit trail, `status.changes`), not to the budget.
        return {"gpu_hours": obj.gpu_hours, "period": obj.period}

    def status(self, obj: Budget) -> dict[str, Any]:
        return {"changes": obj.changes.count()}

    def _set(self, tenant: Tenant, pool: Pool, spec: dict[str, Any], ctx: Context) -> Budget:
        reason = ctx.spec.get("reason") or f"applied from {ctx.source or 'a document'}"
        return budget_set(
            tenant=tenant, pool=pool, gpu_hours=float(spec["gpu_hours"]), reason=reason, by=ctx.user
        )

    def create(self, ident, labels, spec, ctx) -> Budget:
        return self._set(_tenant(ident["tenant"]), _pool(ident["pool"]), spec, ctx)

    def update(self, obj, changes, labels, ctx) -> None:
        self._set(obj.quota.tenant, obj.quota.pool, {**self.current(obj), **changes}, ctx)

    def delete_refusal(self, obj: Budget) -> str:
        return budget_delete_refusal(obj)


class GpuPriceKind(Kind):
    """What one GPU-hour of a catalogue model costs, in WHALEGEN_CURRENCY (metadata.name: the model)."""

    name, plural, aliases, order = "GpuPrice", "gpuprices", ("gpuprice", "price", "prices"), 90
    fields = {"per_gpu_hour": Field(f.number(0.0))}

    def visible(self, access: Access) -> QuerySet:
        return GpuPrice.objects.all()

    def ident_of(self, obj: GpuPrice) -> dict[str, str]:
        return {"name": obj.model}

    def find(self, ident: dict[str, str]) -> GpuPrice | None:
        return GpuPrice.objects.filter(model=ident["name"]).first()

    def current(self, obj: GpuPrice) -> dict[str, Any]:
        return {"per_gpu_hour": obj.per_gpu_hour}

    def create(self, ident, labels, spec, ctx) -> GpuPrice:
        try:
            model = get_model(ident["name"]).name
        except UnknownGpuModel:
            raise Refused(
                f"{ident['name']!r} is not a catalogue GPU model ({', '.join(model_names())})"
            ) from None
        if model != ident["name"]:
            raise Refused(f"write the model's catalogue name, {model!r}, as metadata.name")
        return gpu_price_set(model=model, per_gpu_hour=spec["per_gpu_hour"], actor=ctx.actor)

    def update(self, obj, changes, labels, ctx) -> None:
        gpu_price_set(model=obj.model, per_gpu_hour=changes["per_gpu_hour"], actor=ctx.actor)

    def delete(self, obj: GpuPrice, ctx: Context) -> None:
        gpu_price_delete(price=obj)


KINDS: tuple[Kind, ...] = (
    ClusterKind(),
    PoolKind(),
    NodeKind(),
    TenantKind(),
    MemberKind(),
    QueueKind(),
    QuotaKind(),
    BudgetKind(),
    GpuPriceKind(),
)
BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}


def kind_named(word: str) -> Kind | None:
    """A kind by its name, plural or short name, case-insensitively (`Pool`, `pools`, `pool`, `no`)."""
    lowered = word.lower()
    for kind in KINDS:
        if lowered in (kind.name.lower(), kind.plural, *kind.aliases):
            return kind
    return None
