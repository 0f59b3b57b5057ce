"""Task profiles in a profile-aware cycle's snapshot (docs/notes/goodput-design.md §10).

The compute/bandwidth class is learned by the periodic profile refresh and stored on
`workloads.TaskProfile` (apps.forecasting.services.task_profiles_refresh); a cycle only reads it, for its
pending tasks and for the tasks already running, so that a fresh engine knows its neighbours on a shared
GPU (their SM utilisation, and an online task's SLA) rather than counting each as a busy training job.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import OuterRef, Subquery

from apps.workloads.models import Task, TaskProfile
from whalegen.placement.types import TaskProfile as PlacementProfile

if TYPE_CHECKING:  # only annotations: the snapshot package imports this module
    from apps.scheduling.snapshot.pool import PoolSnapshot

# The lowest throughput factor (shared over alone) an online task tolerates: the example, 90 % of
# its speed alone. Profile-aware placement refuses co-locations predicted to fall below it.
ONLINE_SLA_MIN_FACTOR = 0.9
# An online task whose key has no class yet is placed as balanced (the replay's services too): its SLA is
# still weighed, with its own utilisation unknown, so counted as busy.
ONLINE_PRIOR_EXPONENT = 0.5


def task_profiles(task_ids: list[int], *, since: object) -> dict[str, PlacementProfile]:
    """Task id → what placement reads of its key's stored profile, for the tasks whose key has a class
    learned from telemetry at or after `since` (an older one is forgotten, as the samples are), plus the
    SLA of online tasks. One query: the tasks, their key's stored figures joined in."""
    if not task_ids:
        return {}
    stored = TaskProfile.objects.filter(
        tenant_id=OuterRef("tenant_id"), profile_key=OuterRef("profile_key"), last_sample_at__gte=since
    ).exclude(profile_key="")
    rows = (
        Task.objects.filter(pk__in=task_ids)
        .annotate(
            exponent=Subquery(stored.values("compute_exponent")[:1]),
            sm=Subquery(stored.values("bound_sm_util_pct")[:1]),
        )
        .values_list("id", "sla_class", "exponent", "sm")
    )
    profiles: dict[str, PlacementProfile] = {}
    for pk, sla_class, exponent, sm in rows:
        online = sla_class == Task.SlaClass.ONLINE
        if exponent is None and not online:
            continue
        sla = ONLINE_SLA_MIN_FACTOR if online else None
        exponent = exponent if exponent is not None else ONLINE_PRIOR_EXPONENT
        profiles[str(pk)] = PlacementProfile(compute_exponent=exponent, sm_util_pct=sm, sla_min_factor=sla)
    return profiles


def snapshot_with_profiles(snapshot: PoolSnapshot) -> PoolSnapshot:
    """`snapshot` with the stored profiles of its pending GPU tasks and running tasks (one query)."""
    cluster = snapshot.cluster
    ids = [int(t.task_id) for t in cluster.pending if t.num_gpu > 0] + [
        int(t.task_id) for t in cluster.running
    ]
    since = snapshot.now - timedelta(days=settings.WHALEGEN_FORECAST_LOOKBACK_DAYS)
    found = task_profiles(ids, since=since)
    if not found:
        return snapshot
    cluster = replace(
        cluster,
        pending=tuple(
            replace(t, profile=found[t.task_id]) if t.task_id in found else t for t in cluster.pending
        ),
        running=tuple(
            replace(t, profile=found[t.task_id]) if t.task_id in found else t for t in cluster.running
        ),
    )
    return replace(snapshot, cluster=cluster, pure=replace(snapshot.pure, cluster=cluster))
