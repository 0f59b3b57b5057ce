"""A gang after it is placed: it runs whole or is requeued whole. A member that loses its place (node
drained or lost, preempted) takes its running siblings back to pending with it, so the gang can be placed
again in one piece instead of one member waiting forever (`gang_incomplete`) while the others run alone."""

from __future__ import annotations

import pytest

from apps.workloads.models import Quota, Task
from tests.apps.factories import held_milli
from tests.apps.scheduling.conftest import run, start
from tests.apps.scheduling.invariants import violations

pytestmark = pytest.mark.django_db


def _states(*tasks: Task) -> list[str]:
    return [Task.objects.get(pk=t.pk).state for t in tasks]


def test_a_drained_gang_member_requeues_its_siblings_and_the_gang_runs_again_whole(fleet, settings) -> None:
    from apps.fleet.nodes import node_drain, node_uncordon

    settings.WHALEGEN_REQUEUE_BACKOFF_S = 0  # the drain runs on the wall clock, the cycles on NOW
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
    # Requeued to pending: they hold no quota until a cycle admits them again.
    assert held_milli(Quota.objects.get(tenant=fleet.tenants["a"])) == 0

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
    assert held_milli(Quota.objects.get(tenant=fleet.tenants["a"])) == 0
    assert violations(fleet.pool.pk) == []


# A gang is placed whole or not at all, so once one member has ended (succeeded, failed, cancelled) it can
# never be placed whole again: no member may go back to pending, where it would wait as `gang_incomplete`
# forever (`gang_incomplete`).


def _running_gang(fleet, *, size: int, slug: str = "a") -> list[Task]:
    fleet.node(gpus=size)
    fleet.tenant(slug, guaranteed=1000 * size)
    gang = [fleet.submit(slug, gang_id="ranks", gang_size=size) for _ in range(size)]
    assert run(fleet).placed == size
    return [start(member) for member in gang]


def _all_ended_and_charge_free(fleet, gang: list[Task], slug: str = "a") -> None:
    assert all(state in {"succeeded", "failed", "cancelled"} for state in _states(*gang)), _states(*gang)
    assert held_milli(Quota.objects.get(tenant=fleet.tenants[slug])) == 0
    assert violations(fleet.pool.pk) == []


def test_a_succeeded_member_keeps_a_lost_sibling_from_waiting_forever(fleet) -> None:
    """Rank 0 finished first; then the node of the others is drained. They must not go back to pending
    for a gang of three that can never be whole again: they fail, and the whole charge is given back."""
    from apps.fleet.nodes import node_drain
    from apps.workloads.services import task_transition

    gang = _running_gang(fleet, size=3)
    node = gang[0].assignments.get().node
    task_transition(task=gang[0], to_state="succeeded", actor="agent:n001", reason="exit code 0", exit_code=0)

    node_drain(node=node, actor="user:ops")

    assert _states(*gang) == ["succeeded", "failed", "failed"]
    _all_ended_and_charge_free(fleet, gang)
    for sibling in gang[1:]:
        event = Task.objects.get(pk=sibling.pk).events.get(to_state="failed")
        assert event.from_state == "preempted"
        assert event.reason == (
            f"gang member {gang[0].pk} already ended (succeeded); the gang cannot run whole again"
        )
        assert event.actor == "user:ops"  # the drain's actor, as for the preemption before it
        assert sibling.events.filter(to_state="pending").count() == 1  # only its submission
    # Nothing left for the scheduler: no member waits as gang_incomplete.
    assert run(fleet, minutes=1).placed == 0


def test_a_succeeded_member_keeps_a_preempted_sibling_from_waiting_forever(fleet) -> None:
    """The scheduler's own preemption path: the victim fails instead of being requeued."""
    from apps.scheduling.services import ACTOR
    from apps.workloads.services import task_transition

    fleet.node(gpus=2)
    fleet.tenant("low", guaranteed=0, borrow=2000)
    fleet.tenant("high", guaranteed=2000, priority=10)
    gang = [fleet.submit("low", gang_id="pair", gang_size=2) for _ in range(2)]
    assert run(fleet).placed == 2
    gang = [start(member) for member in gang]
    task_transition(task=gang[0], to_state="succeeded", actor="agent:n001", reason="exit code 0", exit_code=0)
    fleet.submit("high", gpu_count=2)  # one GPU is free: the other only by preemption

    report = run(fleet, minutes=1)

    assert report.preempted == 1
    assert _states(*gang) == ["succeeded", "failed"]
    event = Task.objects.get(pk=gang[1].pk).events.get(to_state="failed")
    assert event.actor == ACTOR
    assert "already ended (succeeded)" in event.reason
    _all_ended_and_charge_free(fleet, gang, slug="low")


