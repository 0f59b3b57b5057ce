"""Partitions as part of the plan, on PostgreSQL: a cycle re-carves an idle MIG GPU for the task whose best
place needs another layout, keeps the task waiting (holding the GPU) until the node's agent reports the
layout applied, then binds it to its new instance."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import F

from apps.fleet.models import NodeAgent
from apps.fleet.reports import agent_report
from apps.fleet.selectors import desired_state_build, gpu_partition_applied
from apps.inventory.models import ComputeUnit, Gpu, Node, Pool
from apps.scheduling.models import Repartition
from apps.workloads.models import Task
from apps.workloads.services import task_cancel
from tests.apps.factories import holder_of, units_held_by
from tests.apps.scheduling.conftest import NOW, run
from tests.apps.scheduling.invariants import violations
from tests.apps.scheduling.test_races_and_queries import _race
from whalegen import protocol as p
from whalegen.gpus.mig import profile_by_name

H100 = "H100-80GB"
SEVEN_1G = [("1g.10gb", start) for start in range(7)]


def layout_of(gpu: Gpu) -> list[tuple[str, int | None, int | None]]:
    return sorted(
        (u.mig_profile, u.mig_start, holder_of(u))
        for u in ComputeUnit.objects.filter(gpu=gpu).order_by("mig_start")
    )


def report_partition(
    node: Any,
    gpu: Gpu,
    *,
    state: str = "ok",
    generation: int,
    seq: int,
    reason: str = "",
    carved: list[tuple[str, int]] | None = None,
) -> None:
    """What the node's agent says after its reconcile pass: the instances now on the GPU (the plane's
    plan, or `carved` when the GPU holds something else)."""
    on_gpu = carved or [
        (unit.mig_profile, unit.mig_start)
        for unit in ComputeUnit.objects.filter(gpu=gpu).order_by("mig_start")
    ]
    instances = tuple(
        p.MigInstance(
            gi_id=i,
            profile_id=profile_by_name(gpu.model, profile).profile_id,
            profile=profile,
            start=start,
            size=profile_by_name(gpu.model, profile).memory_slices,
        )
        for i, (profile, start) in enumerate(on_gpu, start=1)
    )
    agent_report(
        node=node,
        message=p.Report(
            node_id=str(node.pk),
            seq=seq,
            sent_at_s=NOW.timestamp(),
            partitions=(
                p.PartitionReport(
                    gpu_uuid=gpu.uuid,
                    state=p.PartitionState(state),
                    at_s=NOW.timestamp(),
                    generation=generation,
                    instances=instances if state == "ok" else (),
                    reason=reason,
                ),
            ),
        ),
    )


def test_a_task_waits_for_its_new_layout_and_binds_once_the_agent_applied_it(fleet) -> None:
    node = fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G)
    gpu = Gpu.objects.get(node=node)
    fleet.tenant("a", guaranteed=7000)
    task = fleet.submit("a", gpu_milli=400, gpu_mem_mib=30_000)

    # 1. Emit: the best place is a 3g.40gb, which seven 1g instances cannot give: the idle GPU is re-carved.
    report = run(fleet)
    task.refresh_from_db()
    assert (task.state, report.placed) == ("pending", 0)
    assert task.why_pending_code == "waiting_for_layout"
    generation = NodeAgent.objects.get(node=node).generation
    assert generation >= 1
    assert (
        f"GPU 0 on eu-1/n001 is being repartitioned to 4g.40gb+3g.40gb (generation {generation})"
        in task.why_pending
    )
    assert task.predicted_start_at is not None
    assert layout_of(gpu) == [("3g.40gb", 4, None), ("4g.40gb", 0, None)]
    claim = Repartition.objects.get(task=task)
    assert (claim.state, claim.generation, claim.layout) == (
        "waiting",
        generation,
        [["4g.40gb", 0], ["3g.40gb", 4]],
    )
    # The node's desired state now carries the new layout, at that generation.
    desired = desired_state_build(node=node, now=NOW)
    assert [(i.profile, i.start) for i in desired.gpus[0].instances] == [("4g.40gb", 0), ("3g.40gb", 4)]

    # 2. Not applied yet: the task keeps waiting and the GPU is nobody else's.
    other = fleet.submit("a", gpu_milli=100)
    run(fleet, minutes=1)
    task.refresh_from_db()
    other.refresh_from_db()
    assert (task.state, task.why_pending_code) == ("pending", "waiting_for_layout")
    assert other.state == "pending" and other.why_pending_code == "no_capacity"
    assert Repartition.objects.filter(gpu=gpu).count() == 1
    assert not gpu_partition_applied(gpu=gpu, generation=generation)

    # 3. The agent reports the layout applied; the next cycle binds the task to its new 3g.40gb.
    report_partition(node, gpu, generation=generation, seq=1)
    assert gpu_partition_applied(gpu=gpu, generation=generation)
    report = run(fleet, minutes=2)
    task.refresh_from_db()
    assert task.state == "assigned" and report.placed == 1
    assert [(u.mig_profile, u.mig_start) for u in units_held_by(task)] == [("3g.40gb", 4)]
    claim.refresh_from_db()
    assert claim.state == "bound" and claim.closed_at is not None
    assert violations(fleet.pool.pk) == []
    # The GPU is free again for everyone: the small task takes the 4g.40gb left over.
    run(fleet, minutes=3)
    other.refresh_from_db()
    assert other.state == "assigned"
    assert [(u.mig_profile, u.mig_start) for u in units_held_by(other)] == [("4g.40gb", 0)]
    assert violations(fleet.pool.pk) == []


def test_a_gpu_with_a_unit_in_use_is_never_recarved(fleet) -> None:
    node = fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G)
    gpu = Gpu.objects.get(node=node)
    fleet.tenant("a", guaranteed=7000)
    small = fleet.submit("a", gpu_milli=100)
    run(fleet)
    small.refresh_from_db()
    assert small.state == "assigned"
    before = layout_of(gpu)
    big = fleet.submit("a", gpu_milli=400, gpu_mem_mib=30_000)
    run(fleet, minutes=1)
    big.refresh_from_db()
    assert big.state == "pending" and big.why_pending_code != "waiting_for_layout"
    assert layout_of(gpu) == before
    assert not Repartition.objects.exists()


def recarved_for_a_3g_task(fleet: Any) -> tuple[Any, Gpu, Task, Repartition]:
    """A node whose one H100 is carved in seven 1g instances, and the claim a cycle made on it for a task
    that needs a 3g: (node, GPU, task, claim)."""
    node = fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G)
    gpu = Gpu.objects.get(node=node)
    fleet.tenant("a", guaranteed=7000)
    task = fleet.submit("a", gpu_milli=400, gpu_mem_mib=30_000)
    run(fleet)
    claim = Repartition.objects.get(task=task)
    return node, gpu, task, claim


def test_a_layout_the_agent_cannot_apply_gives_the_gpu_up_with_the_agents_reason(fleet) -> None:
    node, gpu, task, claim = recarved_for_a_3g_task(fleet)
    report_partition(node, gpu, state="blocked", generation=claim.generation, seq=1, reason="instance 3 busy")
    run(fleet, minutes=1)
    claim.refresh_from_db()
    assert claim.state == "abandoned"
    assert "could not repartition GPU 0 on eu-1/n001" in claim.reason and "instance 3 busy" in claim.reason
    # The GPU's layout is not what the plan says, so nothing is bound to it until the agent reports "ok".
    task.refresh_from_db()
    assert task.state == "pending" and task.why_pending_code == "no_capacity"
    report_partition(node, gpu, generation=claim.generation + 1, seq=2)
    run(fleet, minutes=2)
    task.refresh_from_db()
    assert task.state == "assigned"
    assert violations(fleet.pool.pk) == []


def test_a_gpu_reported_carved_otherwise_for_a_minute_gives_its_claim_up_before_the_timeout(fleet) -> None:
    node, gpu, task, claim = recarved_for_a_3g_task(fleet)
    assert claim.state == "waiting"
    # The agent says "ok" for the claim's generation, but the GPU still holds its seven 1g instances.
    report_partition(node, gpu, generation=claim.generation, seq=1, carved=SEVEN_1G)
    run(fleet, minutes=0.5)  # half a minute: maybe a long poll that raced the cycle; the task waits
    claim.refresh_from_db()
    task.refresh_from_db()
    assert claim.state == "waiting" and task.why_pending_code == "waiting_for_layout"
    run(fleet, minutes=1.5)  # the same report a minute and a half on: given up, long before 300 s
    claim.refresh_from_db()
    assert claim.state == "abandoned"
    assert "has reported GPU 0 on eu-1/n001 as " + "+".join(["1g.10gb"] * 7) in claim.reason
    assert f"(generation {claim.generation}), not " in claim.reason
    assert violations(fleet.pool.pk) == []


def test_a_cancelled_task_releases_its_gpu_and_an_unapplied_layout_times_out(fleet, settings) -> None:
    settings.WHALEGEN_REPARTITION_TIMEOUT_S = 60
    fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G)
    fleet.tenant("a", guaranteed=7000)
    cancelled = fleet.submit("a", gpu_milli=400, gpu_mem_mib=30_000)
    run(fleet)
    task_cancel(task=Task.objects.get(pk=cancelled.pk), by=None)
    run(fleet, minutes=1)
    first = Repartition.objects.get(task=cancelled)
    assert (first.state, first.reason) == ("abandoned", "the task is no longer pending")

    waiting = fleet.submit("a", gpu_milli=1000, gpu_mem_mib=70_000)
    run(fleet, minutes=2)  # 7g.80gb wanted: the 4g+3g layout is re-carved again
    claim = Repartition.objects.get(task=waiting)
    assert claim.state == "waiting" and claim.layout == [["7g.80gb", 0]]
    run(fleet, minutes=2 + 2)  # no report within 60 s
    claim.refresh_from_db()
    assert claim.state == "abandoned" and "within 60 s" in claim.reason
    # Given up, the task is planned afresh in that same cycle: the plane's layout is a free 7g.80gb now.
    waiting.refresh_from_db()
    assert waiting.state == "assigned"
    assert [u.mig_profile for u in units_held_by(waiting)] == ["7g.80gb"]


@pytest.mark.django_db(transaction=True)
def test_two_cycles_racing_to_recarve_one_gpu_make_one_claim(fleet, monkeypatch) -> None:
    """Without the advisory lock, both cycles plan the same idle GPU from the same snapshot; the node's
    version lets one re-carve it, the other skips with `lost_race`."""
    node = fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G)
    gpu = Gpu.objects.get(node=node)
    fleet.tenant("a", guaranteed=7000)
    task = fleet.submit("a", gpu_milli=400, gpu_mem_mib=30_000)
    results = _race(fleet.pool.pk, lock=False, meet_after_snapshot=True, monkeypatch=monkeypatch)
    assert all(r.status == "done" for r in results), results
    assert sorted(r.conflicts for r in results) == [0, 1]
    claim = Repartition.objects.get(task=task)
    assert claim.state == "waiting"
    assert layout_of(gpu) == [("3g.40gb", 4, None), ("4g.40gb", 0, None)]
    task.refresh_from_db()
    assert task.why_pending_code in ("waiting_for_layout", "lost_race")


def _gang_on_two_recarved_gpus(fleet) -> tuple[list[Any], list[Gpu], list[Task], dict[int, Repartition]]:
    """Two H100s of seven 1g each and a gang of two tasks that each want a 7g: a cycle re-carves both."""
    nodes = [fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G) for _ in range(2)]
    gpus = [Gpu.objects.get(node=node) for node in nodes]
    fleet.tenant("a", guaranteed=14_000)
    gang = [fleet.submit("a", gpu_milli=1000, gpu_mem_mib=70_000, gang_id="g", gang_size=2) for _ in range(2)]
    run(fleet)
    claims = {c.gpu_id: c for c in Repartition.objects.filter(task__in=gang)}
    assert set(claims) == {gpu.pk for gpu in gpus}
    assert {c.state for c in claims.values()} == {"waiting"}
    for gpu in gpus:
        assert layout_of(gpu) == [("7g.80gb", 0, None)]
    for task in gang:
        task.refresh_from_db()
        assert (task.state, task.why_pending_code) == ("pending", "waiting_for_layout")
    return nodes, gpus, gang, claims


def test_a_gang_is_recarved_for_and_binds_whole_once_every_new_layout_is_applied(fleet) -> None:
    # Before, a gang was never re-carved for: it waited `needs_layout_change` beside idle MIG GPUs for good.
    nodes, gpus, gang, claims = _gang_on_two_recarved_gpus(fleet)
    first = next(t for t in gang if claims[gpus[0].pk].task_id == t.pk)

    # One layout applied: its member keeps its instance and waits for the other.
    report_partition(nodes[0], gpus[0], generation=claims[gpus[0].pk].generation, seq=1)
    report = run(fleet, minutes=1)
    assert report.placed == 0
    for task in gang:
        task.refresh_from_db()
        assert (task.state, task.why_pending_code) == ("pending", "waiting_for_layout")
    first.refresh_from_db()
    assert "gang g binds once every member's new layout is applied" in first.why_pending

    # Both applied: the gang binds in one cycle, each member to its new 7g.
    report_partition(nodes[1], gpus[1], generation=claims[gpus[1].pk].generation, seq=1)
    report = run(fleet, minutes=2)
    assert report.placed == 2
    for task in gang:
        task.refresh_from_db()
        assert task.state == "assigned"
        assert [u.mig_profile for u in units_held_by(task)] == ["7g.80gb"]
    assert {c.state for c in Repartition.objects.filter(task__in=gang)} == {"bound"}
    assert violations(fleet.pool.pk) == []


def test_a_gang_member_whose_new_layout_fails_gives_its_mates_claim_up_too(fleet) -> None:
    nodes, gpus, gang, claims = _gang_on_two_recarved_gpus(fleet)
    report_partition(nodes[0], gpus[0], generation=claims[gpus[0].pk].generation, seq=1)
    report_partition(
        nodes[1], gpus[1], state="blocked", generation=claims[gpus[1].pk].generation, seq=1, reason="busy"
    )
    run(fleet, minutes=1)
    failed, mate = (Repartition.objects.get(pk=claims[gpu.pk].pk) for gpu in reversed(gpus))
    assert failed.state == "abandoned" and "could not repartition" in failed.reason
    # Its mate's GPU is applied, but the gang binds whole: that claim is given up in the same cycle, not
    # left holding the GPU until its own timeout.
    assert mate.state == "abandoned"
    assert "gang g: another member's new layout was given up" in mate.reason
    for task in gang:
        task.refresh_from_db()
        assert task.state == "pending"
    assert violations(fleet.pool.pk) == []


def test_a_gangs_new_layouts_are_written_together_or_not_at_all(fleet, monkeypatch) -> None:
    """One of the gang's two GPUs changes between the snapshot and the commit: its new layout is not
    written, and neither is the other, which would leave one member holding a GPU for a gang that cannot
    bind."""
    from apps.scheduling.snapshot import cycle as snapshot_cycle

    nodes = [fleet.node(model=H100, mode="mig", mig_layout=SEVEN_1G) for _ in range(2)]
    gpus = [Gpu.objects.get(node=node) for node in nodes]
    fleet.tenant("a", guaranteed=14_000)
    gang = [fleet.submit("a", gpu_milli=1000, gpu_mem_mib=70_000, gang_id="g", gang_size=2) for _ in range(2)]
    read = snapshot_cycle.snapshot_for_pool

    def snapshot_then_a_change(pool_id: int, now: Any) -> Any:
        snapshot = read(pool_id, now)
        Node.objects.filter(pk=nodes[1].pk).update(version=F("version") + 1)  # e.g. an agent's report
        return snapshot

    monkeypatch.setattr(snapshot_cycle, "snapshot_for_pool", snapshot_then_a_change)
    report = run(fleet)
    assert report.conflicts == 2
    assert not Repartition.objects.exists()
    for gpu in gpus:
        assert layout_of(gpu) == sorted((profile, start, None) for profile, start in SEVEN_1G)
    for task in gang:
        task.refresh_from_db()
        assert (task.state, task.why_pending_code) == ("pending", "lost_race")
    monkeypatch.setattr(snapshot_cycle, "snapshot_for_pool", read)
    run(fleet, minutes=1)  # nothing changed since: both GPUs are re-carved now
    assert Repartition.objects.filter(task__in=gang, state="waiting").count() == 2
    assert violations(fleet.pool.pk) == []


def test_a_gang_members_gpu_leaving_the_pool_gives_its_mates_claim_up(fleet) -> None:
    nodes, gpus, gang, claims = _gang_on_two_recarved_gpus(fleet)
    Node.objects.filter(pk=nodes[1].pk).update(pool=Pool.objects.create(name="elsewhere"))
    run(fleet, minutes=1)
    # Not held until its own claim times out: the gang cannot bind whole in this pool any more.
    mate = Repartition.objects.get(pk=claims[gpus[0].pk].pk)
    assert mate.state == "abandoned" and "its GPU left the pool" in mate.reason
    for task in gang:
        task.refresh_from_db()
        assert task.state == "pending"


def _task_on_two_recarved_gpus(fleet) -> tuple[Any, list[Gpu], Task, dict[int, Repartition]]:
    """One node of two H100s of seven 1g each and a task that wants a 7g on each: a cycle re-carves both
    GPUs and writes a claim on each for the task."""
    node = fleet.node(model=H100, gpus=2, mode="mig", mig_layout=SEVEN_1G)
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    fleet.tenant("a", guaranteed=14_000)
    task = fleet.submit("a", gpu_count=2, gpu_milli=1000, gpu_mem_mib=70_000)
    run(fleet)
    claims = {c.gpu_id: c for c in Repartition.objects.filter(task=task)}
    assert set(claims) == {gpu.pk for gpu in gpus}
    assert {c.state for c in claims.values()} == {"waiting"}
    for gpu in gpus:
        assert layout_of(gpu) == [("7g.80gb", 0, None)]
    task.refresh_from_db()
    assert (task.state, task.why_pending_code) == ("pending", "waiting_for_layout")
    assert "GPU 0 on eu-1/n001 is being repartitioned to 7g.80gb" in task.why_pending
    assert "GPU 1 on eu-1/n001 is being repartitioned to 7g.80gb" in task.why_pending
    return node, gpus, task, claims


def test_a_task_on_two_gpus_is_recarved_for_on_both_and_binds_once_both_are_applied(fleet) -> None:
    # Before, a task on several GPUs was never re-carved for: it waited `needs_layout_change` beside idle
    # MIG GPUs for good.
    node, gpus, task, claims = _task_on_two_recarved_gpus(fleet)

    # One layout applied: the task keeps both GPUs and waits for the other, saying which.
    report_partition(node, gpus[0], generation=claims[gpus[0].pk].generation, seq=1)
    report = run(fleet, minutes=1)
    task.refresh_from_db()
    assert report.placed == 0 and (task.state, task.why_pending_code) == ("pending", "waiting_for_layout")
    assert "GPU 1 on eu-1/n001" in task.why_pending

    # Both applied (the agent reports every GPU of its node): the task binds to both new 7g instances.
    report_partition(node, gpus[1], generation=claims[gpus[1].pk].generation, seq=2)
    report = run(fleet, minutes=2)
    task.refresh_from_db()
    assert report.placed == 1 and task.state == "assigned"
    held = sorted((u.gpu_id, u.mig_profile) for u in units_held_by(task))
    assert held == [(gpus[0].pk, "7g.80gb"), (gpus[1].pk, "7g.80gb")]
    assert {c.state for c in Repartition.objects.filter(task=task)} == {"bound"}
    assert violations(fleet.pool.pk) == []


def test_a_task_on_two_gpus_whose_layout_fails_on_one_gives_the_other_up_too(fleet) -> None:
    node, gpus, task, claims = _task_on_two_recarved_gpus(fleet)
    report_partition(node, gpus[0], generation=claims[gpus[0].pk].generation, seq=1)
    report_partition(
        node, gpus[1], state="blocked", generation=claims[gpus[1].pk].generation, seq=2, reason="busy"
    )
    run(fleet, minutes=1)
    kept, failed = (Repartition.objects.get(pk=claims[gpu.pk].pk) for gpu in gpus)
    assert failed.state == "abandoned" and "could not repartition" in failed.reason
    # GPU 0's layout is applied, but the task cannot run on one GPU: that claim is given up in the same
    # cycle, not left holding the GPU until its own timeout.
    assert kept.state == "abandoned" and "another of its new layouts was given up" in kept.reason
    task.refresh_from_db()
    assert task.state == "pending"
    assert violations(fleet.pool.pk) == []
