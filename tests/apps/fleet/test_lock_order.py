"""One lock order between the scheduling cycle and the agents' requests (issue #11 item 5): the cycle
locks quotas, then nodes, then tasks, then writes the node's agent row (the desired-state generation).
Two real connections race here, each in its own thread; PostgreSQL reports `deadlock detected` when the
orders cross."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.apps.fleet.conftest import assign
from tests.apps.fleet.test_faults import heartbeat, report
from whalegen import protocol as p

pytestmark = pytest.mark.django_db(transaction=True)


def race(first: Callable[[threading.Event], None], second: Callable[[], None]) -> list[BaseException]:
    """Run `first` (which sets the event once it holds its first lock) and then `second`, each on its
    own database connection; the errors either raised."""
    errors: list[BaseException] = []
    holding = threading.Event()

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as error:  # reported to the test, which fails on it
                errors.append(error)
            finally:
                connection.close()

        return run

    def start_second() -> None:
        assert holding.wait(10), "the first writer never took its lock"
        second()

    threads = [
        threading.Thread(target=guarded(lambda: first(holding))),
        threading.Thread(target=guarded(start_second)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


def test_a_cycle_and_a_heartbeat_on_the_same_node_do_not_deadlock(fleet: Any) -> None:
    """Before: the heartbeat wrote the agent row, then the node row; the cycle the other way round."""
    from apps.fleet.agents import desired_state_current
    from apps.inventory.models import Node

    heartbeat(fleet.node, timezone.now())
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])  # the desired state changes: the cycle writes it

    def cycle(holding: threading.Event) -> None:
        with transaction.atomic():
            Node.objects.select_for_update().filter(pk=fleet.node.pk).values_list("pk").first()
            holding.set()
            time.sleep(0.5)  # the heartbeat arrives and takes what it takes first
            desired_state_current(node=fleet.node)

    errors = race(cycle, lambda: heartbeat(fleet.node, timezone.now()))
    assert errors == []


def test_a_cycle_preempting_a_task_and_its_report_that_it_ended_do_not_deadlock(fleet: Any) -> None:
    """The cycle locks the victim's quota, then the victim (to preempt it) while its agent reports it
    finished. Before: the report wrote the task row, then waited for the quota (to give the charge
    back) that the cycle held while the cycle waited for the task row."""
    from apps.workloads.models import Quota, Task

    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    quota = Quota.objects.get(tenant=fleet.task_a.tenant, pool=fleet.task_a.pool)
    done = p.TaskReport(str(fleet.task_a.pk), p.TaskState.SUCCEEDED, 0.0, exit_code=0)

    def cycle(holding: threading.Event) -> None:
        with transaction.atomic():
            Quota.objects.select_for_update().filter(pk=quota.pk).values_list("pk").first()
            holding.set()
            time.sleep(1.5)  # the report gets as far as it can
            Task.objects.select_for_update().filter(pk=fleet.task_a.pk).values_list("pk").first()

    errors = race(cycle, lambda: report(fleet.node, 1, done))
    assert errors == []
    assert Task.objects.get(pk=fleet.task_a.pk).state == "succeeded"


def test_two_health_checks_at_once_requeue_a_lost_nodes_task_once(fleet: Any) -> None:
    """Two workers run the beat task at the same moment (a duplicated beat, a restarted worker)."""
    from datetime import timedelta

    from apps.fleet.nodes import nodes_mark_lost
    from apps.workloads.models import Task, TaskEvent

    now = timezone.now()
    heartbeat(fleet.node, now)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    later = now + timedelta(seconds=31)
    results: list[list[int]] = []

    def check(holding: threading.Event) -> None:
        holding.set()
        results.append(nodes_mark_lost(now=later))

    errors = race(check, lambda: results.append(nodes_mark_lost(now=later)))
    assert errors == []
    assert sum(fleet.node.pk in found for found in results) == 1
    task = Task.objects.get(pk=fleet.task_a.pk)
    assert (task.state, task.attempts) == ("pending", 1)
    assert TaskEvent.objects.filter(task=task, to_state="lost").count() == 1
