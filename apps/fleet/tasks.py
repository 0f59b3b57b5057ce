"""Celery tasks for the fleet: thin, idempotent."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery import shared_task

from apps.fleet.idle import idle_check_pool
from apps.fleet.nodes import drains_complete, nodes_mark_lost
from apps.inventory.models import Pool


@shared_task(name="apps.fleet.tasks.nodes_check_health")
def nodes_check_health() -> dict[str, list[int]]:
    """Beat entry "fleet-node-health": mark silent nodes lost (requeueing their tasks), finish drains.
    Safe to run twice or concurrently: every change is a compare-and-set."""
    return {"lost": nodes_mark_lost(), "drained": drains_complete()}


@shared_task(name="apps.fleet.tasks.idle_check_all_pools")
def idle_check_all_pools() -> int:
    """Beat entry "idle-reclaim": one idle check per pool, each its own Celery task."""
    pool_ids = list(Pool.objects.values_list("pk", flat=True))
    for pool_id in pool_ids:
        idle_check.delay(pool_id)
    return len(pool_ids)


@shared_task(name="apps.fleet.tasks.idle_check")
def idle_check(pool_id: int) -> dict[str, Any]:
    """Flag, unflag and reclaim one pool's idle tasks. Safe to run twice or concurrently."""
    return asdict(idle_check_pool(pool_id=pool_id))
