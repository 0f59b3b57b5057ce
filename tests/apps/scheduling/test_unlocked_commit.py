"""The commit writes unlocked when nothing moved since the snapshot, and falls back to the locked path
(lock, compare, hold back what lost) when something did, leaving nothing of the first attempt behind."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from apps.inventory.models import Node
from apps.scheduling import services
from apps.scheduling.models import Assignment, Cycle
from apps.scheduling.snapshot import cycle as snapshot_cycle
from apps.workloads.models import Task, TaskEvent
from apps.workloads.services import task_cancel
from tests.apps.scheduling.conftest import NOW, Fleet


@pytest.fixture(autouse=True)
def _postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(
            "the unlocked commit is PostgreSQL's (SQLite always takes the locked path): set DATABASE_URL"
        )


def _after_snapshot(monkeypatch: Any, meddle: Any) -> None:
    """Run `meddle()` between the cycle's snapshot and its commit (another writer, in the same transaction:
    what the commit then finds is what a concurrent writer would have left)."""
    real = snapshot_cycle.snapshot_for_pool

    def snapshot_then_meddle(pool_id: int, now: Any) -> Any:
        snapshot = real(pool_id, now)
        meddle()
        return snapshot

    monkeypatch.setattr(snapshot_cycle, "snapshot_for_pool", snapshot_then_meddle)


def _history(task: Task) -> list[str]:
    return list(TaskEvent.objects.filter(task=task).order_by("pk").values_list("to_state", flat=True))


def test_a_cycle_where_nothing_moved_commits_without_locking_a_row(fleet: Fleet) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=4000)
    first, second = fleet.submit("a"), fleet.submit("a")
    with CaptureQueriesContext(connection) as queries:
        report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    assert report.placed == 2
    cycle = Cycle.objects.get(pk=report.cycle_id)
    assert cycle.stats["commit_unlocked_missed"] is None
    assert "lock_and_compare" not in cycle.stats["commit_phases_ms"]
    locks = [q["sql"] for q in queries.captured_queries if "FOR UPDATE" in q["sql"]]
    # Only the quota rows are locked, by the check of what the tenant holds once the cycle has written.
    assert locks and all("workloads_quota" in sql for sql in locks), locks
    for task in (first, second):
        task.refresh_from_db()
        assert task.state == Task.State.ASSIGNED
        assert _history(task) == ["pending", "admitted", "assigned"]


def test_a_task_cancelled_after_the_snapshot_is_held_back_and_the_first_attempt_leaves_nothing(
    fleet: Fleet, monkeypatch: Any
) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=4000)
    kept, cancelled = fleet.submit("a"), fleet.submit("a")
    _after_snapshot(monkeypatch, lambda: task_cancel(task=Task.objects.get(pk=cancelled.pk), by=None))
    report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)

    cycle = Cycle.objects.get(pk=report.cycle_id)
    assert "1 of 2 tasks changed" in cycle.stats["commit_unlocked_missed"]
    assert (report.placed, report.conflicts) == (1, 1)
    kept.refresh_from_db()
    cancelled.refresh_from_db()
    assert kept.state == Task.State.ASSIGNED
    assert cancelled.state == Task.State.CANCELLED
    # The rolled-back attempt's moves, events and assignments are gone: each step once, one assignment.
    assert _history(kept) == ["pending", "admitted", "assigned"]
    assert _history(cancelled) == ["pending", "cancelled"]
    assert list(Assignment.objects.values_list("task_id", flat=True)) == [kept.pk]


def test_tasks_on_a_node_that_changed_after_the_snapshot_wait_for_the_next_cycle(
    fleet: Fleet, monkeypatch: Any
) -> None:
    node = fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=4000)
    task = fleet.submit("a")
    # What every writer of units does under the node's lock: raise its version.
    _after_snapshot(monkeypatch, lambda: Node.objects.filter(pk=node.pk).update(version=F("version") + 1))
    report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)

    cycle = Cycle.objects.get(pk=report.cycle_id)
    assert "1 of 1 nodes changed since the snapshot" in cycle.stats["commit_unlocked_missed"]
    task.refresh_from_db()
    assert task.state == Task.State.PENDING
    assert task.why_pending.endswith("changed while the cycle decided; retried next cycle")
    assert not Assignment.objects.exists()
    assert _history(task) == ["pending"]
    # The next cycle, on a snapshot that sees the new version (and nobody meddling), places it.
    monkeypatch.undo()
    services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    task.refresh_from_db()
    assert task.state == Task.State.ASSIGNED


def test_the_engines_placements_stream_out_as_it_makes_them(fleet: Fleet, monkeypatch: Any) -> None:
    """In chunks of one, each placement's task move goes out before the engine makes the next."""
    from whalegen.placement.engine import Engine

    monkeypatch.setattr(services, "STREAM_CHUNK", 1)
    fleet.node(gpus=4)
    fleet.tenant("a", guaranteed=8000)
    tasks = [fleet.submit("a") for _ in range(3)]
    moved_while_placing: list[int] = []
    real = Engine._commit

    def commit_and_count(self: Engine, *args: Any, **kwargs: Any) -> Any:
        # What the cycle's own connection sees as the engine places the next task: the moves sent so far.
        moved_while_placing.append(
            Task.objects.filter(pk__in=[t.pk for t in tasks], state=Task.State.ASSIGNED).count()
        )
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "_commit", commit_and_count)
    report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    assert report.placed == 3
    assert moved_while_placing == [0, 1, 2]
    assert Cycle.objects.get(pk=report.cycle_id).stats["commit_unlocked_missed"] is None
    for task in tasks:
        assert _history(task) == ["pending", "admitted", "assigned"]


def test_a_placement_decide_takes_back_after_the_engine_rolls_the_streamed_moves_back(
    fleet: Fleet, monkeypatch: Any
) -> None:
    """`decide` may bind an engine placement elsewhere or take it back (units the engine's picture got
    wrong): the moves already sent are undone and the locked path writes what `decide` decided."""
    from dataclasses import replace

    from whalegen.scheduling import Decider

    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=4000)
    kept, taken_back = fleet.submit("a"), fleet.submit("a")
    real = Decider.finish

    def finish_taking_one_back(self: Decider, *args: Any, **kwargs: Any) -> Any:
        decisions = real(self, *args, **kwargs)
        return replace(
            decisions, placements=tuple(b for b in decisions.placements if b.task_id != str(taken_back.pk))
        )

    monkeypatch.setattr(Decider, "finish", finish_taking_one_back)
    report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    assert (
        "decide bound 1 of the 2 placements sent otherwise"
        in (Cycle.objects.get(pk=report.cycle_id).stats["commit_unlocked_missed"])
    )
    kept.refresh_from_db()
    taken_back.refresh_from_db()
    assert (kept.state, taken_back.state) == (Task.State.ASSIGNED, Task.State.PENDING)
    assert _history(kept) == ["pending", "admitted", "assigned"]
    assert _history(taken_back) == ["pending"]
    assert list(Assignment.objects.values_list("task_id", flat=True)) == [kept.pk]
