"""The GPUs a running event names for a multi-GPU task come from one query: the units its live
assignment lists, by GPU index (before: two queries, the assignment's list and then its units)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.fleet.conftest import assign

pytestmark = pytest.mark.django_db


def _two_gpu_task(fleet: Any) -> Any:
    from apps.workloads.services import TaskSubmission, task_submit

    task, _ = task_submit(
        tenant=fleet.tenant_a, request=TaskSubmission(queue="train", gpu_count=2), submitted_by=fleet.alice
    )
    return task


def test_the_held_gpus_are_read_in_one_query(fleet: Any, django_assert_num_queries: Any) -> None:
    from apps.fleet.reports import _held_gpu_indexes

    task = _two_gpu_task(fleet)
    assign(task, fleet.node, [fleet.whole_unit, fleet.mig_unit])
    with django_assert_num_queries(1):
        assert _held_gpu_indexes(task) == "0,1"


def test_a_released_assignment_holds_nothing_and_reads_as_unknown(
    fleet: Any, django_assert_num_queries: Any
) -> None:
    from django.utils import timezone

    from apps.fleet.reports import _held_gpu_indexes

    task = _two_gpu_task(fleet)
    assignment = assign(task, fleet.node, [fleet.whole_unit, fleet.mig_unit])
    assignment.released_at = timezone.now()
    assignment.save(update_fields=["released_at"])
    with django_assert_num_queries(1):
        assert _held_gpu_indexes(task) == "?"


def test_only_the_tasks_own_units_count(fleet: Any) -> None:
    from apps.fleet.reports import _held_gpu_indexes

    mine, other = _two_gpu_task(fleet), _two_gpu_task(fleet)
    assign(mine, fleet.node, [fleet.whole_unit])
    assign(other, fleet.node, [fleet.mig_unit])
    assert (_held_gpu_indexes(mine), _held_gpu_indexes(other)) == ("1", "0")
