"""Reads for the scheduling app that other apps call: what tenants' live tasks hold, held units, cycle
records. The cycle's own input is read by `apps.scheduling.snapshot`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import F, QuerySet, Sum
from django.db.models.functions import Coalesce

from apps.scheduling.models import Assignment, Cycle
from apps.workloads.models import Task

LIVE_STATES = (Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING)


def held_unit_ids(*, task_ids: list[int]) -> dict[int, list[int]]:
    """Task → the ids of the compute units its live (unreleased) assignment holds, in bind order.

    The assignment is the record of what a task holds: units keep no holder of their own
    (`apps.scheduling.holders`)."""
    held: dict[int, list[int]] = defaultdict(list)
    for task_id, unit_ids in Assignment.objects.filter(
        task_id__in=task_ids, released_at__isnull=True
    ).values_list("task_id", "unit_ids"):
        held[task_id] += unit_ids
    return dict(held)


def cycle_list(*, pool_id: int | None = None) -> QuerySet[Cycle]:
    queryset = Cycle.objects.select_related("pool")
    return queryset if pool_id is None else queryset.filter(pool_id=pool_id)


def live_usage(*, pool_id: int, tenant_ids: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """What each tenant's live tasks in the pool hold against its quota: milli-GPUs as asked (count ×
    milli) and the GPU memory they state (count × gpu_mem_mib, for quotas that bound it)."""
    milli: dict[int, int] = defaultdict(int)
    mem_mib: dict[int, int] = defaultdict(int)
    # Summed by the database: a busy pool has thousands of live tasks, and the commit asks under its locks.
    rows = (
        Task.objects.filter(pool_id=pool_id, tenant_id__in=tenant_ids, state__in=LIVE_STATES)
        .values("tenant_id")
        .annotate(
            milli=Sum(F("gpu_count") * F("gpu_milli")),
            mem=Sum(F("gpu_count") * Coalesce(F("gpu_mem_mib"), 0)),
        )
        .values_list("tenant_id", "milli", "mem")
    )
    for tenant_id, held_milli, held_mem_mib in rows:
        milli[tenant_id] += held_milli or 0
        mem_mib[tenant_id] += held_mem_mib or 0
    return milli, mem_mib


@dataclass(frozen=True)
class QuotaUsage:
    """What a tenant's placed tasks hold in a pool: all of it, and the part held by tasks admitted above
    the guarantee (flagged `borrowed` at admission: the first capacity an owner reclaims). The flag stays
    with the task, so that part can exceed what is above the guarantee now, after earlier tasks ended."""

    in_use_milli: int = 0
    reclaimable_milli: int = 0


def quota_usage(*, tenant_ids: list[int]) -> dict[tuple[int, int], QuotaUsage]:
    """(tenant id, pool id) → usage of tasks admitted, assigned or running (count × milli)."""
    charge = Sum(F("gpu_count") * F("gpu_milli"))
    in_use = (
        Task.objects.filter(tenant_id__in=tenant_ids, state__in=LIVE_STATES)
        .values("tenant_id", "pool_id")
        .annotate(milli=charge)
    )
    reclaimable = (
        Task.objects.filter(
            tenant_id__in=tenant_ids,
            state__in=LIVE_STATES,
            assignments__released_at__isnull=True,
            assignments__borrowed=True,
        )
        .values("tenant_id", "pool_id")
        .annotate(milli=charge)
    )
    usage: dict[tuple[int, int], QuotaUsage] = {}
    for row in in_use:
        usage[(row["tenant_id"], row["pool_id"])] = QuotaUsage(in_use_milli=int(row["milli"] or 0))
    for row in reclaimable:
        key = (row["tenant_id"], row["pool_id"])
        usage[key] = QuotaUsage(
            in_use_milli=usage.get(key, QuotaUsage()).in_use_milli, reclaimable_milli=int(row["milli"] or 0)
        )
    return usage
