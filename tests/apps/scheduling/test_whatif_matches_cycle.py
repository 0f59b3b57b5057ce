"""The what-if decides on the cycle's own input (`apps.scheduling.snapshot.cycle_input`): with a
profile-aware policy and pre-carving on, what it says the policy would do is what the next cycle commits —
the same tasks on the same units, the same idle MIG GPU re-carved to the same layout, the same reasons."""

from __future__ import annotations

from typing import Any

import pytest

from apps.forecasting.services import profiles_refresh
from apps.inventory.models import ComputeUnit, Gpu
from apps.scheduling.models import Assignment, Repartition
from apps.workloads.models import Task
from tests.apps.scheduling.conftest import NOW, Fleet, run
from tests.apps.scheduling.test_precarve import _active_arrivals_model, _history
from tests.apps.scheduling.test_profile_cycle import seed_history

AWARE = "whalegen-aware"


def _scene(fleet: Fleet) -> None:
    """Two whole-GPU models a profile tells apart (a compute-bound key, a bandwidth-bound key), an idle MIG
    H100 with one 7g instance, and an arrivals model that expects small MIG tasks (docs/scheduling.md §3b)."""
    h200 = fleet.node(model="H200-141GB", name="h200-01")
    l40s = fleet.node(model="L40S", name="l40s-01")
    fleet.node(model="H100-80GB", mode="mig", mig_layout=[("7g.80gb", 0)], name="mig-01")
    tenant = fleet.tenant("t", guaranteed=8_000)
    seed_history(tenant=tenant, gpu=l40s.gpus.get(), key="decode", sm_pct=90, mem_ctrl_pct=81, until=NOW)
    seed_history(tenant=tenant, gpu=h200.gpus.get(), key="gemm", sm_pct=90, mem_ctrl_pct=9, until=NOW)
    profiles_refresh(now=NOW)
    _history(fleet)
    _active_arrivals_model(fleet, tv_distance=0.1)
    # Kept off the MIG GPU, so that it stays idle for pre-carving.
    whole = ["H200-141GB", "L40S"]
    fleet.submit("t", name="gemm", profile_key="gemm", allowed_gpu_models=whole)
    fleet.submit("t", name="decode", profile_key="decode", allowed_gpu_models=whole)
    # No room left for a third: it waits, with a reason.
    fleet.submit("t", name="late", allowed_gpu_models=whole)


@pytest.mark.django_db
def test_the_what_if_of_a_profile_aware_policy_with_precarving_decides_what_the_cycle_commits(
    fleet: Fleet, settings: Any
) -> None:
    from apps.scheduling.whatif import pool_whatif

    settings.WHALEGEN_PRECARVE = True
    settings.WHALEGEN_CYCLE_POLICY = AWARE
    _scene(fleet)
    [ours] = pool_whatif(pool_name=fleet.pool.name, policies=[AWARE], now=NOW).runs
    decided = ours.decisions
    # The scene exercises both inputs the what-if once lacked: profiles and the arrivals forecast.
    assert {b.task_id for b in decided.placements} == {
        str(pk) for pk in Task.objects.filter(name__in=["gemm", "decode"]).values_list("pk", flat=True)
    }
    assert len(decided.precarves) == 1

    report = run(fleet, policy=AWARE)

    bound = {
        str(a.task_id): tuple(sorted(a.unit_ids)) for a in Assignment.objects.filter(cycle_id=report.cycle_id)
    }
    assert bound == {b.task_id: tuple(sorted(b.unit_ids)) for b in decided.placements}
    [ahead] = Repartition.objects.filter(cycle_id=report.cycle_id, state=Repartition.State.AHEAD)
    [proposal] = decided.precarves
    gpu = Gpu.objects.get(pk=ahead.gpu_id)
    assert (gpu.node.name, gpu.index) == (proposal.gpu[0].split("/")[-1], proposal.gpu[1])
    assert ahead.layout == [[slot.mig_profile, slot.mig_start] for slot in proposal.plan.layout]
    assert ComputeUnit.objects.filter(gpu=gpu).count() == len(proposal.plan.layout)
    assert ahead.reason == proposal.reason[:500]
    waiting = {str(t.pk): t.why_pending_code for t in Task.objects.filter(state=Task.State.PENDING)}
    assert waiting == {t: r.code for t, r in decided.unplaced.items()}