def test_cancelling_one_member_cancels_its_whole_gang(fleet) -> None:
    """A co-scheduled job is one job: cancelling one rank cancels the others (none runs on without it,
    none is later requeued into a gang that can never be whole), and the whole charge is given back."""
    from apps.fleet.nodes import node_drain
    from apps.workloads.services import task_cancel

    gang = _running_gang(fleet, size=3)
    node = gang[0].assignments.get().node

    task_cancel(task=gang[1], by=fleet.user, reason="wrong dataset")

    assert _states(*gang) == ["cancelled", "cancelled", "cancelled"]
    for sibling in (gang[0], gang[2]):
        event = Task.objects.get(pk=sibling.pk).events.get(to_state="cancelled")
        assert event.actor == "user:ci"
        assert event.reason == f"gang member {gang[1].pk} was cancelled: wrong dataset"
    _all_ended_and_charge_free(fleet, gang)
    # A later loss of the node finds nothing to requeue.
    node_drain(node=node, actor="user:ops")
    _all_ended_and_charge_free(fleet, gang)
    assert run(fleet, minutes=1).placed == 0


def test_cancelling_a_member_of_a_waiting_gang_cancels_the_rest(fleet) -> None:
    fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=3000)
    gang = [fleet.submit("a", gang_id="trio", gang_size=3) for _ in range(3)]
    assert run(fleet).placed == 0  # one GPU for three members: the gang waits whole
    from apps.workloads.services import task_cancel

    task_cancel(task=gang[2], by=fleet.user)

    assert _states(*gang) == ["cancelled", "cancelled", "cancelled"]
    _all_ended_and_charge_free(fleet, gang)


def test_a_script_cancelling_every_member_gets_200s_and_a_repeat_of_its_own_cancel_a_409(fleet, api) -> None:
    """The siblings were cancelled by the plane on the script's behalf: cancelling them is what the
    script asked for and already holds (200, unchanged, no second event). Its own cancel repeated is
    still the 409 every task gets for a duplicate cancel."""
    from apps.tenants.models import Membership

    gang = _running_gang(fleet, size=3)
    Membership.objects.create(user=fleet.user, tenant=fleet.tenants["a"], role=Membership.Role.MEMBER)
    client = api(fleet.user)

    answers = [client.post(f"/api/v1/tasks/{t.pk}/cancel/", {}, format="json") for t in gang]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["state"] for a in answers] == ["cancelled"] * 3
    for member in gang:
        assert Task.objects.get(pk=member.pk).events.filter(to_state="cancelled").count() == 1
    again = client.post(f"/api/v1/tasks/{gang[0].pk}/cancel/", {}, format="json")
    assert again.status_code == 409
    assert "a cancelled task cannot become cancelled" in again.json()["detail"]
    _all_ended_and_charge_free(fleet, gang)


def test_a_gang_whose_members_all_succeed_is_left_alone(fleet) -> None:
    """Members finish one by one; an ended sibling changes nothing for those still running."""
    from apps.workloads.services import task_transition

    gang = _running_gang(fleet, size=3)
    for index, member in enumerate(gang):
        task_transition(task=member, to_state="succeeded", actor="agent:n001", reason="exit code 0")
        later = gang[index + 1 :]
        assert _states(*later) == ["running"] * len(later)
    assert _states(*gang) == ["succeeded"] * 3
    for member in gang:
        reasons = list(Task.objects.get(pk=member.pk).events.values_list("reason", flat=True))
        assert not any(reason.startswith("gang member") for reason in reasons)
    _all_ended_and_charge_free(fleet, gang)


def test_a_reused_gang_id_is_a_new_gang(fleet, settings) -> None:
    """A gang id may be used again once its earlier gang ended: that gang's ended members do not keep
    the new one from being requeued."""
    settings.WHALEGEN_REQUEUE_BACKOFF_S = 0  # the drain runs on the wall clock, the cycles on NOW
    from apps.fleet.nodes import node_drain, node_uncordon
    from apps.workloads.services import task_transition

    gang = _running_gang(fleet, size=2)
    for member in gang:
        task_transition(task=member, to_state="succeeded", actor="agent:n001", reason="exit code 0")
    again = [fleet.submit("a", gang_id="ranks", gang_size=2) for _ in range(2)]
    assert run(fleet, minutes=1).placed == 2
    again = [start(member) for member in again]
    node = again[0].assignments.get(released_at__isnull=True).node

    node_drain(node=node, actor="user:ops")

    assert _states(*again) == ["pending", "pending"]
    node_uncordon(node=node, actor="user:ops")
    assert run(fleet, minutes=2).placed == 2
    assert violations(fleet.pool.pk) == []
