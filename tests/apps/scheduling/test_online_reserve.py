"""The online-service reserve sized from the pool's forecast of online arrivals, in the production cycle
(apps.scheduling.online_reserve, apps.workloads.selectors.pool_online_demand;
docs/notes/goodput-design.md §10)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from apps.workloads.models import Queue, Task
from apps.workloads.selectors import pool_online_demand
from tests.apps.factories import QueueFactory, TaskFactory
from tests.apps.scheduling.conftest import NOW, Fleet, run, start
from tests.apps.scheduling.invariants import violations


def online_history(fleet: Fleet, slug: str, asks: list[tuple[int, int]], *, at: datetime) -> list[Task]:
    """Online tasks of `slug` submitted to the pool at `at` that have finished: (GPUs, milli per GPU) each."""
    queue = Queue.objects.get(tenant=fleet.tenants[slug], pool=fleet.pool, name="q")
    tasks = [
        TaskFactory(queue=queue, sla_class="online", gpu_count=n, gpu_milli=m, state=Task.State.SUCCEEDED)
        for n, m in asks
    ]
    # Submission time is stamped by the database: set it where the history needs it.
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(created_at=at)
    return tasks


def submitted_at(task: Task, at: datetime) -> Task:
    Task.objects.filter(pk=task.pk).update(created_at=at)
    return task


def test_the_selector_reads_the_pools_online_arrivals_in_the_window_and_its_running_online_tasks(
    fleet: Fleet,
) -> None:
    fleet.tenant("a", guaranteed=8000)
    online_history(fleet, "a", [(1, 1000), (1, 500), (2, 1000)], at=NOW - timedelta(hours=1))
    online_history(fleet, "a", [(1, 1000)], at=NOW - timedelta(hours=4))  # before the window
    queue = Queue.objects.get(tenant=fleet.tenants["a"], pool=fleet.pool, name="q")
    submitted_at(TaskFactory(queue=queue, sla_class="batch"), NOW - timedelta(hours=1))  # batch
    elsewhere = QueueFactory(tenant=fleet.tenants["a"])  # another pool
    submitted_at(TaskFactory(queue=elsewhere, sla_class="online"), NOW - timedelta(hours=1))
    serving = submitted_at(
        TaskFactory(queue=queue, sla_class="online", state=Task.State.RUNNING), NOW - timedelta(days=2)
    )
    demand = pool_online_demand(pool_id=fleet.pool.pk, since=NOW - timedelta(hours=3), until=NOW)
    assert sorted(demand.arrival_milli) == [500, 1000, 2000]
    assert demand.holding == frozenset({str(serving.pk)})


@pytest.fixture
def forecast_reserve(settings) -> None:
    settings.WHALEGEN_ONLINE_RESERVE = "forecast"
    settings.WHALEGEN_ONLINE_RESERVE_MILLI = 0
    settings.WHALEGEN_ONLINE_RESERVE_QUANTILE = 0.9
    settings.WHALEGEN_ONLINE_RESERVE_MAX_SHARE = 0.5


def test_the_cycle_holds_the_forecast_reserve_and_an_online_task_takes_it_while_batch_waits(
    fleet: Fleet, forecast_reserve: None
) -> None:
    fleet.node(gpus=4)
    fleet.tenant("a", guaranteed=8000)
    # Three one-GPU online arrivals in the last 3 h: 1 expected in the next hour, and the 90 % quantile of
    # Poisson(1) is 2 (P(≤1) = 0.74, P(≤2) = 0.92): the pool keeps 2 GPUs idle.
    online_history(fleet, "a", [(1, 1000)] * 3, at=NOW - timedelta(hours=1))
    batch = [fleet.submit("a", sla_class="batch") for _ in range(3)]
    run(fleet)
    assert [t.state for t in refreshed(*batch)] == ["assigned", "assigned", "pending"]
    waiting = batch[2]
    assert waiting.why_pending_code == "online_reserve"
    assert waiting.why_pending == (
        "batch task asks 1000 milli-GPU; 2000 milli-GPU is free and the pool keeps 2000 for online tasks "
        "(2 GPUs forecast for online arrivals (2 at the 90% quantile of 1 expected in the next 1 h, from 3 "
        "in the last 3 h, 1000 milli-GPU each))"
    )
    # An online service arrives: it takes the reserve, and the batch task still waits for it.
    service = submitted_at(
        fleet.submit("a", sla_class="online", kind="inference"), NOW + timedelta(minutes=1)
    )
    run(fleet, minutes=1)
    assert [t.state for t in refreshed(service, waiting)] == ["assigned", "pending"]
    assert waiting.why_pending_code == "online_reserve"
    assert "forecast for online arrivals" in waiting.why_pending
    assert violations(fleet.pool.pk) == []


def test_the_what_if_shows_the_sized_reserve_and_decides_with_it(
    fleet: Fleet, forecast_reserve: None
) -> None:
    from apps.scheduling.whatif import pool_whatif, whatif_text

    fleet.node(gpus=4)
    fleet.tenant("a", guaranteed=8000)
    online_history(fleet, "a", [(1, 1000)] * 3, at=NOW - timedelta(hours=1))
    for _ in range(3):
        fleet.submit("a", sla_class="batch")
    report = pool_whatif(pool_name=fleet.pool.name, policies=["whalegen", "fgd"], now=NOW)
    assert report.online_reserve.startswith("2 GPUs forecast for online arrivals (2 at the 90% quantile")
    assert f"online-service reserve kept idle: {report.online_reserve}" in whatif_text(report)
    assert report.as_dict()["online_reserve"] == report.online_reserve
    for run_ in report.runs:  # every policy is configured as the cycle is
        (reason,) = run_.decisions.unplaced.values()
        assert reason.code == "online_reserve" and "2 GPUs forecast for online arrivals" in reason.message


def test_without_online_history_the_forecast_reserve_is_the_static_floor(
    fleet: Fleet, forecast_reserve
) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=8000)
    batch = [fleet.submit("a", sla_class="batch") for _ in range(2)]
    run(fleet)
    assert [t.state for t in refreshed(*batch)] == ["assigned", "assigned"]


def test_an_online_task_finding_the_pool_full_preempts_preemptible_batch_work(fleet: Fleet, settings) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=8000)
    # The batch work started before any online task was seen: nothing was held back then.
    batch = [fleet.submit("a", sla_class="batch", preemptible=True) for _ in range(2)]
    run(fleet)
    for task in batch:
        start(task)
    settings.WHALEGEN_ONLINE_RESERVE = "forecast"
    online_history(fleet, "a", [(1, 1000)] * 3, at=NOW + timedelta(minutes=1))
    service = submitted_at(
        fleet.submit("a", sla_class="online", kind="inference", preemptible=False), NOW + timedelta(minutes=2)
    )
    report = run(fleet, minutes=2)
    assert report.preempted == 1
    victims = [t for t in refreshed(*batch) if t.state == "pending"]
    assert len(victims) == 1 and victims[0].attempts == 1
    assert victims[0].why_pending.startswith(
        f"preempted for task {service.pk}: preemptible batch work making way for online task {service.pk} "
        "within the pool's online-service reserve of 1000 milli-GPU: 1 GPU forecast for online arrivals"
    )
    (service,) = refreshed(service)
    assert service.why_pending_code == "waiting_for_preemption"
    run(fleet, minutes=3)
    assert [t.state for t in refreshed(service)] == ["assigned"]
    assert violations(fleet.pool.pk) == []


def refreshed(*tasks: Task) -> list[Task]:
    for task in tasks:
        task.refresh_from_db()
    return list(tasks)
