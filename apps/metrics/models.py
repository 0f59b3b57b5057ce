"""The one row `/readyz` reads to tell whether Celery beat (and a worker behind it) is alive."""

from __future__ import annotations

from django.db import models


class PlaneTick(models.Model):
    """A singleton (pk 1): the last time the beat entry `plane-tick` ran on a worker.

    Beat sends `plane-tick` every `WHALEGEN_PLANE_TICK_INTERVAL_S`; a worker runs it and stamps `ticked_at`.
    A stale stamp means beat is down, no worker consumes, or the broker between them is gone: any of them
    stops scheduling cycles, which is what readiness must reveal.
    """

    ticked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"plane tick at {self.ticked_at.isoformat(timespec='seconds')}"
