"""A pool or a quota that still holds work refuses deletion, with the reason a person reads."""

from __future__ import annotations

import pytest

from apps.workloads.models import Task
from apps.workloads.services import pool_delete_refusal, quota_delete_refusal
from tests.apps.factories import PoolFactory, QueueFactory, QuotaFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_a_pool_refuses_deletion_while_tasks_live_then_for_its_queue_then_for_its_history() -> None:
    queue = QueueFactory()
    pool = queue.pool
    task = TaskFactory(queue=queue, state=Task.State.PENDING)
    live = f"pool {pool.name!r} has 1 live task; they must finish or be cancelled"
    assert pool_delete_refusal(pool) == live
    Task.objects.filter(pk=task.pk).update(state=Task.State.SUCCEEDED)
    assert pool_delete_refusal(pool) == f"pool {pool.name!r} still has 1 queue; remove or move them first"
    Task.objects.filter(pk=task.pk).update(queue=QueueFactory())  # the pool's own queue can go now
    queue.delete()
    assert pool_delete_refusal(pool) == f"pool {pool.name!r} has task history, which keeps it"
    assert pool_delete_refusal(PoolFactory()) == ""


def test_a_quota_refuses_deletion_while_its_tenant_has_live_tasks_in_the_pool() -> None:
    quota = QuotaFactory()
    queue = QueueFactory(tenant=quota.tenant, pool=quota.pool)
    TaskFactory.create_batch(2, queue=queue, state=Task.State.PENDING)
    TaskFactory(queue=queue, state=Task.State.FAILED)
    assert quota_delete_refusal(quota) == (
        f"tenant {quota.tenant.slug!r} has 2 live tasks in pool {quota.pool.name!r}; "
        "they must finish or be cancelled first"
    )
    Task.objects.filter(tenant=quota.tenant).update(state=Task.State.CANCELLED)
    assert quota_delete_refusal(quota) == ""
