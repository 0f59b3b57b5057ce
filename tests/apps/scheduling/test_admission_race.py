"""Admission under real concurrency: 50 submitters on their own PostgreSQL connections race each other
and two cycles (without the advisory lock, so only the commit's quota row lock and compare-and-set keep
the limit). Every valid submission is accepted and holds nothing while pending; what admitted tasks hold
never passes the limit, and exactly as many are admitted as fit."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from apps.scheduling.services import cycle_run
from apps.workloads.models import Task
from apps.workloads.services import TaskSubmission, task_submit
from tests.apps.factories import held_milli
from tests.apps.scheduling.conftest import NOW, Fleet
from tests.apps.scheduling.invariants import violations

SUBMITTERS = 50


def _together(jobs: list[Any]) -> list[str]:
    """Run each job on its own thread and connection, all released at once; their outcomes."""
    barrier = threading.Barrier(len(jobs))
    outcomes: list[str] = []
    lock = threading.Lock()

    def run(job: Any) -> None:
        try:
            barrier.wait()
            outcome = job()
        except Exception as exc:  # the outcome is what the test reads
            outcome = f"error: {exc!r}"
        finally:
            connections.close_all()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_all_wait_and_concurrent_cycles_admit_no_more_than_the_limit(
    fleet: Fleet,
) -> None:
    if connection.vendor != "postgresql":
        pytest.fail("the admission race must run on PostgreSQL (set DATABASE_URL)")
    for _ in range(2):
        fleet.node(gpus=8)  # 16 GPUs: room for every task, so only the quota holds them back
    tenant = fleet.tenant("a", guaranteed=6000, borrow=1000)  # 7 GPUs: exactly 7 whole-GPU tasks fit
    quota = tenant.quotas.get()

    def submit() -> str:
        task_submit(tenant=tenant, request=TaskSubmission(queue="q", gpu_count=1), submitted_by=fleet.user)
        return "accepted"

    outcomes = _together([submit] * SUBMITTERS)
    assert outcomes == ["accepted"] * SUBMITTERS  # a busy team's valid work queues; nothing bounces
    assert Task.objects.filter(state="pending").count() == SUBMITTERS
    assert held_milli(quota) == 0  # pending tasks hold no quota

    def cycle() -> str:
        return cycle_run(pool_id=fleet.pool.pk, now=NOW, lock=False).status

    # Two cycles and ten more submitters at once: the cycles race each other and the inserts.
    outcomes = _together([cycle, cycle] + [submit] * 10)
    assert sorted(outcomes) == ["accepted"] * 10 + ["done", "done"], outcomes
    assert held_milli(quota) == 7000
    assert Task.objects.filter(state="assigned").count() == 7
    assert violations(fleet.pool.pk) == []

    # Another cycle admits nothing more: the quota, not the pool, holds the rest back, and says so.
    assert cycle_run(pool_id=fleet.pool.pk, now=NOW).placed == 0
    waiting = Task.objects.filter(state="pending").select_related("wait")
    assert waiting.count() == SUBMITTERS + 10 - 7
    assert {task.why_pending_code for task in waiting} == {"quota_exceeded"}
