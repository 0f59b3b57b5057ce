"""The desired state's change marks (`apps.fleet.changes`, docs/fleet.md "Change marks"): every writer
that changes what a node's agent must run marks the node after its commit, a waiting long poll rebuilds
only when the mark moves, and the heartbeat's answer tells the agent to fetch. Real PostgreSQL and
Redis (REDIS_URL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tests.apps.fleet.conftest import assign
from tests.apps.fleet.test_faults import heartbeat, report
from tests.apps.fleet.test_heartbeat_front import front
from tests.apps.fleet.test_heartbeat_liveness import body, message
from whalegen import protocol as p


@pytest.fixture
def redis_on(settings: Any) -> Iterator[None]:
    assert settings.REDIS_URL, "these tests need the real Redis (REDIS_URL)"
    settings.WHALEGEN_HEARTBEAT_REDIS = True
    yield


def mark(node: Any) -> str | None:
    from apps.fleet import changes

    return changes.read(node.pk)


def running(task: Any, attempt: int = 0) -> p.TaskReport:
    return p.TaskReport(task_id=str(task.pk), state=p.TaskState.RUNNING, at_s=time.time(), attempt=attempt)


def ended(task: Any, state: p.TaskState = p.TaskState.SUCCEEDED) -> p.TaskReport:
    return p.TaskReport(task_id=str(task.pk), state=state, at_s=time.time(), exit_code=0)


def ready(fleet: Any) -> None:
    """Node A heard from and its tasks' quota in place: what a cycle needs to place on it."""
    heartbeat(fleet.node, timezone.now())


# ---- 1. every writer marks the node, after its commit -------------------------------------------------


def _cycle(fleet: Any) -> None:
    from apps.scheduling.services import cycle_run

    assert cycle_run(pool_id=fleet.h100.pk, lock=False).placed >= 1


def _cancel(fleet: Any) -> None:
    from apps.workloads.services import task_cancel

    task_cancel(task=fleet.task_a, by=fleet.alice)


def _node_lost(fleet: Any) -> None:
    from apps.fleet.nodes import _node_lose

    assert _node_lose(node=fleet.node, now=timezone.now(), reason="silent (test)", expect=fleet.node)


def _drain(fleet: Any) -> None:
    from apps.fleet.nodes import node_drain
    from apps.workloads.models import Task

    Task.objects.filter(pk=fleet.task_a.pk).update(preemptible=True)
    fleet.task_a.refresh_from_db()
    node_drain(node=fleet.node, actor="user:root")


def _run_ended(fleet: Any) -> None:
    report(fleet.node, 2, ended(fleet.task_a))


def _run_dropped(fleet: Any) -> None:
    """The agent stopped listing a running run for longer than the grace: the heartbeat declares it lost."""
    from apps.fleet.models import TaskRun

    an_hour_ago = timezone.now() - timezone.timedelta(hours=1)
    TaskRun.objects.filter(task=fleet.task_a).update(missing_since=an_hour_ago)
    heartbeat(fleet.node, timezone.now(), running=())


WRITERS: dict[str, Callable[[Any], None]] = {
    "a cycle assigning a task": _cycle,
    "a cancel of a running task": _cancel,
    "a node declared lost requeueing its task": _node_lost,
    "a drain requeueing a preemptible task": _drain,
    "a report that a run ended": _run_ended,
    "a heartbeat declaring a dropped run lost": _run_dropped,
}


@pytest.mark.django_db
@pytest.mark.parametrize("writer", list(WRITERS), ids=list(WRITERS))
def test_every_writer_of_a_nodes_desired_state_marks_the_node_after_its_commit(
    fleet: Any, redis_on: None, writer: str, django_capture_on_commit_callbacks: Any
) -> None:
    from apps.fleet.agents import desired_state_current

    ready(fleet)
    if writer != "a cycle assigning a task":
        assign(fleet.task_a, fleet.node, [fleet.whole_unit])
        report(fleet.node, 1, running(fleet.task_a))
        fleet.task_a.refresh_from_db()
    generation = desired_state_current(node=fleet.node).generation
    before = mark(fleet.node)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        WRITERS[writer](fleet)
        # Inside the test's transaction nothing has committed: the mark must not have moved yet (a poll
        # rebuilding on it now would read the rows as they were).
        assert mark(fleet.node) == before
    assert callbacks, "the writer registered nothing to run after its commit"
    assert mark(fleet.node) != before
    assert desired_state_current(node=fleet.node).generation != generation  # and the content did change


