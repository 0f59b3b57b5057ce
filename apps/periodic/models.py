"""What the leading beat sent last, per schedule entry: a beat that takes over reads it, so an entry is
never sent again sooner than its interval because the sender changed."""

from __future__ import annotations

from django.db import models


class PeriodicRun(models.Model):
    """One row per beat schedule entry, written only through the leader's own session
    (apps/periodic/leader.py): a row's version moves by one per send, compare-and-set."""

    name = models.CharField(max_length=200, primary_key=True)
    last_run_at = models.DateTimeField()  # the database's clock, not a beat host's
    version = models.PositiveBigIntegerField(default=0)
    sent_by = models.CharField(max_length=200, blank=True)  # "<host>:<pid>" of the beat that sent it

    def __str__(self) -> str:
        return f"{self.name} (v{self.version}, {self.last_run_at:%Y-%m-%d %H:%M:%S})"
