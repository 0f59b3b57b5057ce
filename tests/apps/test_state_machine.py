"""The task state machine (ARCHITECTURE §5): the table, and the one service that applies it."""

from __future__ import annotations

import itertools

import pytest

from apps.common.errors import Conflict
from apps.workloads.models import Task
from apps.workloads.services import task_transition
from apps.workloads.state_machine import FINAL, TRANSITIONS, IllegalTransition, check_transition
from tests.apps.factories import held_milli

S = Task.State
LEGAL = {
    (S.PENDING, S.ADMITTED), (S.PENDING, S.CANCELLED),
    # A requeued task nothing has placed again takes the late result of the run it was requeued from.
    (S.PENDING, S.SUCCEEDED), (S.PENDING, S.FAILED),
    (S.ADMITTED, S.ASSIGNED), (S.ADMITTED, S.PREEMPTED), (S.ADMITTED, S.CANCELLED),
    (S.ASSIGNED, S.RUNNING), (S.ASSIGNED, S.FAILED), (S.ASSIGNED, S.CANCELLED), (S.ASSIGNED, S.PREEMPTED),
    (S.ASSIGNED, S.LOST),
    # ... and so does one placed again, when that run had finished before the plane requeued it.
    (S.ASSIGNED, S.SUCCEEDED),
    (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.FAILED), (S.RUNNING, S.CANCELLED), (S.RUNNING, S.PREEMPTED),
    (S.RUNNING, S.LOST),
    (S.PREEMPTED, S.PENDING), (S.PREEMPTED, S.CANCELLED), (S.LOST, S.PENDING), (S.LOST, S.CANCELLED),
    # A gang member whose sibling already ended cannot be requeued: it fails on its way back.
    (S.PREEMPTED, S.FAILED), (S.LOST, S.FAILED),
}  # fmt: skip


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    list(itertools.product(S.values, S.values)),
    ids=[f"{a} to {b}" for a, b in itertools.product(S.values, S.values)],
)
def test_exactly_the_documented_transitions_are_legal(from_state: str, to_state: str) -> None:
    if (from_state, to_state) in LEGAL:
        check_transition(from_state, to_state)
    else:
        with pytest.raises(IllegalTransition, match=f"a {from_state} task cannot become {to_state}"):
            check_transition(from_state, to_state)


def test_final_states_lead_nowhere() -> None:
    assert all(TRANSITIONS[state] == frozenset() for state in FINAL)


def _walk(task: Task, *states: str) -> Task:
    for state in states:
        task = task_transition(task=task, to_state=state, actor="scheduler", reason=f"test to {state}")
    return task


def test_a_run_to_success_records_every_step_with_actor_and_reason(world) -> None:
    task = _walk(world.task_a, S.ADMITTED, S.ASSIGNED, S.RUNNING)
    task = task_transition(
        task=task, to_state=S.SUCCEEDED, actor="agent:gpu-001", reason="exit 0", exit_code=0
    )
    steps = list(task.events.values_list("from_state", "to_state", "actor"))
    assert steps == [
        ("", "pending", "user:alice"),
        ("pending", "admitted", "scheduler"),
        ("admitted", "assigned", "scheduler"),
        ("assigned", "running", "scheduler"),
        ("running", "succeeded", "agent:gpu-001"),
    ]
    assert task.started_at and task.finished_at and task.exit_code == 0


def test_an_illegal_transition_writes_nothing(world) -> None:
    with pytest.raises(IllegalTransition):
        task_transition(task=world.task_a, to_state=S.RUNNING, actor="scheduler", reason="skip ahead")
    world.task_a.refresh_from_db()
    assert world.task_a.state == S.PENDING and world.task_a.events.count() == 1


def test_a_stale_view_of_the_task_loses_the_compare_and_set(world) -> None:
    stale = Task.objects.get(pk=world.task_a.pk)
    task_transition(task=world.task_a, to_state=S.ADMITTED, actor="scheduler", reason="cycle 1")
    with pytest.raises(Conflict, match="changed while you acted on it"):
        task_transition(task=stale, to_state=S.CANCELLED, actor="user:alice", reason="too late")
    assert Task.objects.get(pk=world.task_a.pk).state == S.ADMITTED


@pytest.mark.parametrize("setback", [S.PREEMPTED, S.LOST])
def test_preempted_and_lost_tasks_return_to_pending_with_one_more_attempt(world, setback: str) -> None:
    task = _walk(world.task_a, S.ADMITTED, S.ASSIGNED, S.RUNNING, setback, S.PENDING)
    assert task.state == S.PENDING and task.attempts == 1


@pytest.mark.parametrize("final", [S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_quota_is_held_from_admission_until_a_final_state(world, final: str) -> None:
    assert held_milli(world.quota_a) == 0  # pending holds nothing
    task = _walk(world.task_a, S.ADMITTED)
    assert held_milli(world.quota_a) == 1000
    _walk(task, S.ASSIGNED, S.RUNNING, final)
    assert held_milli(world.quota_a) == 0
