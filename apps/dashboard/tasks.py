"""Celery tasks for the dashboard: thin, by ids."""

from __future__ import annotations

from celery import shared_task

from apps.dashboard.whatif import decide_cycle


@shared_task(name="apps.dashboard.tasks.whatif_decide", ignore_result=True)
def whatif_decide(pool_id: int, policies: list[str], cycle_id: int) -> None:
    """The what-if page's decision for the pool after cycle `cycle_id`, stored for the page to read.
    Safe to run twice: a second copy finds it stored."""
    decide_cycle(pool_id=pool_id, policies=tuple(policies), cycle_id=cycle_id)
