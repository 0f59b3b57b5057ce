"""`whalegen replay --from-pool`: what each policy would do on the pool's live snapshot, writing nothing;
the pool's own policy decides exactly what the next production cycle then commits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.scheduling.conftest import NOW, Fleet


def _fleet() -> Fleet:
    from apps.inventory.services import pool_create
    from tests.apps.factories import UserFactory

    fleet = Fleet(pool=pool_create(name="whatif", runtime="process"), user=UserFactory(username="whatif"))
    fleet.node(model="H100-80GB", gpus=2, mode="whole", cpu_milli=32_000, name="w0")
    fleet.node(model="H100-80GB", gpus=2, mode="mps", mps_shares=4, cpu_milli=32_000, name="s0")
    fleet.node(
        model="H100-80GB",
        gpus=1,
        mode="mig",
        mig_layout=[("3g.40gb", 0), ("3g.40gb", 4)],
        cpu_milli=32_000,
        name="m0",
    )
    fleet.tenant("a", guaranteed=2000, borrow=2000)
    fleet.tenant("b", guaranteed=3000)
    for tenant, count, milli in [
        ("a", 1, 1000),
        ("a", 1, 250),
        ("b", 2, 1000),
        ("b", 1, 430),
        ("a", 2, 1000),
    ]:
        fleet.submit(tenant, gpu_count=count, gpu_milli=milli, cpu_milli=1000, command=["true"])
    return fleet


def _state() -> dict[str, Any]:
    from apps.inventory.models import ComputeUnit, Gpu, Node
    from apps.scheduling.models import Assignment, Cycle
    from apps.workloads.models import Task, TaskEvent

    return {
        "tasks": sorted(Task.objects.values_list("pk", "state", "version", "wait__code", "wait__start_at")),
        "events": TaskEvent.objects.count(),
        "assignments": Assignment.objects.count(),
        "cycles": Cycle.objects.count(),
        "units": sorted(ComputeUnit.objects.values_list("pk", "gpu_id", "mig_profile", "mig_start")),
        "gpus": sorted(Gpu.objects.values_list("pk", "partition_mode", "updated_at")),
        "nodes": sorted(Node.objects.values_list("pk", "version")),
    }


@pytest.mark.django_db
def test_the_what_if_writes_nothing_and_the_pools_policy_decides_what_the_cycle_does(settings: Any) -> None:
    from apps.scheduling.models import Assignment
    from apps.scheduling.services import cycle_run
    from apps.scheduling.whatif import pool_whatif, whatif_text

    fleet = _fleet()
    settings.WHALEGEN_CYCLE_POLICY = "whalegen"
    before = _state()
    report = pool_whatif(pool_name="whatif", policies=["whalegen", "fgd", "k8s-default"], now=NOW)
    assert _state() == before
    assert report.pending == 5
    ours = report.runs[0]
    assert ours.decisions.placements, "the seeded pool has room: something must be placed"
    text = whatif_text(report)
    assert "whalegen (the cycle's policy)" in text and "== fgd" in text and "== k8s-default" in text
    # The cycle, on the same database at the same instant, binds exactly the units the what-if named.
    done = cycle_run(pool_id=fleet.pool.pk, now=NOW)
    bound = {
        str(a.task_id): tuple(sorted(u.pk for u in a.units.all()))
        for a in Assignment.objects.filter(cycle_id=done.cycle_id)
    }
    assert bound == {b.task_id: tuple(sorted(b.unit_ids)) for b in ours.decisions.placements}
    assert done.unplaced == len(ours.decisions.unplaced)


@pytest.mark.django_db
def test_an_unknown_pool_is_one_line_listing_the_pools_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from whalegen.commands import _scenario

    _fleet()
    assert _scenario._from_pool("nope", ["whalegen"], as_json=False) == 2
    err = capsys.readouterr().err
    assert err.strip() == "whalegen replay: no pool named 'nope' (pools: whatif)"


@pytest.mark.django_db
def test_the_command_prints_each_policys_decision_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from whalegen.commands import _scenario

    _fleet()
    assert _scenario._from_pool("whatif", ["whalegen", "bestfit"], as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["policy"] for p in out["policies"]] == ["whalegen", "bestfit"]
    for policy in out["policies"]:
        placed = {p["task"] for p in policy["placements"]}
        waiting = {u["task"] for u in policy["unplaced"]}
        assert len(placed | waiting) == out["pending"] and not placed & waiting
        assert all(p["units"] for p in policy["placements"])