@pytest.mark.django_db
def test_a_writer_whose_transaction_rolls_back_marks_nothing(fleet: Any, redis_on: None) -> None:
    from django.db import transaction

    from apps.workloads.services import task_cancel

    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    before = mark(fleet.node)
    with pytest.raises(RuntimeError), transaction.atomic():
        task_cancel(task=fleet.task_a, by=fleet.alice)
        raise RuntimeError("rolled back")
    assert mark(fleet.node) == before


# ---- 2. the heartbeat's answer tells the agent to fetch -----------------------------------------------


@pytest.mark.django_db
def test_a_heartbeat_after_a_mark_answers_the_new_generation_and_the_next_goes_back_to_redis(
    fleet: Any,
    redis_on: None,
    agent_client: Any,
    django_assert_num_queries: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from apps.workloads.services import task_cancel

    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    beat = body(message(fleet.node))  # the same heartbeat each time (its GPUs read once, here)
    assert front(fleet.token_a, beat)[0] == 200  # the full way, fingerprint left
    with django_assert_num_queries(0):
        status, ack, _ = front(fleet.token_a, beat)  # Redis only
    assert status == 200
    held = ack["generation"]
    with django_capture_on_commit_callbacks(execute=True):
        task_cancel(task=fleet.task_a, by=fleet.alice)  # the task leaves: the node is marked
    status, ack, _ = front(fleet.token_a, beat)
    assert status == 200
    assert ack["generation"] > held, "the answer must name the newer generation: the agent's cue to fetch"
    # What the agent then fetches is that generation, with the cancelled task listed to stop.
    fetched = agent_client(fleet.token_a).get(p.DESIRED_STATE_PATH, {"generation": held, "wait_s": 0}).json()
    assert fetched["generation"] == ack["generation"]
    # The fingerprint now holds the new mark: the next beat is Redis only again.
    with django_assert_num_queries(0):
        status, again, _ = front(fleet.token_a, beat)
    assert (status, again["generation"]) == (200, ack["generation"])


# ---- 3. the long poll waits on the mark ---------------------------------------------------------------


def _count_builds(monkeypatch: Any) -> list[float]:
    """Times at which the waiting poll built the desired state (the expensive part of a check)."""
    from apps.fleet import agents

    builds: list[float] = []
    real = agents.desired_state_build

    def counted(**kwargs: Any) -> Any:
        if threading.current_thread().name == "poll":  # not the cycle's own (it builds a re-carved layout)
            builds.append(time.monotonic())
        return real(**kwargs)

    monkeypatch.setattr(agents, "desired_state_build", counted)
    return builds


def _first_build_done(builds: list[float]) -> None:
    """Wait until the polling thread has made its first build (a busy machine may start it late)."""
    deadline = time.monotonic() + 10
    while not builds and time.monotonic() < deadline:
        time.sleep(0.02)
    assert builds, "the poll never made its first build"


# A poll woken by the mark answers at once; one the mark failed to wake answers only at its timeout. The
# bound below tells the two apart with room for a busy machine (the answer is measured, not the point).
WOKEN_S = 3.0


def _poll_in_thread(node: Any, known: int, wait_s: float) -> tuple[threading.Thread, dict[str, Any]]:
    from apps.fleet.agents import desired_state_wait

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["desired"] = desired_state_wait(node=node, known_generation=known, wait_s=wait_s)
            out["at"] = time.monotonic()
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="poll")
    thread.start()
    return thread, out


@pytest.mark.django_db(transaction=True)
def test_a_waiting_poll_answers_a_cycle_at_once_without_rebuilding_meanwhile(
    fleet: Any, redis_on: None, monkeypatch: Any
) -> None:
    """Before: the poll rebuilt the node's desired state every 0.25 s while it waited (6 queries each)."""
    from apps.fleet.agents import desired_state_current

    ready(fleet)
    known = desired_state_current(node=fleet.node).generation
    builds = _count_builds(monkeypatch)
    thread, out = _poll_in_thread(fleet.node, known, wait_s=10)
    _first_build_done(builds)
    time.sleep(1.0)  # the poll waits: one build at its start, none since
    assert len(builds) == 1
    _cycle(fleet)
    committed = time.monotonic()
    thread.join(5)
    assert out.get("desired") is not None, "the poll did not answer the cycle's assignment"
    assert out["at"] - committed < WOKEN_S
    assert [t.task_id for t in out["desired"].tasks] == [str(fleet.task_a.pk)]
    assert len(builds) == 2  # its first check, and one after the mark moved


