"""Celery tasks for run output: thin, idempotent."""

from __future__ import annotations

from celery import shared_task

from apps.logs.services import logs_expire


@shared_task(name="apps.logs.tasks.logs_expire")
def logs_expire_task() -> int:
    """Beat entry "logs-expire": drop the output of tasks that ended beyond the retention. Safe to run
    twice or concurrently (a delete of what is already gone deletes nothing)."""
    return logs_expire()
