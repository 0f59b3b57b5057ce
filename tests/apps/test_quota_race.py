"""Quota accounting under real concurrency: 50 submitters on their own PostgreSQL connections race for
one quota. The row lock must let exactly as many through as fit, never one more."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from apps.workloads.models import Quota, Task
from apps.workloads.services import TaskRequest, task_submit
from tests.apps.factories import PoolFactory, QueueFactory, QuotaFactory, TenantFactory, UserFactory

SUBMITTERS = 50


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_submitters_never_over_admit_one_quota() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("the quota race must run on PostgreSQL (set DATABASE_URL)")
    tenant, pool, user = TenantFactory(), PoolFactory(), UserFactory()
    QueueFactory(tenant=tenant, pool=pool, name="race")
    # 7.5 GPUs of quota and 50 submitters of half a GPU each: exactly 15 fit.
    quota = QuotaFactory(tenant=tenant, pool=pool, guaranteed_milli=6000, borrow_limit_milli=1500)
    barrier = threading.Barrier(SUBMITTERS)
    outcomes: list[str] = []
    lock = threading.Lock()

    def submit(n: int) -> None:
        try:
            barrier.wait()  # all threads start their transactions together
            task_submit(tenant=tenant, request=TaskRequest(queue="race", gpu_milli=500), submitted_by=user)
            outcome = "admitted"
        except Exception as exc:
            outcome = f"refused: {exc}"
        finally:
            connections.close_all()  # each thread had its own connection
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    admitted = outcomes.count("admitted")
    refused = [o for o in outcomes if o != "admitted"]
    assert len(outcomes) == SUBMITTERS
    assert admitted == 15, refused[:3]
    assert all("above what tenant" in o for o in refused), refused[:3]
    quota.refresh_from_db()
    assert quota.charged_milli == 7500 == sum(t.charge_milli for t in Task.objects.filter(tenant=tenant))
    assert Quota.objects.get(pk=quota.pk).charged_milli <= quota.limit_milli
