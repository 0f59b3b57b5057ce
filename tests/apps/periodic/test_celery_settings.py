"""The Celery settings issue #42 asks for, as the plane's Celery app sees them: every periodic message
expires after its interval, cycles have their own queue and expire after a cycle interval, beat uses the
leader's scheduler, and Redis' visibility timeout is above every task's hard time limit."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from whalegen.config.celery import CYCLES_QUEUE, app


@pytest.fixture(scope="module", autouse=True)
def _tasks_loaded() -> None:
    app.loader.import_default_modules()


@pytest.mark.parametrize("name", sorted(settings.CELERY_BEAT_SCHEDULE))
def test_every_periodic_message_expires_after_its_interval(name: str) -> None:
    entry: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE[name]
    assert entry["task"] in app.tasks
    assert entry["options"]["expires"] == entry["schedule"] > 0


@pytest.mark.parametrize(
    "task", ["apps.scheduling.tasks.cycles_all_pools", "apps.scheduling.tasks.cycle_pool"]
)
def test_cycles_go_to_their_own_queue(task: str) -> None:
    route = app.amqp.router.route({}, task)
    assert route["queue"].name == CYCLES_QUEUE
    assert {queue.name for queue in app.amqp.queues.consume_from.values()} == {"celery", CYCLES_QUEUE}


def test_a_pools_cycle_message_expires_after_one_cycle_interval() -> None:
    options = app.tasks["apps.scheduling.tasks.cycle_pool"]._get_exec_options()
    assert options["expires"] == settings.WHALEGEN_CYCLE_INTERVAL_S


def test_beat_uses_the_leaders_scheduler() -> None:
    assert app.conf.beat_scheduler == "apps.periodic.scheduler:LeaderScheduler"


def test_late_acks_come_with_a_visibility_timeout_above_the_hard_time_limit() -> None:
    assert app.conf.task_acks_late is True
    limit_s = app.conf.task_time_limit
    assert limit_s and limit_s > 0
    assert app.conf.broker_transport_options["visibility_timeout"] > limit_s
