"""The dashboard's words for an SLA refusal fit both refusals whalegen-aware makes under that one code,
`sla_refused`: a co-location on a shared GPU, and a MIG slice too small for what the service is observed
to use (`slice_sla=refuse`: "a MIG 3g.20gb gives 43 % of the GPU's SMs and svc is observed at 90 %:
predicted 0.48×, below its SLA 0.90"). Before, the label spoke only of sharing a GPU, which a service
refused a MIG slice of its own never does."""

from __future__ import annotations

from typing import Any

import pytest

from apps.dashboard.words import reason_label
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    NodeState,
    Outcome,
    PartitionMode,
    TaskProfile,
    TaskRequest,
)

GIB = 1024


def _service(util_pct: float) -> TaskRequest:
    profile = TaskProfile(compute_exponent=0.5, sm_util_pct=util_pct, sla_min_factor=0.9)
    return TaskRequest("svc", 1000, GIB, 1, 400, priority=10, sla_online=True, profile=profile)


def _busy_job() -> TaskRequest:
    profile = TaskProfile(compute_exponent=0.5, sm_util_pct=100.0)
    return TaskRequest("busy", 1000, GIB, 1, 300, priority=1, preemptible=False, profile=profile)


def _node(gpu: GpuState) -> NodeState:
    return NodeState("n1", 64_000, 64_000, 512 * GIB, 512 * GIB, (gpu,))


def _mig_refusal() -> tuple[str, str]:
    layout = (("3g.20gb", 0), ("4g.20gb", 4))
    gpu = GpuState(0, "A100-40GB", 1000, 40 * GIB, 40 * GIB, PartitionMode.MIG, mig_free_instances=layout)
    engine = Engine(ClusterSnapshot((_node(gpu),)), EngineConfig(policy="whalegen-aware:slice_sla=refuse"))
    [unplaced] = engine.solve((_service(90.0),), 0.0).unplaced
    return unplaced.outcome, unplaced.message


def _shared_refusal() -> tuple[str, str]:
    gpu = GpuState(0, "A100-80GB", WHOLE_GPU_MILLI, 80 * GIB, 80 * GIB, PartitionMode.SHARED)
    engine = Engine(ClusterSnapshot((_node(gpu),)), EngineConfig(policy="whalegen-aware"))
    assert engine.solve((_busy_job(),), 0.0).placements
    [unplaced] = engine.solve((_service(30.0),), 600.0).unplaced
    return unplaced.outcome, unplaced.message


@pytest.mark.parametrize(
    ("refusal", "sentence", "words"),
    [
        pytest.param(_mig_refusal, "a MIG 3g.20gb gives 43 % of the GPU's SMs", "MIG slice", id="a slice"),
        pytest.param(_shared_refusal, "refused: sharing it predicts", "shared GPU", id="a shared GPU"),
    ],
)
def test_each_sla_refusal_reads_as_words_that_name_its_cause(refusal: Any, sentence: str, words: str) -> None:
    code, message = refusal()
    assert code == Outcome.SLA_REFUSED and sentence in message  # the engine's refusal, as the cycle stores it
    label = reason_label(code)
    assert words in label
    assert "_" not in label


@pytest.mark.django_db
def test_the_overview_shows_a_pending_slice_refusal_in_words(scene: Any, page: Any) -> None:
    from apps.workloads.models import TaskWait

    code, message = _mig_refusal()
    TaskWait.objects.filter(task=scene.waiting).update(code=code, why=message)
    html = page(scene.world.root).get("/").content.decode()
    assert "1 no unit with room keeps an online SLA (a shared GPU, or too small a MIG slice)" in html
    assert "sla_refused" not in html
