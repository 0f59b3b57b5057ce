"""The scheduling cycle on PostgreSQL: admission order, quotas, gangs, preemption, clusters, why-pending."""

from __future__ import annotations

from datetime import timedelta

import pytest

from apps.inventory.models import Cluster
from apps.scheduling.models import Assignment, Cycle
from apps.workloads.models import Task, TaskEvent
from tests.apps.factories import holder_of, units_held_by
from tests.apps.scheduling.conftest import NOW, run, start
from tests.apps.scheduling.invariants import violations


def states(*tasks: Task) -> list[str]:
    for task in tasks:
        task.refresh_from_db()
    return [task.state for task in tasks]


def test_a_cycle_assigns_what_fits_and_records_itself(fleet) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=3000)
    tasks = [fleet.submit("a") for _ in range(3)]
    report = run(fleet)
    assert report.status == "done"
    assert (report.placed, report.unplaced, report.conflicts) == (2, 1, 0)
    assert states(*tasks) == ["assigned", "assigned", "pending"]
    first = tasks[0]
    assignment = Assignment.objects.get(task=first, released_at__isnull=True)
    assert [holder_of(u) for u in assignment.units.all()] == [first.pk]
    events = list(TaskEvent.objects.filter(task=first, actor="scheduler").values_list("to_state", "reason"))
    assert [e[0] for e in events] == ["admitted", "assigned"]
    assert "within the guarantee" in events[0][1] and "eu-1/n001 GPU" in events[1][1]
    cycle = Cycle.objects.get(pk=report.cycle_id)
    assert (cycle.tasks_considered, cycle.tasks_placed) == (3, 2)
    assert cycle.snapshot_ms is not None and cycle.solve_ms is not None and cycle.commit_ms is not None
    assert cycle.stats["unplaced_by_reason"] == {"no_capacity": 1}
    assert cycle.stats["fragmentation_before"]["idle_milli"] == 2000
    assert cycle.stats["fragmentation_after"]["idle_milli"] == 0
    assert violations(fleet.pool.pk) == []


def test_order_is_priority_then_fair_share_then_age(fleet) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=4000)
    fleet.tenant("b", guaranteed=4000)
    a_old, a_newer = fleet.submit("a"), fleet.submit("a")
    b_newest = fleet.submit("b")
    a_urgent = fleet.submit("a", priority=10)
    run(fleet)
    # The urgent task first; then b, whose share is smaller than a's, before a's older tasks.
    assert states(a_urgent, b_newest, a_old, a_newer) == ["assigned", "assigned", "pending", "pending"]


def test_a_queue_of_weight_two_gets_twice_the_share_of_its_tenant(fleet) -> None:
    from apps.workloads.services import TaskSubmission, queue_create, task_submit

    fleet.node(gpus=3)
    tenant = fleet.tenant("a", guaranteed=3000, borrow=9000)
    queue_create(tenant=tenant, pool=fleet.pool, name="heavy", weight=2)
    light = [fleet.submit("a") for _ in range(6)]  # older: by age alone they would take every GPU
    heavy = [
        task_submit(tenant=tenant, request=TaskSubmission(queue="heavy"), submitted_by=fleet.user)[0]
        for _ in range(6)
    ]
    run(fleet)
    assert states(*light).count("assigned") == 1
    assert states(*heavy).count("assigned") == 2
    # Within each queue, the oldest go first.
    assert states(light[0], heavy[0], heavy[1]) == ["assigned"] * 3


def test_the_cycle_asks_the_engine_once_with_its_own_order(fleet, monkeypatch) -> None:
    from whalegen.placement.engine import Engine

    calls: list[list[tuple[str, int | None]]] = []
    real = Engine.solve

    def spy(self: Engine, pending: tuple, now: float, on_placed: object = None) -> object:
        calls.append([(t.task_id, t.order_key) for t in pending])
        return real(self, pending, now, on_placed)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "solve", spy)
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=4000)
    fleet.tenant("b", guaranteed=4000)
    a_old, a_newer = fleet.submit("a"), fleet.submit("a")
    b_newest = fleet.submit("b")
    run(fleet)
    assert len(calls) == 1
    # Fair share puts b's task between a's two; every task carries its place as `order_key`.
    assert calls[0] == [(str(a_old.pk), 0), (str(b_newest.pk), 1), (str(a_newer.pk), 2)]
    assert states(a_old, b_newest, a_newer) == ["assigned", "assigned", "pending"]