@pytest.mark.django_db(transaction=True)
def test_a_waiting_poll_holds_no_database_connection(fleet: Any, redis_on: None, monkeypatch: Any) -> None:
    from apps.fleet.agents import desired_state_current

    def others() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])

    known = desired_state_current(node=fleet.node).generation
    builds = _count_builds(monkeypatch)
    thread, out = _poll_in_thread(fleet.node, known, wait_s=4.0)
    # The poll uses its connection for its first build; on a busy machine that build may start late, so
    # the look waits for it, then for the connection to be handed back while the poll still waits.
    _first_build_done(builds)
    deadline = time.monotonic() + 3.0
    while True:
        held = others()
        waiting = thread.is_alive()  # still waiting after the count was taken: it waited during it too
        if held == 0 or not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    thread.join(8)
    assert waiting, "the poll ended before it could be seen waiting"
    assert held == 0, "the waiting poll kept its connection to PostgreSQL"
    assert out["desired"] is None  # nothing changed: it waited to its end


@pytest.mark.django_db(transaction=True)
def test_a_change_nobody_marked_still_reaches_the_agent_with_the_next_polls_first_build(
    fleet: Any, redis_on: None, monkeypatch: Any
) -> None:
    """The safety net: a writer that forgot to mark delays the change by at most one poll, never strands
    it. (`assign` writes the rows directly and marks nothing.)"""
    from apps.fleet.agents import desired_state_current, desired_state_wait

    known = desired_state_current(node=fleet.node).generation
    builds = _count_builds(monkeypatch)
    thread, out = _poll_in_thread(fleet.node, known, wait_s=1.5)
    _first_build_done(builds)
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    thread.join(5)
    assert out["desired"] is None and len(builds) == 1  # unmarked: this poll does not see it (no rebuilds)
    started = time.monotonic()
    desired = desired_state_wait(node=fleet.node, known_generation=known, wait_s=10)
    assert desired is not None and time.monotonic() - started < WOKEN_S
    assert [t.task_id for t in desired.tasks] == [str(fleet.task_a.pk)]


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_long_polls_as_before_gets_a_cancel_at_once(
    fleet: Any, redis_on: None, agent_client: Any
) -> None:
    """An agent of an earlier version ignores the heartbeat's answer and long-polls with its own wait:
    it is served by the same endpoint, which answers as soon as a writer marks its node."""
    from apps.fleet.agents import desired_state_current
    from apps.workloads.services import task_cancel

    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(fleet.node, 1, running(fleet.task_a))
    fleet.task_a.refresh_from_db()
    known = desired_state_current(node=fleet.node).generation
    out: dict[str, Any] = {}

    def poll() -> None:
        try:
            client = agent_client(fleet.token_a)
            out["answer"] = client.get(p.DESIRED_STATE_PATH, {"generation": known, "wait_s": 20})
            out["at"] = time.monotonic()
        finally:
            connection.close()

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.0)
    task_cancel(task=fleet.task_a, by=fleet.alice)
    cancelled = time.monotonic()
    thread.join(5)
    assert out["answer"].status_code == 200 and out["at"] - cancelled < WOKEN_S
    (spec,) = out["answer"].json()["tasks"]
    assert spec["desired"] == "stop"


@pytest.mark.django_db(transaction=True)
def test_without_redis_a_waiting_poll_wakes_on_the_mark_in_its_own_process(
    fleet: Any, settings: Any, monkeypatch: Any
) -> None:
    """The embedded default (no REDIS_URL: `whalegen demo`, one process): the writer's commit wakes the
    waiting poll directly, no rebuild in between."""
    from apps.fleet.agents import desired_state_current
    from apps.workloads.services import task_cancel

    settings.REDIS_URL = ""
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    report(fleet.node, 1, running(fleet.task_a))
    fleet.task_a.refresh_from_db()
    known = desired_state_current(node=fleet.node).generation
    builds = _count_builds(monkeypatch)
    thread, out = _poll_in_thread(fleet.node, known, wait_s=10)
    _first_build_done(builds)
    time.sleep(0.3)
    task_cancel(task=fleet.task_a, by=fleet.alice)
    cancelled = time.monotonic()
    thread.join(5)
    assert out["desired"] is not None and out["at"] - cancelled < WOKEN_S
    assert len(builds) == 2
