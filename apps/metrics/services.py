"""Writes of the operator app: the beat tick."""

from __future__ import annotations

from datetime import datetime

from apps.metrics.models import PlaneTick

TICK_ID = 1


def plane_tick(*, now: datetime) -> None:
    """Stamp the singleton tick row with `now` (idempotent: a rerun or a second worker just stamps again)."""
    PlaneTick.objects.update_or_create(pk=TICK_ID, defaults={"ticked_at": now})
