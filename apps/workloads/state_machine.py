"""The task state machine of ARCHITECTURE §5, as data. The one place that says which moves are legal.

    pending → admitted → assigned → running → succeeded | failed | cancelled
    preempted and lost return the task to pending, with its attempt count raised (or end it as failed:
    a gang member whose gang can never be whole again, or a task out of attempts). A requeued task that
    nothing has placed again ends with the late result of the run it was requeued from; so does one
    placed again (assigned or running) when that run had finished before the plane requeued it.

`task_transition` (services.py) is the only writer of `Task.state`; it asks `check_transition` first.
"""

from __future__ import annotations

from apps.common.errors import Conflict
from apps.workloads.models import Task

S = Task.State

FINAL: frozenset[str] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})

TRANSITIONS: dict[str, frozenset[str]] = {
    # A pending task may also end with the result of the run the plane had given up on (its node was
    # declared lost, it was requeued, and nothing has taken its place yet): docs/fleet.md, "Late results".
    S.PENDING: frozenset({S.ADMITTED, S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    # Admission can be undone by preemption (an owner reclaims borrowed quota) before placement.
    S.ADMITTED: frozenset({S.ASSIGNED, S.PREEMPTED, S.CANCELLED}),
    # An assigned task may end with the result of the attempt before it, which had finished before the
    # plane requeued it (docs/faults.md, "A run that finished before the plane requeued it").
    S.ASSIGNED: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST}),
    # A preempted or lost task is on its way back to pending; cancelling it then must still work. A gang
    # member fails there instead when a sibling has already ended: the gang can never be placed whole
    # again (docs/scheduling.md, "a gang with an ended member never waits").
    S.PREEMPTED: frozenset({S.PENDING, S.FAILED, S.CANCELLED}),
    S.LOST: frozenset({S.PENDING, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

# Entering pending from these counts as a new attempt.
RETRY_FROM: frozenset[str] = frozenset({S.PREEMPTED, S.LOST})


class IllegalTransition(Conflict):
    def __init__(self, from_state: str, to_state: str) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[from_state])) or "none, it is final"
        super().__init__(f"a {from_state} task cannot become {to_state} (from {from_state}: {allowed})")
        self.from_state = from_state
        self.to_state = to_state


def check_transition(from_state: str, to_state: str) -> None:
    if to_state not in TRANSITIONS:
        raise ValueError(f"unknown task state {to_state!r}")
    if to_state not in TRANSITIONS[from_state]:
        raise IllegalTransition(from_state, to_state)
