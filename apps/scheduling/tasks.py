"""Celery tasks for the scheduling loop: thin, by id, safe to run twice or concurrently."""

from __future__ import annotations

from celery import shared_task

from apps.inventory.models import Pool
from apps.scheduling.services import cycle_run


@shared_task(name="apps.scheduling.tasks.cycle_pool", ignore_result=True)
def cycle_pool(pool_id: int) -> str:
    """One cycle over one pool. Idempotent: a second copy finds the pool busy or nothing new to place."""
    return cycle_run(pool_id=pool_id).status


@shared_task(name="apps.scheduling.tasks.cycles_all_pools", ignore_result=True)
def cycles_all_pools() -> int:
    """Beat entry "schedule-pools": fan out one `cycle_pool` per pool, so pools run on any worker."""
    pool_ids = list(Pool.objects.values_list("pk", flat=True))
    for pool_id in pool_ids:
        cycle_pool.delay(pool_id)
    return len(pool_ids)
