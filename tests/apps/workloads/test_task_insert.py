"""Tasks stored by the unnest INSERT (apps/workloads/task_insert.py) read back as the objects the
submission answered with, every column, with their first events."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.forms.models import model_to_dict

from apps.workloads.models import Task, TaskEvent
from apps.workloads.task_insert import queue_get_for_submission, tasks_insert
from tests.apps.factories import QueueFactory, UserFactory

pytestmark = pytest.mark.django_db

AT = datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=UTC)


def test_every_column_of_a_stored_batch_reads_back_as_it_was_sent() -> None:
    queue = QueueFactory()
    user = UserFactory()
    plain = Task(
        tenant=queue.tenant, queue=queue, pool=queue.pool, submitted_by=None, priority=0, command=["a"]
    )
    full = Task(
        tenant=queue.tenant, queue=queue, pool=queue.pool, submitted_by=user, name="resnet ✓",
        state=Task.State.PENDING, gpu_count=2, gpu_mem_mib=40960, host_mem_mib=2**40,
        allowed_gpu_models=["H100-80GB"], isolation=Task.Isolation.EXCLUSIVE, kind=Task.Kind.TRAINING,
        sla_class=Task.SlaClass.ONLINE, priority=-7, preemptible=False, gang_id="g", gang_size=2,
        command=["python", "-c", "print('x')"], env={"A": "1", "Ü": ""}, max_runtime_s=60,
        working_dir="/data", profile_key="k", idempotency_key="key-1",
    )  # fmt: skip
    tasks_insert([plain, full], actor="user:ci", reason="submitted", now=AT)

    assert plain.pk is not None and full.pk == plain.pk + 1
    assert not full._state.adding
    for sent in (plain, full):
        stored = Task.objects.get(pk=sent.pk)
        assert model_to_dict(stored) == model_to_dict(sent)
        assert (stored.created_at, stored.updated_at) == (AT, AT)
        event = TaskEvent.objects.get(task=stored)
        assert (event.from_state, event.to_state, event.actor, event.reason, event.created_at) == (
            "",
            Task.State.PENDING,
            "user:ci",
            "submitted",
            AT,
        )


def test_the_submission_queue_read_loads_its_pool_and_misses_other_tenants_queues() -> None:
    queue = QueueFactory()
    other = QueueFactory()
    found = queue_get_for_submission(tenant_id=queue.tenant_id, name=queue.name)
    assert found is not None
    assert model_to_dict(found) == model_to_dict(queue)
    assert found.pool.name == queue.pool.name
    assert queue_get_for_submission(tenant_id=queue.tenant_id, name=other.name) is None
