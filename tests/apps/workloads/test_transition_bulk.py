"""The scheduler's bulk move (`tasks_transition_bulk`): it moves exactly the tasks it names, and a caller
that runs it inside a pipeline (the cycle's commit) learns of a task changed meanwhile from the check it
runs after the pipeline has answered, not before."""

from __future__ import annotations

import pytest
from django.db import transaction

from apps.common.errors import Conflict
from apps.common.pipeline import pipelined
from apps.workloads.models import Task, TaskEvent
from apps.workloads.services import tasks_transition_bulk
from tests.apps.factories import QueueFactory

pytestmark = pytest.mark.django_db

PATH = [Task.State.ADMITTED, Task.State.ASSIGNED]


def _pending(count: int) -> list[Task]:
    queue = QueueFactory()
    return [
        Task.objects.create(tenant=queue.tenant, queue=queue, pool=queue.pool, priority=0, command=["a"])
        for _ in range(count)
    ]


def _move(tasks: list[Task], deferred: list | None = None) -> None:
    tasks_transition_bulk(
        tasks=[(t.pk, t.version) for t in tasks],
        from_state=Task.State.PENDING,
        path=PATH,
        actor="scheduler",
        reasons={t.pk: ["admitted", "placed"] for t in tasks},
        deferred=deferred,
    )


def test_a_bulk_move_moves_the_tasks_it_names_and_no_other_pending_task() -> None:
    named_a, named_b, other = _pending(3)  # same pool, state and version
    _move([named_a, named_b])
    states = dict(Task.objects.values_list("pk", "state"))
    assert states == {named_a.pk: "assigned", named_b.pk: "assigned", other.pk: "pending"}
    assert TaskEvent.objects.filter(task=other).count() == 0
    assert TaskEvent.objects.filter(task=named_a).count() == 2


def test_a_task_changed_meanwhile_raises_from_the_check_run_after_the_pipeline() -> None:
    moved, changed = _pending(2)
    Task.objects.filter(pk=changed.pk).update(version=5)  # another writer got there first
    checks: list = []
    with pytest.raises(Conflict), transaction.atomic():
        with pipelined():
            _move([moved, changed], deferred=checks)  # the statements went out; nothing raised yet
        assert len(checks) == 1
        for check in checks:
            check()
    # The caller's transaction rolled back: nothing moved.
    assert set(Task.objects.values_list("state", flat=True)) == {"pending"}