def test_guarantees_are_served_before_anyone_borrows(fleet) -> None:
    fleet.node(gpus=3)
    fleet.tenant("a", guaranteed=1000, borrow=2000)
    fleet.tenant("b", guaranteed=2000)
    a1, a2, a3 = (fleet.submit("a") for _ in range(3))
    b1, b2 = fleet.submit("b"), fleet.submit("b")
    run(fleet)
    # By age alone a's three tasks would take the pool; b's guarantee comes first.
    assert states(a1, a2, a3, b1, b2) == ["assigned", "pending", "pending", "assigned", "assigned"]
    assert not Assignment.objects.filter(borrowed=True).exists()
    # Idle capacity appears: a borrows it, and the assignment says so.
    fleet.node(gpus=1)
    run(fleet, minutes=1)
    assert states(a2, a3) == ["assigned", "pending"]
    assert Assignment.objects.get(task=a2).borrowed is True
    assert violations(fleet.pool.pk) == []


def test_a_gang_places_all_members_in_one_cycle_or_none(fleet) -> None:
    fleet.node(gpus=2)
    fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=8000)
    gang = [fleet.submit("a", gang_id="g", gang_size=4, priority=5) for _ in range(4)]
    single = fleet.submit("a")
    run(fleet)
    assert states(*gang) == ["pending"] * 4
    assert {t.why_pending_code for t in gang} == {"gang_unplaceable", "no_capacity"}
    # The gang held nothing back: the single task took a GPU.
    assert states(single) == ["assigned"]
    assert not Assignment.objects.filter(task__in=gang).exists()
    # With room for every member, all four go in one cycle.
    fleet.node(gpus=2)
    report = run(fleet, minutes=1)
    assert states(*gang) == ["assigned"] * 4
    assert {a.cycle_id for a in Assignment.objects.filter(task__in=gang)} == {report.cycle_id}


def test_an_incomplete_gang_waits_for_its_members(fleet) -> None:
    fleet.node(gpus=4)
    fleet.tenant("a", guaranteed=4000)
    lone = fleet.submit("a", gang_id="pair", gang_size=2)
    run(fleet)
    lone.refresh_from_db()
    assert (lone.state, lone.why_pending_code) == ("pending", "gang_incomplete")
    assert "1 of 2 members" in lone.why_pending
    assert lone.predicted_start_at is None


def test_an_approved_override_preempts_a_lower_priority_task_and_its_expiry_reverts(fleet) -> None:
    from apps.approvals.models import OverrideAuditEntry
    from apps.approvals.services import override_approve, override_request, overrides_expire
    from apps.scheduling.snapshot import snapshot_for_pool

    fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=1000)
    fleet.tenant("b", guaranteed=1000)
    victim = fleet.submit("b", preemptible=True)
    run(fleet)
    start(victim)
    urgent = fleet.submit("a")
    run(fleet, minutes=1)
    urgent.refresh_from_db()
    assert (urgent.state, urgent.why_pending_code) == ("pending", "no_capacity")
    # Equal priority preempts nobody; an approved override does.
    override = override_request(
        tenant=fleet.tenants["a"],
        task=urgent,
        wanted_priority=50,
        reason="release",
        requested_by=fleet.user,
        now=NOW,
    )
    override_approve(override=override, by=fleet.user, now=NOW)
    report = run(fleet, minutes=2)
    assert report.preempted == 1
    victim.refresh_from_db()
    assert (victim.state, victim.attempts) == ("pending", 1)
    assert victim.why_pending.startswith(f"preempted for task {urgent.pk}: preemptible, priority 0 below 50")
    released = Assignment.objects.get(task=victim)
    assert released.released_at is not None and "preempted" in released.release_reason
    assert list(victim.events.values_list("to_state", flat=True))[-2:] == ["preempted", "pending"]
    urgent.refresh_from_db()
    assert urgent.why_pending_code == "waiting_for_preemption"
    # Its units are free now: the next cycle binds the urgent task.
    run(fleet, minutes=3)
    assert states(urgent) == ["assigned"]
    assert violations(fleet.pool.pk) == []
    # After its term the override no longer counts, even before the expiry job ran; the job logs it.
    late = NOW + timedelta(hours=48)
    pending = {t.task_id: t.priority for t in snapshot_for_pool(fleet.pool.pk, late).cluster.pending}
    assert urgent.priority == 50 and pending == {str(victim.pk): 0}
    running = {t.task_id: t.priority for t in snapshot_for_pool(fleet.pool.pk, late).cluster.running}
    assert running[str(urgent.pk)] == 0
    assert overrides_expire(now=late) == 1
    assert states(urgent) and urgent.priority == 0
    assert OverrideAuditEntry.objects.filter(override=override, action="expired").exists()


