"""The lean way out (apps/workloads/api/fast_output.py) shows a task exactly as TaskOutputSerializer
does: same keys in the same order, same values of the same types, in every shape the API shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework import serializers

from apps.forecasting.models import TaskForecast
from apps.inventory.models import Pool
from apps.tenants.models import Tenant
from apps.workloads.api import serializers as s
from apps.workloads.api.fast_output import FastOutput
from apps.workloads.models import Queue, Task, TaskWait

AT = datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=UTC)


def _task(**changes: Any) -> Task:
    # In memory, related objects attached: showing a task must read nothing from the database.
    tenant = Tenant(pk=3, slug="ml", name="ML")
    pool = Pool(pk=4, name="h100-train")
    queue = Queue(pk=5, tenant=tenant, pool=pool, name="train")
    values: dict[str, Any] = {
        "pk": 11,
        "tenant": tenant,
        "queue": queue,
        "pool": pool,
        "submitted_by": get_user_model()(pk=2, username="ci"),
        "priority": 0,
        "command": ["python", "train.py"],
        "created_at": AT,
        "updated_at": AT,
        **changes,
    }
    forecast = values.pop("forecast", None)
    wait = values.pop("wait", None)
    task = Task(**values)
    task._state.fields_cache["forecast"] = forecast
    task._state.fields_cache["wait"] = wait
    return task


SHAPES = {
    "a task just submitted, no forecast yet": _task(),
    "a task whose submitter was deleted": _task(submitted_by=None),
    "a running task with every optional field set": _task(
        state=Task.State.RUNNING,
        name="resnet",
        gpu_count=2,
        gpu_mem_mib=40960,
        allowed_gpu_models=["H100-80GB", "A100-80GB"],
        isolation=Task.Isolation.MIG,
        kind=Task.Kind.TRAINING,
        sla_class=Task.SlaClass.ONLINE,
        priority=-7,
        preemptible=False,
        gang_id="g1",
        gang_size=2,
        env={"A": "1", "B": ""},
        max_runtime_s=3600,
        working_dir="/data",
        profile_key="resnet50",
        idempotency_key="ci-1",
        attempts=2,
        started_at=AT + timedelta(seconds=3),
        predicted_duration_p50_s=120.5,
        predicted_duration_p90_s=300,
        predicted_gpu_mem_peak_mib=30000,
        # Words of an earlier wait, which a running task no longer shows.
        wait=TaskWait(why="no GPU free", code="no_capacity", start_at=AT),
        forecast=TaskForecast(
            duration_p50_s=120.5,
            duration_p90_s=300.0,
            gpu_mem_peak_mib=30000,
            source="model",
            model_version=4,
            history_count=12,
            mem_bound_mib=32000,
            mem_bound_at=AT,
        ),
    ),
    "a failed task with its exit code and reason": _task(
        state=Task.State.FAILED,
        exit_code=137,
        failure_reason="killed: out of memory",
        finished_at=AT + timedelta(minutes=5),
        forecast=TaskForecast(source="none", baseline=""),
    ),
    "a state given as its plain string": _task(state="pending", isolation="any", kind="batch"),
    "a pending task with the cycle's words on it": _task(
        wait=TaskWait(
            why="no GPU node with 1000 milli free",
            code="no_capacity",
            start_at=datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
        )
    ),
}


@pytest.mark.parametrize("task", SHAPES.values(), ids=SHAPES.keys())
def test_a_task_is_shown_exactly_as_the_output_serializer_shows_it(task: Task) -> None:
    want = s.TaskOutputSerializer().to_representation(task)
    got = FastOutput(s.TaskOutputSerializer()).to_representation(task)
    assert list(got) == list(want)
    assert [(k, type(v)) for k, v in got.items()] == [(k, type(v)) for k, v in want.items()]
    assert got == want


def test_a_serializer_with_a_dotted_source_is_refused_rather_than_shown_wrong() -> None:
    class Dotted(serializers.Serializer):
        pool_name = serializers.CharField(source="pool.name")

    with pytest.raises(ValueError, match="pool_name"):
        FastOutput(Dotted())
