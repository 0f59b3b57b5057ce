"""The production cycle on PostgreSQL decides exactly what pure `decide` decides on the same snapshot:
the same tasks bound to the same compute unit rows, the same reasons for the rest. Random pools mix
whole, MPS and MIG GPUs (some MIG GPUs idle, some partly held by a first cycle's tasks)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.apps.scheduling.conftest import NOW, Fleet

LAYOUTS = [
    [("3g.40gb", 0), ("3g.40gb", 4)],
    [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)],
    [("7g.80gb", 0)],
    [("4g.40gb", 0), ("3g.40gb", 4)],
]

gpu_specs = st.one_of(
    st.just(("whole", None, 0)),
    st.tuples(st.just("mps"), st.none(), st.sampled_from([2, 4])),
    st.tuples(st.just("mig"), st.sampled_from(range(len(LAYOUTS))), st.just(0)),
)
task_specs = st.tuples(
    st.sampled_from(["a", "b"]),
    st.sampled_from([(1, 100), (1, 250), (1, 430), (1, 1000), (2, 1000)]),
    st.sampled_from(["any", "any", "mig", "mps", "exclusive"]),
    st.integers(0, 2),
)


def _build(fleet: Fleet, nodes: list[list[tuple[str, int | None, int]]]) -> None:
    for i, gpus in enumerate(nodes):
        # One mode per node keeps the inventory simple; a pool mixes them across nodes.
        mode, layout, shares = gpus[0]
        fleet.node(
            model="H100-80GB",
            gpus=len(gpus),
            mode=mode,
            mig_layout=LAYOUTS[layout] if layout is not None else None,
            mps_shares=shares,
            cpu_milli=8_000,
            name=f"n{i}",
        )


def _submit(fleet: Fleet, specs: list[tuple[str, tuple[int, int], str, int]]) -> list[Any]:
    tasks = []
    for tenant, (count, milli), isolation, priority in specs:
        if isolation == "exclusive" and milli < 1000:
            isolation = "any"
        try:
            tasks.append(
                fleet.submit(
                    tenant,
                    gpu_count=count,
                    gpu_milli=milli,
                    isolation=isolation,
                    priority=priority,
                    cpu_milli=1000,
                    command=["true"],
                )
            )
        except ValidationError:
            continue  # a shape the submission refuses is not the cycle's business
    return tasks


@pytest.mark.django_db(transaction=False)
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    nodes=st.lists(st.lists(gpu_specs, min_size=1, max_size=3), min_size=1, max_size=4),
    first=st.lists(task_specs, max_size=5),
    second=st.lists(task_specs, min_size=1, max_size=8),
    policy=st.sampled_from(["whalegen", "bestfit"]),
    chunk=st.sampled_from([1, 500]),
)
def test_the_cycle_binds_what_decide_decides_on_the_same_snapshot(
    db: None,
    nodes: list[list[tuple[str, int | None, int]]],
    first: list[Any],
    second: list[Any],
    policy: str,
    chunk: int,
) -> None:
    """`chunk`: the commit sends the engine's task moves as it places them, in chunks of this many (1: each
    on its own, while the engine runs on; 500: all of them once it is done, in these small pools)."""
    from apps.inventory.services import pool_create
    from apps.scheduling import services
    from apps.scheduling.models import Assignment
    from apps.scheduling.services import cycle_run
    from apps.scheduling.snapshot import cycle_input
    from apps.workloads.models import Task, TaskEvent
    from tests.apps.factories import UserFactory
    from whalegen.scheduling import decide

    with transaction.atomic():
        fleet = Fleet(pool=pool_create(name="prop", runtime="process"), user=UserFactory(username="prop"))
        _build(fleet, nodes)
        fleet.tenant("a", guaranteed=3000, borrow=2000)
        fleet.tenant("b", guaranteed=2000)
        # A first cycle makes some units held, so the second sees partly used GPUs.
        _submit(fleet, first)
        cycle_run(pool_id=fleet.pool.pk, now=NOW, policy=policy)
        _submit(fleet, second)
        later = NOW.replace(minute=1)
        given = cycle_input(fleet.pool.pk, later, policy)
        snapshot = given.snapshot
        expected = decide(given.pure, given.config, later.timestamp())
        with mock.patch.object(services, "STREAM_CHUNK", chunk):
            report = cycle_run(pool_id=fleet.pool.pk, now=later, policy=policy)
        bound = {
            str(a.task_id): tuple(sorted(u.pk for u in a.units.all()))
            for a in Assignment.objects.filter(cycle_id=report.cycle_id)
        }
        assert bound == {b.task_id: tuple(sorted(b.unit_ids)) for b in expected.placements}
        # Every task pending at the snapshot that was not bound carries decide's reason code.
        was_pending = set(snapshot.pending)
        codes = {
            str(t.pk): t.why_pending_code
            for t in Task.objects.filter(pool=fleet.pool, state=Task.State.PENDING)
            if str(t.pk) in was_pending
        }
        assert codes == {t: r.code for t, r in expected.unplaced.items()}
        # The victims decide named are the tasks the cycle sent back to pending.
        preempted = set(
            Task.objects.filter(pool=fleet.pool, state=Task.State.PENDING)
            .exclude(pk__in=[int(t) for t in was_pending])
            .values_list("pk", flat=True)
        )
        assert {str(t) for t in preempted} == {p.victim_task_id for p in expected.preemptions}
        assert report.placed == len(expected.placements)
        # Each placed task moved once, whichever attempt of the commit wrote it.
        for a in Assignment.objects.filter(cycle_id=report.cycle_id):
            history = list(
                TaskEvent.objects.filter(task_id=a.task_id).order_by("pk").values_list("to_state", flat=True)
            )
            assert history[-2:] == ["admitted", "assigned"] and history.count("admitted") == 1, history
        transaction.set_rollback(True)
