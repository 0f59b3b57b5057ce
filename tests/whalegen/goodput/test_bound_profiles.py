"""Compute- or bandwidth-bound from NVML telemetry (whalegen.forecast.profiles.classify_bound), and the
profile-aware choice and its reason coming out of the production decision (`decide`)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whalegen.forecast.profiles import BoundClass, classify_bound
from whalegen.placement.aware import reads_profiles, task_profile
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    NodeState,
    PartitionMode,
    RunningTask,
    TaskRequest,
)
from whalegen.scheduling import Code, Config, Decisions, Snapshot, decide

GIB = 1024


def test_a_busy_dram_whenever_kernels_run_is_bandwidth_bound() -> None:
    bound = classify_bound(10, 90.0, 81.0)
    assert bound.bound is BoundClass.BANDWIDTH
    assert bound.compute_exponent == pytest.approx(0.1)
    # Beside a copy of itself: demand 1.8 GPUs, factor 0.995 / 1.8^0.6 = 0.6993, so it loses 0.3007.
    assert bound.sensitivity == pytest.approx(1 - 0.995 / math.exp(0.6 * math.log(1.8)), abs=1e-4)
    assert bound.sensitivity == pytest.approx(0.3007, abs=1e-4)


@pytest.mark.parametrize(
    ("sm", "mem_ctrl", "exponent", "label"),
    [
        (80.0, 16.0, 0.8, BoundClass.COMPUTE),
        (50.0, 25.0, 0.5, BoundClass.BALANCED),
        (60.0, 24.0, 0.6, BoundClass.COMPUTE),  # the cut-offs belong to the classes
        (50.0, 30.0, 0.4, BoundClass.BANDWIDTH),
        (40.0, 55.0, 0.0, BoundClass.BANDWIDTH),  # DRAM busier than the SMs: clipped to 0
    ],
)
def test_the_exponent_is_one_minus_the_share_of_kernel_time_the_dram_is_busy(
    sm: float, mem_ctrl: float, exponent: float, label: BoundClass
) -> None:
    bound = classify_bound(5, sm, mem_ctrl)
    assert bound.compute_exponent == pytest.approx(exponent)
    assert bound.bound is label


@pytest.mark.parametrize(
    ("samples", "sm", "mem_ctrl"),
    [(2, 90.0, 80.0), (10, None, 80.0), (10, 90.0, None), (10, 3.0, 1.0)],
    ids=["too-few-samples", "no-sm-reading", "no-memory-reading", "host-bound-idle-gpu"],
)
def test_too_little_or_idle_telemetry_classifies_nothing(
    samples: int, sm: float | None, mem_ctrl: float | None
) -> None:
    bound = classify_bound(samples, sm, mem_ctrl)
    assert bound.bound is BoundClass.UNKNOWN
    assert bound.compute_exponent is None and bound.sensitivity is None
    assert task_profile(bound) is None  # the placement then treats it as `whalegen` does


@settings(deadline=None)  # a shared, loaded machine: the timing says nothing here
@given(
    sm=st.floats(5.0, 100.0),
    low=st.floats(0.0, 100.0),
    high=st.floats(0.0, 100.0),
)
def test_a_busier_dram_never_makes_a_task_more_compute_bound(sm: float, low: float, high: float) -> None:
    low, high = sorted((low, high))
    a_low = classify_bound(5, sm, low).compute_exponent
    a_high = classify_bound(5, sm, high).compute_exponent
    assert a_low is not None and a_high is not None
    assert 0.0 <= a_high <= a_low <= 1.0


def test_the_placement_reads_the_exponent_and_the_sm_utilisation() -> None:
    profile = task_profile(classify_bound(10, 90.0, 81.0))
    assert profile is not None
    assert profile.compute_exponent == pytest.approx(0.1)
    assert profile.sm_util_pct == 90.0
    assert profile.sla_min_factor is None


@pytest.mark.parametrize(
    ("policy", "reads"),
    [("whalegen-aware", True), ("whalegen-aware:floor=0.5", True), ("whalegen", False), ("fgd", False)],
)
def test_only_the_profile_aware_policy_makes_the_cycle_load_profiles(policy: str, reads: bool) -> None:
    assert reads_profiles(policy) is reads


def _node(name: str, model: str) -> NodeState:
    mem = 40 * GIB
    gpu = GpuState(0, model, WHOLE_GPU_MILLI, mem, mem, PartitionMode.WHOLE)
    return NodeState(name, 64_000, 64_000, 512 * GIB, 512 * GIB, (gpu,))


def _pending(task_id: str, sm: float, mem_ctrl: float) -> TaskRequest:
    return TaskRequest(
        task_id, 1000, GIB, 1, WHOLE_GPU_MILLI, profile=task_profile(classify_bound(10, sm, mem_ctrl))
    )


def test_decide_places_each_class_on_its_model_and_says_why() -> None:
    # H200: 67 FP32 TFLOPS, 4,800 GB/s; L40S: 91.6 TFLOPS, 864 GB/s. A bandwidth-bound task (a = 0.1) runs
    # (67/91.6)^0.1 × (4800/864)^0.9 = 4.50× faster on the H200; a compute-bound one (a = 0.9)
    # (91.6/67)^0.9 × (864/4800)^0.1 = 1.12× faster on the L40S.
    nodes = (_node("h200", "H200-141GB"), _node("l40s", "L40S"))
    pending = (_pending("bw", 90.0, 81.0), _pending("cb", 90.0, 9.0))
    snapshot = Snapshot(cluster=ClusterSnapshot(nodes, pending=pending), unit_exact=False)
    decisions = decide(snapshot, Config(policy="whalegen-aware", preemption=False), 0.0)
    where = {b.task_id: b.placement.node for b in decisions.placements}
    assert where == {"bw": "h200", "cb": "l40s"}
    reasons = decisions.placement_reasons
    bw_ratio = (67 / 91.6) ** 0.1 * (4800 / 864) ** 0.9
    cb_ratio = (91.6 / 67) ** 0.9 * (864 / 4800) ** 0.1
    # Each task's reason names the other model, whichever of the two the cycle placed first.
    assert reasons["bw"] in {
        f"H200-141GB chosen: {bw_ratio:.1f}× this task's L40S speed (bandwidth-bound, a = 0.10)",
        "H200-141GB chosen: the only model with room (bandwidth-bound, a = 0.10)",
    }
    assert reasons["cb"] in {
        f"L40S chosen: {cb_ratio:.1f}× this task's H200-141GB speed (compute-bound, a = 0.90)",
        "L40S chosen: the only model with room (compute-bound, a = 0.90)",
    }


def test_a_policy_that_gives_no_reasons_leaves_them_empty() -> None:
    nodes = (_node("h200", "H200-141GB"), _node("l40s", "L40S"))
    snapshot = Snapshot(
        cluster=ClusterSnapshot(nodes, pending=(_pending("bw", 90.0, 81.0),)), unit_exact=False
    )
    decisions = decide(snapshot, Config(policy="whalegen", preemption=False), 0.0)
    assert len(decisions.placements) == 1
    assert dict(decisions.placement_reasons) == {}


# -- a deferral is a wait, not a shortage: no victim on a model the task declines ----------------------


def _pool_with(victim_model: str) -> tuple[NodeState, ...]:
    """An L4 node (GPU 0 free, GPU 1 held by the preemptible `victim` when it is an L4) and an H100 node
    whose one GPU is held (by `victim` when it is an H100, else by work that cannot be preempted)."""
    mem = 40 * GIB
    l4_used = victim_model == "L4"
    l4 = NodeState(
        "l4",
        64_000,
        62_000 if l4_used else 64_000,
        512 * GIB,
        512 * GIB - (GIB if l4_used else 0),
        (
            GpuState(0, "L4", WHOLE_GPU_MILLI, mem, mem, PartitionMode.WHOLE),
            GpuState(
                1, "L4", 0 if l4_used else WHOLE_GPU_MILLI, 0 if l4_used else mem, mem, PartitionMode.WHOLE
            ),
        ),
    )
    h100 = NodeState(
        "h100",
        64_000,
        62_000,
        512 * GIB,
        511 * GIB,
        (GpuState(0, "H100-80GB", 0, 0, mem, PartitionMode.WHOLE),),
    )
    return (l4, h100)


def _running(victim_model: str) -> tuple[RunningTask, ...]:
    on_l4 = victim_model == "L4"
    victim = RunningTask(
        "victim",
        "l4" if on_l4 else "h100",
        (1 if on_l4 else 0,),
        WHOLE_GPU_MILLI,
        2000,
        GIB,
        preemptible=True,
    )
    keeper = RunningTask("keeper", "h100", (0,), WHOLE_GPU_MILLI, 2000, GIB, priority=9)
    return (victim,) if not on_l4 else (victim, keeper)


def _decide_urgent(victim_model: str, policy: str) -> Decisions:
    # A bandwidth-bound task (a = 0.1) runs at 0.33× V100 on an L4 and 3.7× on an H100: at under half its
    # pool-average speed on the free L4, so `whalegen-aware` defers it for up to 15 minutes.
    urgent = replace(_pending("urgent", 90.0, 81.0), priority=5, cpu_milli=2000)
    cluster = ClusterSnapshot(_pool_with(victim_model), pending=(urgent,), running=_running(victim_model))
    return decide(Snapshot(cluster=cluster, unit_exact=False), Config(policy=policy), 0.0)


def test_a_deferred_task_displaces_no_work_on_the_model_it_declines() -> None:
    decisions = _decide_urgent("L4", "whalegen-aware")
    assert decisions.placements == () and decisions.preemptions == ()
    reason = decisions.unplaced["urgent"]
    assert reason.code == Code.DEFERRED
    assert reason.message.startswith("deferred: the best unit with room (L4) runs it at")
    # The first version proposed the L4 victim, whose freed GPU the policy then declined again (the churn
    # of docs/notes/goodput-runs.md): still there behind the option.
    before = _decide_urgent("L4", "whalegen-aware:preempt_deferred=1")
    assert [p.victim_task_id for p in before.preemptions] == ["victim"]


def test_a_deferred_task_still_displaces_work_on_a_model_it_takes() -> None:
    decisions = _decide_urgent("H100-80GB", "whalegen-aware")
    assert [(p.victim_task_id, p.node) for p in decisions.preemptions] == [("victim", "h100")]
    assert decisions.unplaced["urgent"].code == "waiting_for_preemption"
