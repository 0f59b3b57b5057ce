"""A cycle leaves the task of a tenant whose GPU-hour budget is spent pending, with the reason, and
places another tenant's; what already runs keeps running."""

from __future__ import annotations

from datetime import timedelta

from tests.apps.scheduling.conftest import NOW, run, start


def test_a_spent_budget_keeps_new_work_pending_while_others_are_placed(fleet) -> None:
    from apps.accounting.services import budget_set
    from apps.scheduling.models import Assignment

    fleet.node(gpus=3)
    vision = fleet.tenant("vision", guaranteed=2000)
    fleet.tenant("audio", guaranteed=2000)
    first = fleet.submit("vision")
    run(fleet)
    start(first)
    # It has held its GPU for two hours of this month.
    Assignment.objects.filter(task=first).update(created_at=NOW - timedelta(hours=2))
    budget_set(tenant=vision, pool=fleet.pool, gpu_hours=1.5, reason="pilot month", by=fleet.user)

    late = fleet.submit("vision", priority=10)
    other = fleet.submit("audio")
    run(fleet, minutes=1)
    for t in (first, late, other):
        t.refresh_from_db()
    assert (first.state, late.state, other.state) == ("running", "pending", "assigned")
    assert late.why_pending_code == "budget_spent"
    assert (
        late.why_pending
        == "tenant vision has used its 1.5 GPU-hour budget for train in November 2026 (2.0 h)"
    )

    # Raised above what was used, the budget lets the task in on the next cycle.
    budget_set(tenant=vision, pool=fleet.pool, gpu_hours=10, reason="deadline", by=fleet.user)
    run(fleet, minutes=2)
    late.refresh_from_db()
    assert late.state == "assigned"
