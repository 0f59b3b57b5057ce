"""An online service's SLA is checked against the low quantile of the measured pairs near it, not the
median rule (whalegen.forecast.interference, "co-location risk"; issue #41 item 4)."""

from __future__ import annotations

import pytest

from whalegen.forecast.interference import (
    LOW_FACTOR_QUANTILE,
    LUCID_LOW_FACTOR,
    fit_low_factor_table,
    utilisation_factor,
    utilisation_low_factor,
)
from whalegen.goodput.data import LucidPair, LucidSolo
from whalegen.goodput.interference import lucid_observations
from whalegen.placement.aware import AwarePolicy
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    NodeState,
    PartitionMode,
    TaskProfile,
    TaskRequest,
)

GIB = 1024


def test_the_committed_table_is_the_fit_of_lucids_measured_pairs(
    lucid_single: tuple[LucidSolo, ...], lucid_pairs: tuple[LucidPair, ...]
) -> None:
    observations = lucid_observations(lucid_single, lucid_pairs)
    points = [(a.gpu_util_pct, b.gpu_util_pct, f) for a, b, f in observations]
    assert fit_low_factor_table(points) == LUCID_LOW_FACTOR
    # What the table is for: where the median rule promises ≥ 0.99, more than one in a hundred of the
    # measured pairs near (35 %, 30 %) ran below 0.90, and the table says so.
    near = [f for own, other, f in points if 20 <= own < 40 and 20 <= other < 40]
    assert utilisation_factor(35.0, 30.0) >= 0.99
    assert sum(f < 0.9 for f in near) / len(near) >= LOW_FACTOR_QUANTILE
    assert utilisation_low_factor(35.0, 30.0) < 0.9


def test_the_fit_by_hand() -> None:
    # Ten sides in the (0–20 %, 0–20 %) cell: the nearest-rank 1st percentile is the lowest; one side in
    # (20–40 %, 0–20 %); every other cell of a row takes the cell before it (more demand never helps).
    points = [(10.0, 10.0, 0.5 + i / 20) for i in range(10)] + [(30.0, 5.0, 1.2)]
    table = fit_low_factor_table(points)
    assert table[0] == (0.5, 0.5, 0.5, 0.5, 0.5)
    assert table[1] == (1.0, 1.0, 1.0, 1.0, 1.0)  # a measured speed-up counts as 1
    assert table[2] == (1.0,) * 5  # no measurement at all: no slowdown known


def test_the_low_factor_never_promises_more_than_the_median_rule() -> None:
    for own in range(0, 121, 5):
        for other in range(0, 301, 10):
            assert utilisation_low_factor(own, other) <= utilisation_factor(own, other)


def _shared_node(name: str) -> NodeState:
    mem = 80 * GIB
    gpu = GpuState(0, "A100-80GB", WHOLE_GPU_MILLI, mem, mem, PartitionMode.SHARED)
    return NodeState(name, 64_000, 64_000, 512 * GIB, 512 * GIB, (gpu,))


def test_a_service_is_kept_off_a_gpu_whose_measured_pairs_break_its_sla_though_the_median_keeps_it() -> None:
    batch = TaskRequest("batch", 1000, GIB, 1, 300, profile=TaskProfile(0.5, 30.0))
    service = TaskRequest("svc", 1000, GIB, 1, 400, profile=TaskProfile(0.5, 35.0, 0.9), sla_online=True)
    engine = Engine(
        ClusterSnapshot((_shared_node("n"),)), EngineConfig(policy="whalegen-aware", preemption=False)
    )
    assert [p.task_id for p in engine.solve((batch,), 0.0).placements] == ["batch"]
    assert engine.solve((service,), 0.0).placements == ()
    policy = engine.policy
    assert isinstance(policy, AwarePolicy)
    assert (
        "sharing it predicts 0.81× in 99 of 100 measured pairs for svc, below svc's SLA 0.90"
        in (policy.refusals["svc"])
    )
    # A quiet service with a looser SLA beside the same neighbour keeps it in 99 of 100 measured pairs.
    quiet = TaskRequest("quiet", 1000, GIB, 1, 200, profile=TaskProfile(0.5, 10.0, 0.85), sla_online=True)
    assert [p.task_id for p in engine.solve((quiet,), 0.0).placements] == ["quiet"]


@pytest.mark.parametrize("sla", [0.9, 0.95])
def test_a_batch_task_never_joins_a_service_whose_sla_the_measured_pairs_break(sla: float) -> None:
    service = TaskRequest("svc", 1000, GIB, 1, 400, profile=TaskProfile(0.5, 35.0, sla), sla_online=True)
    batch = TaskRequest("batch", 1000, GIB, 1, 300, profile=TaskProfile(0.5, 30.0))
    engine = Engine(
        ClusterSnapshot((_shared_node("n"),)), EngineConfig(policy="whalegen-aware", preemption=False)
    )
    assert [p.task_id for p in engine.solve((service,), 0.0).placements] == ["svc"]
    assert engine.solve((batch,), 0.0).placements == ()
