"""Cycles racing on one pool over real PostgreSQL connections, and the snapshot's pinned query count."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from apps.scheduling import services
from apps.scheduling.models import Assignment, Cycle
from apps.scheduling.snapshot import cycle as snapshot_cycle
from apps.scheduling.snapshot import snapshot_for_pool
from apps.workloads.models import Task
from tests.apps.scheduling.conftest import NOW, Fleet
from tests.apps.scheduling.invariants import violations

# nodes, GPUs, units, stopping GPUs, repartition claims, assignments, overrides, pending tasks, quotas
SNAPSHOT_QUERIES = 9


def _busy_pool(fleet: Fleet) -> list[Task]:
    """Twelve GPUs (whole and MPS-shared) on six nodes, two tenants, forty tasks of mixed shapes."""
    for _ in range(4):
        fleet.node(gpus=2, cpu_milli=16_000)
    fleet.node(gpus=2, mode="mps", mps_shares=4, cpu_milli=16_000)
    fleet.node(model="L4", gpus=2, cpu_milli=16_000)
    fleet.tenant("a", guaranteed=8000, borrow=12000)
    fleet.tenant("b", guaranteed=8000, borrow=12000)
    tasks = []
    for n in range(20):
        tasks.append(fleet.submit("a", gpu_milli=250 if n % 3 == 0 else 1000, cpu_milli=2000))
        tasks.append(fleet.submit("b", gpu_milli=500 if n % 4 == 0 else 1000, cpu_milli=3000))
    return tasks


def _race(pool_id: int, *, lock: bool, meet_after_snapshot: bool, monkeypatch: Any) -> list[Any]:
    """Two threads, each on its own connection, run `cycle_run` on one pool at the same moment."""
    if connection.vendor != "postgresql":
        pytest.fail("the cycle race must run on PostgreSQL (set DATABASE_URL)")
    start = threading.Barrier(2)
    results: list[Any] = []
    guard = threading.Lock()
    if meet_after_snapshot:
        # Both cycles read the pool before either commits: the same free units look free to both, so
        # only the compare-and-set stands between them and a double booking.
        seen = threading.Barrier(2, timeout=30)
        real = snapshot_cycle.snapshot_for_pool

        def snapshot_then_wait(pool_id: int, now: Any) -> Any:
            snapshot = real(pool_id, now)
            seen.wait()
            return snapshot

        monkeypatch.setattr(snapshot_cycle, "snapshot_for_pool", snapshot_then_wait)

    def worker() -> None:
        try:
            start.wait()
            outcome: Any = services.cycle_run(pool_id=pool_id, now=NOW, lock=lock)
        except Exception as exc:  # a failure must show in the assertion, not vanish with the thread
            outcome = exc
        finally:
            connections.close_all()
        with guard:
            results.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_cycles_on_one_pool_never_double_book(fleet: Fleet, monkeypatch: Any) -> None:
    _busy_pool(fleet)
    results = _race(fleet.pool.pk, lock=True, meet_after_snapshot=False, monkeypatch=monkeypatch)
    assert all(isinstance(r, services.CycleReport) for r in results), results
    statuses = sorted(r.status for r in results)
    # Either the second found the pool locked, or it ran after the first committed and found less room.
    assert statuses in (["busy", "done"], ["done", "done"])
    assert violations(fleet.pool.pk) == []
    placed = sum(r.placed for r in results)
    assert placed == Assignment.objects.filter(released_at__isnull=True).count() > 0


@pytest.mark.django_db(transaction=True)
def test_without_the_advisory_lock_compare_and_set_alone_prevents_double_booking(
    fleet: Fleet, monkeypatch: Any
) -> None:
    _busy_pool(fleet)
    results = _race(fleet.pool.pk, lock=False, meet_after_snapshot=True, monkeypatch=monkeypatch)
    assert all(isinstance(r, services.CycleReport) for r in results), results
    assert [r.status for r in results] == ["done", "done"]
    winner, loser = sorted(results, key=lambda r: -r.placed)
    # Both decided on the same snapshot; the second to commit found its rows taken and skipped them.
    assert winner.placed > 0 and loser.conflicts > 0
    assert violations(fleet.pool.pk) == []
    assert winner.placed + loser.placed == Assignment.objects.filter(released_at__isnull=True).count()
    assert Cycle.objects.get(pk=loser.cycle_id).conflicts == loser.conflicts
    # The loser's skipped rows were the winner's; the next cycle, alone, finds nothing left to fight over.
    monkeypatch.undo()
    after = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    assert after.status == "done" and after.conflicts == 0
    assert violations(fleet.pool.pk) == []


@pytest.mark.parametrize("nodes, tasks", [(2, 4), (12, 60)], ids=["a small pool", "a pool six times larger"])
def test_the_snapshot_reads_a_pool_in_a_fixed_number_of_queries(
    fleet: Fleet, nodes: int, tasks: int, django_assert_num_queries: Any
) -> None:
    from apps.approvals.services import override_approve, override_request

    for n in range(nodes):
        fleet.node(
            gpus=2, cluster="eu-1" if n % 2 else "us-1", mode="mps" if n % 3 == 0 else "whole", mps_shares=2
        )
    fleet.tenant("a", guaranteed=1000 * 3 * nodes)
    submitted = [fleet.submit("a", gpu_milli=500) for _ in range(tasks)]
    services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    override = override_request(
        tenant=fleet.tenants["a"],
        task=submitted[-1],
        wanted_priority=9,
        reason="r",
        requested_by=fleet.user,
        now=NOW,
    )
    override_approve(override=override, by=fleet.user, now=NOW)
    with django_assert_num_queries(SNAPSHOT_QUERIES):
        snapshot = snapshot_for_pool(fleet.pool.pk, NOW)
    assert len(snapshot.cluster.nodes) == nodes
    assert (
        len(snapshot.cluster.running) > 0
        and len(snapshot.cluster.running) + len(snapshot.cluster.pending) == tasks
    )


def test_a_unit_taken_behind_the_cycles_back_rolls_the_whole_commit_back(
    fleet: Fleet, monkeypatch: Any
) -> None:
    """A writer that binds a unit without raising its node's version breaks the contract the commit relies
    on; the commit's count of units already listed by a live assignment still catches it, and the cycle
    writes nothing rather than double-book."""
    from apps.common.errors import Conflict
    from apps.inventory.models import ComputeUnit

    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=4000)
    first, second = fleet.submit("a"), fleet.submit("a")
    sneaky = fleet.submit("a")
    real = snapshot_cycle.snapshot_for_pool

    def snapshot_then_sneak(pool_id: int, now: Any) -> Any:
        snapshot = real(pool_id, now)
        unit = ComputeUnit.objects.select_related("gpu").order_by("pk").first()
        assert unit is not None
        Assignment.objects.create(task=sneaky, node_id=unit.gpu.node_id, unit_ids=[unit.pk])
        return snapshot

    monkeypatch.setattr(snapshot_cycle, "snapshot_for_pool", snapshot_then_sneak)
    with pytest.raises(Conflict, match="taken during the commit"):
        services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    assert not Assignment.objects.exists()  # the sneak rolled back with it
    for task in (first, second):
        task.refresh_from_db()
        assert task.state == "pending"


def test_binding_units_writes_no_unit_row_and_finishing_frees_them(fleet: Fleet) -> None:
    """A unit's holder is the live assignment listing it (`apps.scheduling.holders`): a cycle's binds
    update no unit row at all, every placed task holds exactly its assignment's units, and a finished
    task's units are free again once its assignment is released."""
    from apps.inventory.models import ComputeUnit
    from apps.scheduling.holders import unit_holders
    from apps.workloads.services import task_transition

    if connection.vendor != "postgresql":
        pytest.fail("the table statistics are PostgreSQL's: set DATABASE_URL")
    tasks = _busy_pool(fleet)
    with connection.cursor() as cursor:

        def unit_updates() -> int:
            # This transaction's own count (the test runs in one), updated as statements run.
            cursor.execute(
                "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
                [ComputeUnit._meta.db_table],
            )
            row = cursor.fetchone()
            return row[0] if row else 0

        before = unit_updates()
        report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
        updated = unit_updates() - before
    holders = unit_holders(pool_id=fleet.pool.pk)
    assert report.placed > 0 and len(holders) > 0
    assert updated == 0
    placed = next(t for t in tasks if Assignment.objects.filter(task=t, released_at__isnull=True).exists())
    placed.refresh_from_db()
    units = set(Assignment.objects.get(task=placed, released_at__isnull=True).unit_ids)
    assert {u for u, t in holders.items() if t == placed.pk} == units
    running = task_transition(task=placed, to_state=Task.State.RUNNING, actor="agent", reason="started")
    task_transition(task=running, to_state=Task.State.SUCCEEDED, actor="agent", reason="exit 0")
    after = unit_holders(pool_id=fleet.pool.pk)
    assert not units & after.keys()
    assert len(after) == len(holders) - len(units)
    assert violations(fleet.pool.pk) == []


