"""Re-carving is a last resort, on PostgreSQL: a cycle places every task a present unit (whole GPU, share,
free MIG instance) can hold first, and re-carves an idle MIG GPU only for the tasks none of them holds."""

from __future__ import annotations

from typing import Any

from apps.inventory.models import ComputeUnit, Gpu
from apps.scheduling.models import Repartition
from apps.scheduling.services import cycle_run
from tests.apps.factories import units_held_by
from tests.apps.scheduling.conftest import NOW, run
from tests.apps.scheduling.invariants import violations

H100 = "H100-80GB"
ONE_3G = [("3g.40gb", 0)]


def held(task: Any) -> list[tuple[str, int, str, str]]:
    """(node, GPU index, unit kind, MIG profile) of each unit the task holds."""
    return sorted(
        (u.gpu.node.name, u.gpu.index, u.kind, u.mig_profile)
        for u in ComputeUnit.objects.filter(pk__in=[u.pk for u in units_held_by(task)]).select_related(
            "gpu__node"
        )
    )


def test_a_free_whole_gpu_goes_to_the_first_task_and_the_idle_mig_gpu_is_recarved_for_the_next(world) -> None:
    """The shared world: GPU 0 of gpu-001 is MIG (an idle 3g.40gb@0), GPU 1 whole; A's whole-GPU task
    (queue priority 5) and B's are pending. A takes the whole GPU now; B, which no present unit holds,
    gets GPU 0 re-carved to a 7g.80gb and waits for the agent to apply it."""
    report = cycle_run(pool_id=world.h100.pk, now=NOW)
    world.task_a.refresh_from_db()
    world.task_b.refresh_from_db()
    assert report.placed == 1
    assert world.task_a.state == "assigned"
    assert held(world.task_a) == [("gpu-001", 1, "whole", "")]
    assert (world.task_b.state, world.task_b.why_pending_code) == ("pending", "waiting_for_layout")
    assert "GPU 0 on eu-1/gpu-001 is being repartitioned to 7g.80gb" in world.task_b.why_pending
    claim = Repartition.objects.get(task=world.task_b)
    assert (claim.gpu.index, claim.state, claim.layout) == (0, "waiting", [["7g.80gb", 0]])
    assert violations(world.h100.pk) == []


def test_a_task_only_a_recarve_can_hold_still_gets_one(fleet) -> None:
    fleet.node(model=H100, mode="mig", mig_layout=ONE_3G)
    fleet.node(model=H100)
    fleet.tenant("a", guaranteed=4000)
    first = fleet.submit("a")
    run(fleet)
    first.refresh_from_db()
    # The whole GPU holds the first task now: the idle MIG GPU is left as it is.
    assert first.state == "assigned" and held(first) == [("n002", 0, "whole", "")]
    assert not Repartition.objects.exists()
    assert [u.mig_profile for u in ComputeUnit.objects.filter(gpu__node__name="n001")] == ["3g.40gb"]

    # The second whole-GPU task fits no present unit: the idle MIG GPU is re-carved for it.
    second = fleet.submit("a")
    run(fleet, minutes=1)
    second.refresh_from_db()
    assert (second.state, second.why_pending_code) == ("pending", "waiting_for_layout")
    claim = Repartition.objects.get(task=second)
    assert (claim.gpu.node.name, claim.layout) == ("n001", [["7g.80gb", 0]])
    assert violations(fleet.pool.pk) == []


def test_a_free_mig_instance_that_fits_is_used_as_it_is(fleet) -> None:
    mig_node = fleet.node(model=H100, mode="mig", mig_layout=ONE_3G)
    fleet.node(model=H100)
    fleet.tenant("a", guaranteed=4000, borrow=2000)
    fleet.tenant("b", guaranteed=2000)
    busy = fleet.submit("a", preemptible=False)
    run(fleet)
    busy.refresh_from_db()
    assert held(busy) == [("n002", 0, "whole", "")]
    # B's whole-GPU task first (higher priority), then a 300-milli task that the free 3g.40gb holds.
    whole = fleet.submit("b", priority=9)
    small = fleet.submit("a", gpu_milli=300, gpu_mem_mib=20_000)
    run(fleet, minutes=1)
    small.refresh_from_db()
    whole.refresh_from_db()
    # The small task binds to the instance the GPU has; the GPU is not re-carved under it.
    assert small.state == "assigned" and held(small) == [("n001", 0, "mig", "3g.40gb")]
    assert (whole.state, whole.why_pending_code) == ("pending", "no_capacity")
    assert not Repartition.objects.exists()
    gpu = Gpu.objects.get(node=mig_node)
    assert [(u.mig_profile, u.mig_start) for u in ComputeUnit.objects.filter(gpu=gpu)] == [("3g.40gb", 0)]
    assert violations(fleet.pool.pk) == []
