"""Writes: budgets (set by platform admins, every change audited) and copies of what re-carved units held."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.accounting.models import Budget, BudgetChange, HeldUnit
from apps.accounting.selectors import unit_fraction
from apps.common.words import plural
from apps.inventory.models import ComputeUnit, Gpu, Pool
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


def quota_budget_refusal(quota: Quota) -> str:
    """Why `quota` may not be deleted for its budget ("" when it has none): a budget goes with its quota
    (CASCADE), and with it the budget's audit trail."""
    if Budget.objects.filter(quota=quota).exists():
        return "the quota carries a budget; remove the Budget document first"
    return ""


def budget_delete_refusal(budget: Budget) -> str:
    """Always a refusal: a budget's changes are its audit trail and go with it, so deleting is an admin's
    act, with the trail in view, never a side effect of a file that no longer names it."""
    changes = budget.changes.count()
    return (
        f"a budget keeps its audit trail ({plural(changes, 'change')}); set gpu_hours instead, or delete "
        "it in the admin"
    )


def held_units_keep(*, gpu_id: int) -> int:
    """Copy what each finished assignment held on `gpu_id`'s units before they are deleted (a re-carve,
    which has checked that no live assignment holds any); returns how many (assignment, unit) pairs were
    copied. Runs inside the re-carving transaction.

    The assignments are found by the GPU's node (indexed) and matched to the units in Python: a re-carve
    is rare, and an index over every assignment's unit ids would cost every cycle's insert.
    """
    units = {
        pk: (model, kind, profile, milli)
        for pk, model, kind, profile, milli in ComputeUnit.objects.filter(gpu_id=gpu_id).values_list(
            "pk", "gpu__model", "kind", "mig_profile", "gpu_milli"
        )
    }
    if not units:
        return 0
    node_id = Gpu.objects.filter(pk=gpu_id).values_list("node_id", flat=True).get()
    made = HeldUnit.objects.bulk_create(
        HeldUnit(
            assignment_id=assignment_id,
            gpu_model=units[unit_id][0],
            fraction=unit_fraction(
                kind=units[unit_id][1], mig_profile=units[unit_id][2], gpu_milli=units[unit_id][3]
            ),
        )
        for assignment_id, unit_ids in Assignment.objects.filter(node_id=node_id)
        .order_by("pk")
        .values_list("pk", "unit_ids")
        for unit_id in unit_ids
        if unit_id in units
    )
    return len(made)
