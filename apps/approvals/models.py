"""Priority overrides: a member asks, a platform admin decides, the raise lapses at `expires_at`."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.common.models import TimestampedModel
from apps.tenants.models import Tenant
from apps.workloads.models import Queue, Task


class PriorityOverride(TimestampedModel):
    class State(models.TextChoices):
        PENDING = "pending", "pending"
        APPROVED = "approved", "approved"  # in force until expires_at
        REJECTED = "rejected", "rejected"
        EXPIRED = "expired", "expired"  # lapsed, whether undecided or after its approved term

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="overrides")
    # Exactly one target: a task or a queue (see the check constraint).
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.CASCADE, related_name="overrides")
    queue = models.ForeignKey(
        Queue, null=True, blank=True, on_delete=models.CASCADE, related_name="overrides"
    )
    wanted_priority = models.IntegerField()
    # The target's priority when the override took effect, restored when it lapses.
    previous_priority = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="override_requests"
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="override_decisions",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.CharField(max_length=500, blank=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(task__isnull=False) & models.Q(queue__isnull=True))
                | (models.Q(task__isnull=True) & models.Q(queue__isnull=False)),
                name="override_exactly_one_target",
            ),
        ]

    def __str__(self) -> str:
        target = f"task {self.task_id}" if self.task_id else f"queue {self.queue_id}"
        return f"override {self.pk}: {target} → {self.wanted_priority} ({self.state})"


class OverrideAuditEntry(models.Model):
    """Append-only trail: who requested, approved, rejected; when the system let it lapse."""

    class Action(models.TextChoices):
        REQUESTED = "requested", "requested"
        APPROVED = "approved", "approved"
        REJECTED = "rejected", "rejected"
        EXPIRED = "expired", "expired"

    override = models.ForeignKey(PriorityOverride, on_delete=models.CASCADE, related_name="audit")
    created_at = models.DateTimeField(auto_now_add=True)
    action = models.CharField(max_length=10, choices=Action.choices)
    actor = models.CharField(max_length=150)
    note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.override_id} {self.action} by {self.actor}"


class ReclaimRequest(TimestampedModel):
    """An idle online-SLA task the idle check would have preempted: a platform admin decides.

    One request per (task, attempt): a rejected request keeps that run of the task where it is, and the
    check does not ask again until the task runs anew (docs/idle-reclaim.md).
    """

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        APPROVED = "approved", "approved"  # the task was preempted
        REJECTED = "rejected", "rejected"  # the task keeps its GPUs
        WITHDRAWN = "withdrawn", "withdrawn"  # the task stopped running or got busy before a decision

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="reclaim_requests")
    attempt = models.PositiveIntegerField()  # Task.attempts when the request was raised
    reason = models.CharField(max_length=500)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="reclaim_decisions",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "attempt"], name="reclaim_request_task_attempt_unique")
        ]

    def __str__(self) -> str:
        return f"reclaim {self.pk}: task {self.task_id} ({self.state})"
