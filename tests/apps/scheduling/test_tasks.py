"""The Celery side of the loop: a thin task per pool, a beat fan-out, and the schedule that drives it."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.scheduling import tasks
from apps.scheduling.models import Cycle
from apps.workloads.models import Task
from tests.apps.scheduling.conftest import Fleet


def test_cycle_pool_runs_one_cycle_and_a_second_run_is_harmless(fleet: Fleet) -> None:
    fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=2000)
    fleet.submit("a"), fleet.submit("a")
    assert tasks.cycle_pool.apply(args=[fleet.pool.pk]).get() == "done"
    assert tasks.cycle_pool.apply(args=[fleet.pool.pk]).get() == "done"
    assert Cycle.objects.filter(pool=fleet.pool).count() == 2
    assert sorted(Task.objects.values_list("state", flat=True)) == ["assigned", "pending"]
    assert Cycle.objects.order_by("id").last().tasks_placed == 0


def test_the_beat_fans_out_one_cycle_per_pool(fleet: Fleet, monkeypatch: Any) -> None:
    from apps.inventory.services import pool_create

    other = pool_create(name="infer", runtime="process")
    queued: list[int] = []
    monkeypatch.setattr(tasks.cycle_pool, "delay", queued.append)
    assert tasks.cycles_all_pools.apply().get() == 2
    assert sorted(queued) == sorted([fleet.pool.pk, other.pk])
    entry = settings.CELERY_BEAT_SCHEDULE["schedule-pools"]
    assert entry["task"] == "apps.scheduling.tasks.cycles_all_pools"
    assert entry["schedule"] == settings.WHALEGEN_CYCLE_INTERVAL_S == 5.0
