"""What a quota's waiting tasks ask has one definition, `quotas_with_waiting`, read by the quota list (API
and dashboard) and by /metrics (before, each computed it its own way)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.tenants.selectors import Access
from apps.workloads.models import Quota, Task
from apps.workloads.selectors import quota_list, quotas_with_waiting
from tests.apps.factories import TaskFactory

ADMIN = Access(platform_admin=True)


def _mixed_tasks(world: Any) -> None:
    """Besides the world's two pending one-GPU tasks (A's and B's in h100): A asks 2 × 1000 and 250 more
    in h100 and 500 in l4; running and finished tasks ask nothing that waits."""
    TaskFactory(queue=world.queue_a, gpu_count=2, gpu_milli=1000)
    TaskFactory(queue=world.queue_a, gpu_count=1, gpu_milli=250)
    TaskFactory(queue=world.queue_a_l4, gpu_count=1, gpu_milli=500)
    TaskFactory(queue=world.queue_a, gpu_count=4, gpu_milli=1000, state=Task.State.RUNNING)
    TaskFactory(queue=world.queue_b, gpu_count=8, gpu_milli=1000, state=Task.State.SUCCEEDED)


def _by_quota(rows: Any) -> dict[tuple[str, str], int]:
    return {(q.tenant.slug, q.pool.name): q.waiting_milli for q in rows}


def test_a_quota_waits_for_what_its_tenants_pending_tasks_ask_in_its_pool(world: Any) -> None:
    _mixed_tasks(world)
    waiting = _by_quota(quotas_with_waiting(Quota.objects.select_related("tenant", "pool")))
    assert waiting == {
        ("vision", "h100-train"): 1000 + 2000 + 250,
        ("vision", "l4-infer"): 500,
        ("speech", "h100-train"): 1000,
    }


def test_a_quota_with_nothing_pending_waits_for_zero_not_null(world: Any) -> None:
    Task.objects.filter(state=Task.State.PENDING).update(state=Task.State.CANCELLED)
    waiting = _by_quota(quotas_with_waiting(Quota.objects.select_related("tenant", "pool")))
    assert set(waiting.values()) == {0}


def test_the_quota_list_and_the_metrics_read_the_same_waiting_milli(world: Any) -> None:
    from apps.metrics.selectors import plane_readings

    _mixed_tasks(world)
    want = {
        (q.tenant_id, q.pool_id): q.waiting_milli
        for q in quotas_with_waiting(Quota.objects.all())  # the one definition
    }
    listed = {(q.tenant_id, q.pool_id): q.waiting_milli for q in quota_list(access=ADMIN)}
    readings = plane_readings(now=datetime.now(UTC))
    scraped = {(q["tenant_id"], q["pool_id"]): q["waiting_milli"] for q in readings.quotas}
    assert listed == scraped == want
    assert want[(world.tenant_a.pk, world.h100.pk)] == 3250


def test_the_quota_list_is_one_query_with_no_grouping(world: Any) -> None:
    # The waiting subquery must be computed once per quota: as a GROUP BY key of an aggregate over the
    # pool's tasks joined in, PostgreSQL ran it once per task row (46 against 4 ms a call for 250 tasks).
    # Every figure of the list is now a subquery per quota, so nothing is grouped at all.
    _mixed_tasks(world)
    with CaptureQueriesContext(connection) as queries:
        rows = list(quota_list(access=ADMIN))
    assert len(rows) == 3
    [query] = queries.captured_queries
    assert "GROUP BY" not in query["sql"], query["sql"]