def test_a_tenant_that_reached_its_limit_while_the_cycle_decided_gets_no_more(
    fleet: Fleet, monkeypatch: Any
) -> None:
    """The commit counts what the tenant holds now and its limit now, under the quota row's lock, not what
    the snapshot saw: a task that started meanwhile and a lowered quota leave room for one of two."""
    from apps.workloads.services import quota_set

    fleet.node(gpus=2)
    tenant = fleet.tenant("a", guaranteed=4000)
    first, second = fleet.submit("a"), fleet.submit("a")
    real = snapshot_cycle.snapshot_for_pool

    def snapshot_then_start_another(pool_id: int, now: Any) -> Any:
        snapshot = real(pool_id, now)
        started = fleet.submit("a", gpu_count=2)
        Task.objects.filter(pk=started.pk).update(state=Task.State.RUNNING)
        quota_set(tenant=tenant, pool=fleet.pool, guaranteed_milli=3000, borrow_limit_milli=0)
        return snapshot

    monkeypatch.setattr(snapshot_cycle, "snapshot_for_pool", snapshot_then_start_another)
    report = services.cycle_run(pool_id=fleet.pool.pk, now=NOW)
    # The unlocked attempt found the tenant above its limit once written, and went the locked way.
    missed = Cycle.objects.get(pk=report.cycle_id).stats["commit_unlocked_missed"]
    assert "more than their quota limit" in missed
    first.refresh_from_db()
    second.refresh_from_db()
    assert sorted([first.state, second.state]) == ["assigned", "pending"]
    waiting = first if first.state == "pending" else second
    assert waiting.why_pending == "its tenant reached its quota limit meanwhile; retried next cycle"
