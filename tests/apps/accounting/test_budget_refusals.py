"""A budget is never deleted by `whalegen apply`, and a quota carrying one refuses deletion."""

from __future__ import annotations

import pytest

from apps.accounting.models import Budget, BudgetChange
from apps.accounting.services import budget_delete_refusal, quota_budget_refusal
from tests.apps.factories import QuotaFactory

pytestmark = pytest.mark.django_db


def test_a_quota_with_a_budget_refuses_deletion_and_the_budget_always_does() -> None:
    quota = QuotaFactory()
    assert quota_budget_refusal(quota) == ""
    budget = Budget.objects.create(quota=quota, gpu_hours=10)
    assert quota_budget_refusal(quota) == "the quota carries a budget; remove the Budget document first"
    assert budget_delete_refusal(budget).startswith("a budget keeps its audit trail (0 changes)")
    BudgetChange.objects.create(budget=budget, actor="user:root", old_gpu_hours=None, new_gpu_hours=10)
    assert budget_delete_refusal(budget) == (
        "a budget keeps its audit trail (1 change); set gpu_hours instead, or delete it in the admin"
    )