def test_an_owner_reclaims_borrowed_capacity(fleet) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=1000, borrow=1000)
    fleet.tenant("b", guaranteed=1000)
    a1, a2 = fleet.submit("a", preemptible=False), fleet.submit("a", preemptible=False)
    run(fleet)
    assert states(a1, a2) == ["assigned", "assigned"]
    borrowed = Assignment.objects.get(borrowed=True).task
    start(a1), start(a2)
    owner = fleet.submit("b")
    report = run(fleet, minutes=10)
    assert report.preempted == 1
    borrowed.refresh_from_db()
    assert borrowed.state == "pending" and "borrowed capacity reclaimed for tenant b" in borrowed.why_pending
    run(fleet, minutes=11)
    assert states(owner) == ["assigned"]
    assert violations(fleet.pool.pk) == []


def test_a_pool_spans_clusters_and_a_cordoned_cluster_takes_nothing_new(fleet) -> None:
    fleet.node(cluster="eu-1", model="A100-80GB", gpus=1)
    fleet.node(cluster="us-1", model="L4", gpus=2)
    fleet.tenant("a", guaranteed=8000)
    l4_task = fleet.submit("a", allowed_gpu_models=["L4"])
    any_task = fleet.submit("a", allowed_gpu_models=["A100-80GB"])
    run(fleet)
    assert Assignment.objects.get(task=l4_task).node.cluster.name == "us-1"
    assert Assignment.objects.get(task=any_task).node.cluster.name == "eu-1"
    Cluster.objects.filter(name="us-1").update(cordoned=True)
    second = fleet.submit("a", allowed_gpu_models=["L4"])
    report = run(fleet, minutes=1)
    second.refresh_from_db()
    assert (second.state, second.why_pending_code) == ("pending", "no_allowed_model")
    assert second.why_pending == "no schedulable node has a L4 GPU"
    assert Cycle.objects.get(pk=report.cycle_id).stats["nodes_excluded"] == {
        "us-1/n002": "cluster us-1 is cordoned"
    }
    # What already runs there keeps running; lifting the cordon lets the new task in.
    assert states(l4_task) == ["assigned"]
    Cluster.objects.filter(name="us-1").update(cordoned=False)
    run(fleet, minutes=2)
    assert states(second) == ["assigned"]


def test_why_pending_carries_an_estimated_start_from_running_runtimes(fleet, api) -> None:
    from tests.apps.factories import UserFactory

    fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=2000)
    running = fleet.submit("a", max_runtime_s=3600)
    run(fleet)
    start(running)
    waiting = fleet.submit("a")
    run(fleet, minutes=5)
    waiting.refresh_from_db()
    assert waiting.why_pending_code == "no_capacity"
    assert waiting.predicted_start_at == NOW + timedelta(seconds=3600)
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    body = api(root).get(f"/api/v1/tasks/{waiting.pk}/").json()
    assert body["why_pending_code"] == "no_capacity"
    assert body["why_pending"].startswith("no GPU node with 1000 milli free")
    assert body["predicted_start_at"].startswith("2026-11-29T13:00:00")


@pytest.mark.parametrize("policy", ["fgd", "whalegen"])
def test_fractional_tasks_get_mig_instances_and_mps_shares(fleet, policy: str) -> None:
    fleet.node(model="H100-80GB", mode="mig", mig_layout=[("3g.40gb", 0), ("3g.40gb", 4)])
    fleet.node(model="A100-80GB", mode="mps", mps_shares=4)
    fleet.tenant("a", guaranteed=8000)
    mig = [fleet.submit("a", gpu_milli=400, allowed_gpu_models=["H100-80GB"]) for _ in range(3)]
    mps = [fleet.submit("a", gpu_milli=500, allowed_gpu_models=["A100-80GB"]) for _ in range(3)]
    run(fleet, policy=policy)
    assert states(*mig) == ["assigned", "assigned", "pending"]
    assert states(*mps) == ["assigned", "assigned", "pending"]
    for task in mig[:2]:
        (unit,) = units_held_by(task)
        assert unit.kind == "mig" and unit.mig_profile == "3g.40gb"
    for task in mps[:2]:
        assert sorted(u.gpu_milli for u in units_held_by(task)) == [250, 250]
    assert violations(fleet.pool.pk) == []


