"""Reads for the fleet. A tenant member sees the pools their tenants hold a quota in, and the clusters,
nodes and GPUs behind those pools; platform admins see everything."""

from __future__ import annotations

from django.db.models import Count, Prefetch, QuerySet
from django.http import Http404

from apps.common import hooks
from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool
from apps.tenants.selectors import Access


def _pool_ids(access: Access) -> QuerySet:
    return Pool.objects.filter(quotas__tenant_id__in=access.tenant_ids).values("pk")


def pool_list(*, access: Access) -> QuerySet[Pool]:
    queryset = Pool.objects.annotate(node_count=Count("nodes", distinct=True), gpu_count=Count("nodes__gpus"))
    if not access.platform_admin:
        queryset = queryset.filter(pk__in=_pool_ids(access))
    return queryset


def cluster_list(*, access: Access) -> QuerySet[Cluster]:
    queryset = Cluster.objects.annotate(node_count=Count("nodes"))
    if not access.platform_admin:
        queryset = queryset.filter(
            pk__in=Node.objects.filter(pool__in=_pool_ids(access)).values("cluster_id")
        )
    return queryset


def node_list(*, access: Access) -> QuerySet[Node]:
    queryset = Node.objects.select_related("cluster", "pool").annotate(gpu_count=Count("gpus"))
    if not access.platform_admin:
        queryset = queryset.filter(pool__in=_pool_ids(access))
    return queryset


def gpu_list(*, access: Access) -> QuerySet[Gpu]:
    # Each unit carries its holder and the holder's tenant (same prefetch query, two subqueries over the
    # live assignments of the unit's node): the API shows a task id only to whoever may see the task, and
    # "in use" to everyone else.
    units = Prefetch("units", queryset=hooks.units_with_holders(ComputeUnit.objects.all()))
    queryset = Gpu.objects.select_related("node", "node__cluster", "node__pool").prefetch_related(units)
    if not access.platform_admin:
        queryset = queryset.filter(node__pool__in=_pool_ids(access))
    return queryset


def _get(queryset: QuerySet, pk: int, what: str):
    obj = queryset.filter(pk=pk).first()
    if obj is None:
        raise Http404(f"no {what} {pk}")
    return obj


def pool_get(*, access: Access, pool_id: int) -> Pool:
    return _get(pool_list(access=access), pool_id, "pool")


def cluster_get(*, access: Access, cluster_id: int) -> Cluster:
    return _get(cluster_list(access=access), cluster_id, "cluster")


def node_get(*, access: Access, node_id: int) -> Node:
    return _get(node_list(access=access), node_id, "node")


def gpu_get(*, access: Access, gpu_id: int) -> Gpu:
    return _get(gpu_list(access=access), gpu_id, "GPU")


def pool_get_by_name(*, name: str) -> Pool | None:
    return Pool.objects.filter(name=name).first()


def node_cordoned(node: Node) -> bool:
    """Whether an operator holds the node out of placement (a draining node is on its way to cordoned; a
    lost node keeps the state it was lost from)."""
    held = (Node.State.CORDONED, Node.State.DRAINING)
    return node.state in held or (node.state == Node.State.LOST and node.state_before_lost in held)
