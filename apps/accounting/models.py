"""GPU-hour budgets per tenant × pool, their audit trail, and what re-carved units were held.

Usage itself has no table: it is computed from the assignments' start and release times and the units
they held (`apps.accounting.selectors`), so it can never drift from what the scheduler committed.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from apps.common.models import TimestampedModel
from apps.scheduling.models import Assignment
from apps.workloads.models import Quota


class Budget(TimestampedModel):
    """At most `gpu_hours` GPU-hours per period for one tenant in one pool (one quota).

    Once the period's usage reaches it the scheduler admits nothing new for that tenant there; running
    work goes on (and may end above the budget). The limit applies to every period until an admin
    changes it; usage starts again at zero with each period.
    """

    class Period(models.TextChoices):
        MONTH = "month", "calendar month (UTC)"

    quota = models.OneToOneField(Quota, on_delete=models.CASCADE, related_name="budget")
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTH)
    gpu_hours = models.FloatField(validators=[MinValueValidator(0.0)])

    class Meta:
        ordering = ["quota__tenant__slug", "quota__pool__name"]

    def __str__(self) -> str:
        return f"{self.quota}: {self.gpu_hours:g} GPU-h per {self.period}"


class BudgetChange(models.Model):
    """Append-only trail of every budget set or changed: who, when, old → new, and why."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="changes")
    created_at = models.DateTimeField(auto_now_add=True)
    actor = models.CharField(max_length=150)
    old_gpu_hours = models.FloatField(null=True, blank=True)  # None: the budget was created
    new_gpu_hours = models.FloatField()
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.budget_id}: {self.old_gpu_hours} → {self.new_gpu_hours} by {self.actor}"


class HeldUnit(models.Model):
    """What an assignment held on a compute unit that has since been deleted.

    A re-carve deletes a MIG GPU's free units, and with them the finished assignments' links to those
    units; before it does, the fraction and GPU model each link stood for are copied here, so a month's
    GPU-hours do not shrink when a GPU is re-carved.
    """

    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="held_units")
    gpu_model = models.CharField(max_length=32)
    fraction = models.FloatField()  # of one GPU's compute: 1.0 whole, 3/7 a 3g MIG instance, 0.3 …

    class Meta:
        ordering = ["assignment_id", "id"]

    def __str__(self) -> str:
        return f"{self.assignment_id}: {self.fraction:.3f} of a {self.gpu_model}"
