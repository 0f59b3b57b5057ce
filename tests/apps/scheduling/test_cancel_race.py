"""A cancel that races its task's own move (assigned -> running, reported by the agent) still cancels:
the user's intent holds whatever active state the task reached (a CI job cancelled at that moment got a
409 "changed while you acted on it" and left its task running)."""

from __future__ import annotations

from apps.workloads.models import Task
from apps.workloads.services import task_cancel
from tests.apps.scheduling.conftest import run


def test_a_cancel_read_before_the_task_started_cancels_the_running_task(fleet) -> None:
    fleet.node(model="H100-80GB", name="gpu-001", gpus=1)
    fleet.tenant("a", guaranteed=1000)
    task = fleet.submit("a", name="t", gpu_milli=1000)
    run(fleet)
    seen = Task.objects.get(pk=task.pk)
    assert seen.state == Task.State.ASSIGNED
    # The agent's report moves it on after the caller read it.
    Task.objects.filter(pk=task.pk).update(state=Task.State.RUNNING, version=seen.version + 1)
    cancelled = task_cancel(task=seen, by=None, reason="CI job cancelled")
    assert cancelled.state == Task.State.CANCELLED
    assert Task.objects.get(pk=task.pk).state == Task.State.CANCELLED
