"""A host with GPUs of two models (compose's example host: 2×H100 + an L40S) takes work on its most
common model's GPUs. Before, the whole node was left out of every cycle, so a freshly joined mixed host
never ran anything ("no schedulable node has a schedulable node")."""

from __future__ import annotations

from apps.inventory.services import gpu_add
from apps.scheduling.models import Cycle
from tests.apps.scheduling.conftest import Fleet, run


def test_a_mixed_host_runs_work_on_its_most_common_models_gpus(fleet: Fleet) -> None:
    host = fleet.node(model="H100-80GB", gpus=2)
    gpu_add(node=host, index=2, model="L40S")
    fleet.tenant("a", guaranteed=3000)
    on_h100 = [fleet.submit("a", gpu_count=1) for _ in range(2)]
    on_l40s = fleet.submit("a", gpu_count=1, allowed_gpu_models=["L40S"])

    report = run(fleet)
    assert report.placed == 2
    for task in on_h100:
        task.refresh_from_db()
        assert task.state == "assigned"
        assert task.assignments.get().node_id == host.pk
    on_l40s.refresh_from_db()
    assert on_l40s.state == "pending"  # the node offers its H100s; its one L40S waits for mixed nodes
    assert "no schedulable node has a L40S GPU" in on_l40s.why_pending
    assert Cycle.objects.get(pk=report.cycle_id).stats["nodes_excluded"] == {}
