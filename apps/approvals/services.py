"""Writes for priority overrides and reclaim requests. Each decision is a conditional UPDATE on the pending
row, so two admins deciding at once cannot both win, and every step leaves an audit entry (an override's
audit trail; a reclaim decision's task event). The idle check (apps.fleet.idle) raises reclaim requests."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.approvals.models import OverrideAuditEntry, PriorityOverride, ReclaimRequest
from apps.common.errors import Conflict
from apps.tenants.models import Tenant
from apps.workloads.models import Queue, Task
from apps.workloads.services import IDLE_ACTOR, task_note, task_preempt_idle, user_actor
from apps.workloads.state_machine import FINAL

Action = OverrideAuditEntry.Action


@transaction.atomic
def override_request(
    *,
    tenant: Tenant,
    wanted_priority: int,
    reason: str,
    requested_by: AbstractBaseUser,
    task: Task | None = None,
    queue: Queue | None = None,
    ttl_hours: int | None = None,
    now: datetime | None = None,
) -> PriorityOverride:
    now = now or timezone.now()
    if (task is None) == (queue is None):
        raise ValidationError({"task": ["name exactly one target: a task or a queue"]})
    target = task if task is not None else queue
    assert target is not None
    if target.tenant_id != tenant.pk:
        raise ValidationError({"task" if task else "queue": ["the target belongs to another tenant"]})
    if task is not None and task.state in FINAL:
        raise ValidationError({"task": [f"task {task.pk} is {task.state}; there is nothing left to raise"]})
    current = task.priority if task is not None else queue.default_priority  # type: ignore[union-attr]
    if wanted_priority <= current:
        raise ValidationError({"wanted_priority": [f"must be above the current priority {current}"]})
    if not reason.strip():
        raise ValidationError({"reason": ["say why the raise is needed; the approver reads it"]})
    ttl = settings.WHALEGEN_OVERRIDE_TTL_HOURS if ttl_hours is None else ttl_hours
    if ttl < 1:
        raise ValidationError({"ttl_hours": ["an override lives at least one hour"]})
    override = PriorityOverride.objects.create(
        tenant=tenant,
        task=task,
        queue=queue,
        wanted_priority=wanted_priority,
        reason=reason,
        requested_by=requested_by,
        expires_at=now + timedelta(hours=ttl),
    )
    OverrideAuditEntry.objects.create(
        override=override, action=Action.REQUESTED, actor=user_actor(requested_by), note=reason
    )
    return override


def _set_target_priority(override: PriorityOverride, priority: int) -> None:
    if override.task_id is not None:
        Task.objects.filter(pk=override.task_id).update(priority=priority)
    else:
        Queue.objects.filter(pk=override.queue_id).update(default_priority=priority)


def _decide(
    *, override: PriorityOverride, to_state: str, by: AbstractBaseUser, comment: str, now: datetime | None
) -> PriorityOverride:
    now = now or timezone.now()
    if to_state == PriorityOverride.State.APPROVED and override.task_id is not None:
        # A raise for a task that has finished would change nothing but its record; say so instead.
        finished = Task.objects.filter(pk=override.task_id, state__in=FINAL).values_list("state", flat=True)
        if finished:
            raise Conflict(
                f"task {override.task_id} is {finished[0]}; there is nothing left to raise "
                "(reject the request instead)"
            )
    with transaction.atomic():
        decided = PriorityOverride.objects.filter(
            pk=override.pk, state=PriorityOverride.State.PENDING, expires_at__gt=now
        ).update(state=to_state, decided_by=by, decided_at=now, comment=comment, updated_at=now)
        if decided != 1:
            override.refresh_from_db()
            raise Conflict(
                f"override {override.pk} is {override.state}, not pending; it cannot be {to_state} now"
            )
        if to_state == PriorityOverride.State.APPROVED:
            target = override.task if override.task_id else override.queue
            previous = target.priority if override.task_id else target.default_priority  # type: ignore[union-attr]
            PriorityOverride.objects.filter(pk=override.pk).update(previous_priority=previous)
            _set_target_priority(override, override.wanted_priority)
        action = Action.APPROVED if to_state == PriorityOverride.State.APPROVED else Action.REJECTED
        OverrideAuditEntry.objects.create(
            override=override, action=action, actor=user_actor(by), note=comment
        )
    override.refresh_from_db()
    return override


def override_approve(
    *, override: PriorityOverride, by: AbstractBaseUser, comment: str = "", now: datetime | None = None
) -> PriorityOverride:
    return _decide(
        override=override, to_state=PriorityOverride.State.APPROVED, by=by, comment=comment, now=now
    )


def override_reject(
    *, override: PriorityOverride, by: AbstractBaseUser, comment: str, now: datetime | None = None
) -> PriorityOverride:
    if not comment.strip():
        raise ValidationError({"comment": ["a rejection needs a comment for the requester"]})
    return _decide(
        override=override, to_state=PriorityOverride.State.REJECTED, by=by, comment=comment, now=now
    )


def override_expire(*, override_id: int, now: datetime | None = None) -> bool:
    """Let one override lapse if its time is up. Idempotent: False when there was nothing to do.

    A pending request lapses undecided. An approved one gives its target back the previous priority,
    unless something else changed that priority since (then the newer value stands, and a newer approved
    override that raised it from this one's priority inherits this one's previous priority).
    """
    now = now or timezone.now()
    with transaction.atomic():
        override = (
            PriorityOverride.objects.select_for_update()
            .filter(
                pk=override_id,
                state__in=[PriorityOverride.State.PENDING, PriorityOverride.State.APPROVED],
                expires_at__lte=now,
            )
            .first()
        )
        if override is None:
            return False
        was = override.state
        PriorityOverride.objects.filter(pk=override.pk).update(
            state=PriorityOverride.State.EXPIRED, updated_at=now
        )
        if was == PriorityOverride.State.APPROVED and override.previous_priority is not None:
            if override.task_id is not None:
                restored = Task.objects.filter(pk=override.task_id, priority=override.wanted_priority).update(
                    priority=override.previous_priority
                )
            else:
                restored = Queue.objects.filter(
                    pk=override.queue_id, default_priority=override.wanted_priority
                ).update(default_priority=override.previous_priority)
            if not restored:
                # A newer raise approved on top of this one stands; it must restore what this one would
                # have, not this one's lapsed priority (else the raise outlives both terms).
                PriorityOverride.objects.filter(
                    task_id=override.task_id,
                    queue_id=override.queue_id,
                    state=PriorityOverride.State.APPROVED,
                    previous_priority=override.wanted_priority,
                ).exclude(pk=override.pk).update(previous_priority=override.previous_priority, updated_at=now)
        note = (
            "approved term ended; priority restored"
            if was == PriorityOverride.State.APPROVED
            else "not decided in time"
        )
        OverrideAuditEntry.objects.create(
            override=override, action=Action.EXPIRED, actor="system:overrides_expire", note=note
        )
    return True


def overrides_expire(*, now: datetime | None = None) -> int:
    """Expire every override whose time is up; returns how many lapsed."""
    now = now or timezone.now()
    due = PriorityOverride.objects.filter(
        state__in=[PriorityOverride.State.PENDING, PriorityOverride.State.APPROVED], expires_at__lte=now
    ).values_list("pk", flat=True)
    return sum(override_expire(override_id=pk, now=now) for pk in list(due))


# ------------------------------------------------------------------------------------ reclaim requests


def _reclaim_decided(
    *, request: ReclaimRequest, to_state: str, by: AbstractBaseUser, comment: str, now: datetime
) -> None:
    decided = ReclaimRequest.objects.filter(pk=request.pk, state=ReclaimRequest.State.PENDING).update(
        state=to_state, decided_by=by, decided_at=now, comment=comment, updated_at=now
    )
    if decided != 1:
        request.refresh_from_db()
        raise Conflict(
            f"reclaim request {request.pk} is {request.state}, not pending; it cannot be {to_state} now"
        )


def reclaim_approve(
    *, request: ReclaimRequest, by: AbstractBaseUser, comment: str = "", now: datetime | None = None
) -> ReclaimRequest:
    """Preempt the task the request is about, if it still runs the attempt the request was raised for."""
    now = now or timezone.now()
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=request.task_id)
        if task.state != Task.State.RUNNING or task.attempts != request.attempt:
            raise Conflict(
                f"task {task.pk} is {task.state} (attempt {task.attempts}); the run this request is about "
                "has ended, there is nothing to reclaim (reject the request instead)"
            )
        _reclaim_decided(
            request=request, to_state=ReclaimRequest.State.APPROVED, by=by, comment=comment, now=now
        )
        note = f": {comment}" if comment else ""
        reason = f"reclaimed while idle: reclaim request {request.pk} approved by {user_actor(by)}{note}"
        if not task_preempt_idle(task=task, reason=reason[:500], now=now):
            raise Conflict(f"task {task.pk} changed while the request was approved; reload and retry")
    request.refresh_from_db()
    return request


def reclaim_reject(
    *, request: ReclaimRequest, by: AbstractBaseUser, comment: str, now: datetime | None = None
) -> ReclaimRequest:
    """The task keeps its GPUs; this run of it is not asked about again."""
    if not comment.strip():
        raise ValidationError({"comment": ["a rejection needs a comment for the task's owner"]})
    now = now or timezone.now()
    with transaction.atomic():
        _reclaim_decided(
            request=request, to_state=ReclaimRequest.State.REJECTED, by=by, comment=comment, now=now
        )
        reason = f"reclaim request {request.pk} rejected by {user_actor(by)}: {comment}"
        task_note(task_id=request.task_id, actor=IDLE_ACTOR, reason=reason[:500])
    request.refresh_from_db()
    return request
