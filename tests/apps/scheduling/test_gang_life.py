"""A gang after it is placed: it runs whole or is requeued whole. A member that loses its place (node
drained or lost, preempted) takes its running siblings back to pending with it, so the gang can be placed
again in one piece instead of one member waiting forever (`gang_incomplete`) while the others run alone."""

from __future__ import annotations

import pytest

from apps.workloads.models import Quota, Task
from tests.apps.scheduling.conftest import run, start
from tests.apps.scheduling.invariants import violations

pytestmark = pytest.mark.django_db


def _states(*tasks: Task) -> list[str]:
    return [Task.objects.get(pk=t.pk).state for t in tasks]


def test_a_drained_gang_member_requeues_its_siblings_and_the_gang_runs_again_whole(fleet) -> None:
    from apps.fleet.services import node_drain, node_uncordon
    from apps.scheduling.models import Assignment

    first, second = fleet.node(), fleet.node()
    fleet.tenant("a", guaranteed=2000)
    gang = [fleet.submit("a", gang_id="pair", gang_size=2) for _ in range(2)]
    assert run(fleet).placed == 2
    for member in gang:
        start(member)
    on_first = Assignment.objects.get(task__in=gang, node=first, released_at__isnull=True).task
    sibling = next(t for t in gang if t.pk != on_first.pk)

    node_drain(node=first, actor="user:ops")

    assert _states(*gang) == ["pending", "pending"]
    sibling = Task.objects.get(pk=sibling.pk)
    assert sibling.attempts == 1
    assert f"gang member {on_first.pk}" in sibling.why_pending
    assert sibling.events.filter(to_state="preempted").exists()
    assert not Assignment.objects.filter(task__in=gang, released_at__isnull=True).exists()
    assert violations(fleet.pool.pk) == []
    # Requeued, not finished: the quota still holds both (given back only when they end).
    assert Quota.objects.get(tenant=fleet.tenants["a"]).charged_milli == 2000

    node_uncordon(node=first, actor="user:ops")
    second.refresh_from_db()
    assert run(fleet, minutes=1).placed == 2
    assert _states(*gang) == ["assigned", "assigned"]
    assert violations(fleet.pool.pk) == []


def test_a_preempted_gang_member_takes_its_sibling_off_too(fleet) -> None:
    fleet.node(gpus=2)
    fleet.tenant("low", guaranteed=0, borrow=2000)
    fleet.tenant("high", guaranteed=1000, priority=10)
    gang = [fleet.submit("low", gang_id="pair", gang_size=2) for _ in range(2)]
    assert run(fleet).placed == 2
    for member in gang:
        start(member)
    urgent = fleet.submit("high")

    report = run(fleet, minutes=1)

    assert report.preempted >= 1
    # Both members are back in line; neither runs alone on a gang that lost a rank.
    assert _states(*gang) == ["pending", "pending"]
    assert violations(fleet.pool.pk) == []
    run(fleet, minutes=2)
    assert Task.objects.get(pk=urgent.pk).state == "assigned"
    assert violations(fleet.pool.pk) == []


def test_a_failed_gang_member_ends_its_gang_and_gives_the_whole_charge_back(fleet) -> None:
    """One rank failing fails the job: the running sibling is failed too (not left running without it,
    nor later requeued alone into a gang that can never be whole again), and the quota is free."""
    from apps.workloads.services import task_transition

    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=3000)
    gang = [fleet.submit("a", gang_id="trio", gang_size=3) for _ in range(3)]
    assert run(fleet).placed == 0  # 2 GPUs for 3 members: the gang waits whole
    fleet.node(gpus=1)
    assert run(fleet, minutes=1).placed == 3
    for member in gang:
        start(member)
    failed = Task.objects.get(pk=gang[0].pk)

    task_transition(task=failed, to_state="failed", actor="agent:n001", reason="exit code 1", exit_code=1)

    assert _states(*gang) == ["failed", "failed", "failed"]
    sibling = Task.objects.get(pk=gang[1].pk)
    assert f"gang member {failed.pk} failed" in sibling.events.get(to_state="failed").reason
    assert sibling.exit_code is None  # it did not exit by itself
    assert Quota.objects.get(tenant=fleet.tenants["a"]).charged_milli == 0
    assert violations(fleet.pool.pk) == []
