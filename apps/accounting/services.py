"""Writes: budgets (set by platform admins, every change audited) and copies of what re-carved units held."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.accounting.models import Budget, BudgetChange, HeldUnit
from apps.accounting.selectors import unit_fraction
from apps.inventory.models import Pool
from apps.scheduling.models import Assignment
from apps.tenants.models import Tenant
from apps.workloads.models import Quota
from apps.workloads.services import user_actor


@transaction.atomic
def budget_set(*, tenant: Tenant, pool: Pool, gpu_hours: float, reason: str, by: AbstractBaseUser) -> Budget:
    """Set the monthly GPU-hour budget of `tenant` in `pool` (creating it), leaving an audit entry.

    The caller has checked that `by` is a platform admin. The quota row is locked, so two admins changing
    the same budget at once are recorded one after the other, each with the old value it replaced.
    """
    if gpu_hours < 0:
        raise ValidationError({"gpu_hours": ["a budget is zero or more GPU-hours"]})
    if not reason.strip():
        raise ValidationError({"reason": ["say why the budget changes; it is kept in the audit trail"]})
    quota = Quota.objects.select_for_update().filter(tenant=tenant, pool=pool).first()
    if quota is None:
        raise ValidationError({"pool": [f"tenant {tenant.slug!r} has no quota in pool {pool.name!r}"]})
    budget = Budget.objects.filter(quota=quota).first()
    old = None if budget is None else budget.gpu_hours
    if budget is None:
        budget = Budget.objects.create(quota=quota, gpu_hours=gpu_hours)
    else:
        budget.gpu_hours = gpu_hours
        budget.save(update_fields=["gpu_hours", "updated_at"])
    BudgetChange.objects.create(
        budget=budget, actor=user_actor(by), old_gpu_hours=old, new_gpu_hours=gpu_hours, reason=reason[:500]
    )
    return budget


def held_units_keep(*, gpu_id: int) -> int:
    """Copy what each finished assignment held on `gpu_id`'s free units before they are deleted (a
    re-carve); returns how many links were copied. Runs inside the re-carving transaction."""
    through = Assignment.units.through
    links = through.objects.filter(computeunit__gpu_id=gpu_id, computeunit__task__isnull=True).values_list(
        "assignment_id", "computeunit__gpu__model", "computeunit__kind", "computeunit__mig_profile",
        "computeunit__gpu_milli",
    )  # fmt: skip
    made = HeldUnit.objects.bulk_create(
        HeldUnit(
            assignment_id=assignment_id,
            gpu_model=model,
            fraction=unit_fraction(kind=kind, mig_profile=profile, gpu_milli=milli),
        )
        for assignment_id, model, kind, profile, milli in links
    )
    return len(made)