def test_a_lost_or_draining_node_takes_nothing_new(fleet) -> None:
    node = fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=1000)
    task = fleet.submit("a")
    type(node).objects.filter(pk=node.pk).update(state="draining")
    report = run(fleet)
    task.refresh_from_db()
    assert (report.placed, task.why_pending_code) == (0, "no_allowed_model")
    assert Cycle.objects.get(pk=report.cycle_id).stats["nodes_excluded"] == {"eu-1/n001": "node is draining"}


@pytest.mark.parametrize("policy", ["whalegen", "fgd", "bestfit", "k8s-default"])
def test_every_shipped_policy_runs_the_same_cycle(fleet, policy: str) -> None:
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=2000)
    tasks = [fleet.submit("a", gpu_milli=500) for _ in range(2)]
    report = run(fleet, policy=policy)
    assert report.placed == 2 and Cycle.objects.get(pk=report.cycle_id).policy == policy
    assert states(*tasks) == ["assigned", "assigned"]


def _queue_override_world(fleet):
    """One GPU; A's priority-0 task and B's priority-5 task; an approved raise of A's queue to 10."""
    from apps.approvals.services import override_approve, override_request
    from apps.workloads.models import Queue

    fleet.node(gpus=1)
    fleet.tenant("a", guaranteed=2000)
    fleet.tenant("b", guaranteed=2000)
    a_task = fleet.submit("a", priority=0)
    b_task = fleet.submit("b", priority=5)
    queue = Queue.objects.get(tenant=fleet.tenants["a"])
    override = override_request(
        tenant=fleet.tenants["a"],
        queue=queue,
        wanted_priority=10,
        reason="demo day",
        requested_by=fleet.user,
        now=NOW,
    )
    override_approve(override=override, by=fleet.user, now=NOW)
    return a_task, b_task, override


def test_an_approved_queue_override_lifts_its_queue_until_it_expires(fleet) -> None:
    a_task, b_task, override = _queue_override_world(fleet)
    run(fleet)
    assert states(a_task, b_task) == ["assigned", "pending"]
    reason = a_task.events.get(to_state="admitted").reason
    assert reason.endswith(f"at priority 10 (override {override.pk} on its queue)")


def test_a_lapsed_queue_override_no_longer_counts(fleet) -> None:
    a_task, b_task, _ = _queue_override_world(fleet)
    run(fleet, minutes=60 * 48)  # past the 24-hour term; the expiry job has not run yet
    assert states(a_task, b_task) == ["pending", "assigned"]


def test_isolation_chooses_the_kind_of_gpu(fleet) -> None:
    fleet.node(model="H100-80GB", mode="mig", mig_layout=[("3g.40gb", 0), ("3g.40gb", 4)])
    fleet.node(model="A100-80GB", mode="mps", mps_shares=4)
    fleet.tenant("a", guaranteed=8000)
    on_mig = fleet.submit("a", gpu_milli=400, isolation="mig")
    on_mps = fleet.submit("a", gpu_milli=400, isolation="mps")
    run(fleet)
    assert states(on_mig, on_mps) == ["assigned", "assigned"]
    assert {u.kind for u in units_held_by(on_mig)} == {"mig"}
    assert {u.kind for u in units_held_by(on_mps)} == {"mps"}
    assert violations(fleet.pool.pk) == []


def test_an_isolation_no_gpu_offers_waits_with_that_reason_and_no_estimate(fleet) -> None:
    fleet.node(model="H100-80GB", mode="mig", mig_layout=[("3g.40gb", 0), ("3g.40gb", 4)])
    fleet.tenant("a", guaranteed=8000)
    exclusive = fleet.submit("a", isolation="exclusive")
    run(fleet)
    assert states(exclusive) == ["pending"]
    assert exclusive.why_pending_code == "no_isolation"
    assert "exclusive" in exclusive.why_pending and exclusive.predicted_start_at is None


def test_batch_tasks_leave_the_online_reserve_to_online_tasks(fleet, settings) -> None:
    settings.WHALEGEN_ONLINE_RESERVE_MILLI = 1000
    fleet.node(gpus=2)
    fleet.tenant("a", guaranteed=3000)
    batch = [fleet.submit("a", sla_class="batch") for _ in range(2)]
    online = fleet.submit("a", sla_class="online", kind="inference")
    run(fleet)
    assert states(*batch, online) == ["assigned", "pending", "assigned"]
    assert batch[1].why_pending_code == "online_reserve"
    assert "online" in batch[1].why_pending
    assert violations(fleet.pool.pk) == []
