"""whalegen-aware predicts an online service's factor on a MIG slice from what it observes (the slice's
share of the GPU's SMs against the service's observed SM utilisation) and keeps it off a slice predicted
below its SLA: on a bigger unit where one has room, else waiting with that reason."""

from __future__ import annotations

import pytest

from tests.whalegen.placement.builders import GIB, node, snapshot, task
from whalegen.placement.aware import AwarePolicy, predicted_slice_factor
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.types import (
    CycleResult,
    GpuState,
    NodeState,
    Outcome,
    PartitionMode,
    TaskProfile,
    TaskRequest,
)

A100 = "A100-40GB"


def _mig_node(name: str, layout: tuple[tuple[str, int], ...]) -> NodeState:
    """One A100-40GB in MIG mode, carved into `layout` (profile name, start slice), every instance free."""
    mem = 40 * GIB
    gpu = GpuState(0, A100, 1000, mem, mem, PartitionMode.MIG, mig_free_instances=layout)
    return NodeState(name, 64_000, 64_000, 512 * GIB, 512 * GIB, (gpu,))


def _whole_node(name: str) -> NodeState:
    return node(name, model=A100, gpus=1, cpu=64, mem_gib=512, gpu_mem_mib=40 * GIB, mode=PartitionMode.WHOLE)


def _service(util_pct: float | None, sla: float = 0.9, milli: int = 400) -> TaskRequest:
    profile = TaskProfile(compute_exponent=0.5, sm_util_pct=util_pct, sla_min_factor=sla)
    return task("svc", gpus=1, milli=milli, priority=10, sla_online=True, profile=profile)


REFUSE = "whalegen-aware:slice_sla=refuse"


def _solve(
    nodes: tuple[NodeState, ...], util_pct: float | None, policy: str = "whalegen-aware"
) -> tuple[Engine, CycleResult]:
    engine = Engine(snapshot(nodes), EngineConfig(policy=policy))
    return engine, engine.solve((_service(util_pct),), 0.0)


@pytest.mark.parametrize(
    ("util_pct", "share", "want"),
    [
        pytest.param(60.0, 3 / 7, 3 / 7 / 0.6, id="a service at 60 pct on a 3g slice gets 0.71 of its speed"),
        pytest.param(40.0, 3 / 7, 1.0, id="a service at 40 pct fits a 3g slice whole"),
        pytest.param(100.0, 1 / 7, 1 / 7, id="a saturating service on a 1g slice gets a seventh"),
        pytest.param(0.0, 1 / 7, 1.0, id="an idle service is not slowed"),
    ],
)
def test_predicted_slice_factor_is_the_slice_share_over_the_observed_utilisation(
    util_pct: float, share: float, want: float
) -> None:
    assert predicted_slice_factor(util_pct, share) == pytest.approx(want)


@pytest.mark.parametrize("policy", ["whalegen-aware", REFUSE])
def test_a_service_whose_observed_demand_exceeds_the_slice_takes_a_bigger_unit(policy: str) -> None:
    # A 3g.20gb slice is 3/7 = 43 % of the SMs; the service is observed at 70 %: 0.61× < its SLA 0.90.
    # The policy ranks an isolated MIG instance first for a service, so without the prediction it would
    # take the slice.
    mig = _mig_node("mig", (("3g.20gb", 0), ("4g.20gb", 4)))
    engine, result = _solve((mig, _whole_node("whole")), 70.0, policy)
    [placement] = result.placements
    assert placement.node == "whole"
    policy = engine.policy
    assert isinstance(policy, AwarePolicy)
    assert "mig" not in policy.reasons["svc"]


def test_a_service_that_fits_the_slice_takes_it() -> None:
    # The same two nodes; observed at 30 %, the 3g slice (43 %) gives it all it asks: the isolated unit.
    mig = _mig_node("mig", (("3g.20gb", 0), ("4g.20gb", 4)))
    engine, result = _solve((mig, _whole_node("whole")), 30.0)
    [placement] = result.placements
    assert placement.node == "mig"
    policy = engine.policy
    assert isinstance(policy, AwarePolicy)
    assert "MIG 3g.20gb: predicted 1.00× at its observed 30 % SM utilisation" in policy.reasons["svc"]


def test_the_slice_judged_is_the_one_bound_not_the_smallest_that_covers_the_request() -> None:
    # Only a 4g.20gb (4/7 = 57 %) is free: a service at 55 % fits it, though the 3g a 400-milli request
    # maps to (43 %) would not hold it.
    mig = _mig_node("mig", (("4g.20gb", 0),))
    _, result = _solve((mig,), 55.0)
    [placement] = result.placements
    assert placement.node == "mig"


def test_with_refuse_a_service_no_slice_can_hold_waits_and_its_why_pending_says_so() -> None:
    mig = _mig_node("mig", (("3g.20gb", 0), ("4g.20gb", 4)))
    _, result = _solve((mig,), 90.0, REFUSE)
    assert result.placements == ()
    assert result.preemptions == ()
    [unplaced] = result.unplaced
    assert unplaced.outcome is Outcome.SLA_REFUSED
    assert "mig GPU 0 refused: a MIG 3g.20gb gives 43 % of the GPU's SMs" in unplaced.message
    assert "svc is observed at 90 %: predicted 0.48×, below its SLA 0.90" in unplaced.message


def test_by_default_a_service_no_slice_can_hold_takes_one_and_its_reason_says_so() -> None:
    # Waiting breaks its SLA too (a waiting service serves nothing), so the default takes the slice when
    # no unit that keeps the SLA has room, and says so.
    mig = _mig_node("mig", (("3g.20gb", 0), ("4g.20gb", 4)))
    engine, result = _solve((mig,), 90.0)
    [placement] = result.placements
    assert placement.node == "mig"
    policy = engine.policy
    assert isinstance(policy, AwarePolicy)
    assert "svc is observed at 90 %: predicted 0.48×, below its SLA 0.90" in policy.reasons["svc"]
    assert "no unit that keeps its SLA has room" in policy.reasons["svc"]


def test_the_policy_option_is_avoid_or_refuse() -> None:
    with pytest.raises(ValueError, match="slice_sla is avoid or refuse"):
        AwarePolicy(slice_sla="sometimes")


def test_a_service_never_observed_counts_as_saturating_and_stays_off_a_small_slice() -> None:
    mig = _mig_node("mig", (("3g.20gb", 0), ("4g.20gb", 4)))
    _, result = _solve((mig,), None, REFUSE)
    [unplaced] = result.unplaced
    assert unplaced.outcome is Outcome.SLA_REFUSED
    assert "observed at 100 %" in unplaced.message


def test_batch_work_is_not_judged_by_the_service_rule() -> None:
    # A batch job at 90 % goes on the slice (its slowdown is in its speed, not an SLA); it has waited past
    # the policy's deferral for a faster unit (900 s), which a slice of 3/7 would otherwise trigger.
    mig = _mig_node("mig", (("3g.20gb", 0), ("4g.20gb", 4)))
    engine = Engine(snapshot((mig,)), EngineConfig(policy="whalegen-aware"))
    job = task("bj", gpus=1, milli=400, profile=TaskProfile(compute_exponent=0.5, sm_util_pct=90.0))
    [placement] = engine.solve((job,), 1000.0).placements
    assert placement.node == "mig"
