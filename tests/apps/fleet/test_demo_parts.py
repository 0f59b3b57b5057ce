"""The demo's pieces that are not the plane: the simulator spec it derives from the seeded fleet and the
workload generator's shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.fleet.demo import BUILTIN_SHAPES, WorkloadGenerator, sim_spec, trace_shapes

pytestmark = pytest.mark.django_db

TRACES = Path("/work/shared/traces")


def test_the_sim_spec_matches_the_seeded_nodes_gpu_for_gpu(fleet: Any) -> None:
    from agents.sim.spec import build_system

    spec = sim_spec([fleet.node, fleet.node_b])
    h100 = "h100-80gb-sxm"
    assert spec["nodes"] == [
        {"name": "gpu-001", "gpus": [{"sku": h100, "mig": "enabled"}, {"sku": h100, "mig": "disabled"}]},
        {"name": "l4-001", "gpus": [{"sku": "l40s", "mig": "disabled"}]},
    ]
    system = build_system(spec, "gpu-001")  # the simulator accepts it
    assert len(system.gpus) == 2


@pytest.mark.skipif(not (TRACES / "openb").is_dir(), reason="the openb trace is not on this machine")
def test_trace_shapes_are_the_openb_gpu_tasks() -> None:
    shapes = trace_shapes(TRACES)
    assert len(shapes) > 5000
    assert all(1 <= count <= 8 and 1 <= milli <= 1000 and life > 0 for count, milli, life in shapes)
    assert any(milli < 1000 for _, milli, _ in shapes) and any(count > 1 for count, _, _ in shapes)


def test_without_the_trace_the_generator_uses_built_in_shapes_and_submits(fleet: Any, tmp_path: Path) -> None:
    from apps.workloads.models import Task

    generator = WorkloadGenerator(tmp_path, interval_s=1, seed=3)
    assert generator.source.startswith("built-in")
    before = Task.objects.count()
    made = [generator.submit_one() for _ in range(6)]
    assert generator.submitted + generator.refused == 6
    assert Task.objects.count() == before + generator.submitted
    # The third submission is the idle one (a whole GPU held at 0 % SM, for the idle check to flag).
    idle = made[2]
    assert idle is not None and idle.name == "gen-idle-notebook" and idle.isolation == "exclusive"
    assert idle.command[1:3] == ["-m", "agents.sim.fake_cuda_app"] and "--sm-pct" in idle.command
    for task in filter(None, made[:2] + made[3:]):
        assert (task.gpu_count, task.gpu_milli) in {(c, m) for c, m, _ in BUILTIN_SHAPES}
        assert task.command[:2] == ["sh", "-c"] and task.state == "pending"
