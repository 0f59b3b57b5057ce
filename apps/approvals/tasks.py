"""Celery tasks for approvals: thin, idempotent, by id."""

from __future__ import annotations

from celery import shared_task

from apps.approvals.services import override_expire
from apps.approvals.services import overrides_expire as overrides_expire_service


@shared_task(name="apps.approvals.tasks.overrides_expire")
def overrides_expire() -> int:
    """Beat entry "expire-overrides": let every due override lapse. Safe to run twice or concurrently."""
    return overrides_expire_service()


@shared_task(name="apps.approvals.tasks.override_expire_one")
def override_expire_one(override_id: int) -> bool:
    return override_expire(override_id=override_id)
