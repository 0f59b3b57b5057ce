"""Celery tasks of the operator app: thin, idempotent."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from apps.metrics.services import plane_tick


@shared_task(name="apps.metrics.tasks.plane_tick", ignore_result=True)
def plane_tick_task() -> None:
    """Beat entry "plane-tick": the stamp `/readyz` reads as "beat seen recently"."""
    plane_tick(now=timezone.now())
