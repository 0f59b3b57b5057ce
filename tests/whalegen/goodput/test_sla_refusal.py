"""A co-location refused for an online task's SLA is its own outcome in the engine (`Outcome.SLA_REFUSED`):
no victims by resources on the refused GPUs; the batch neighbours whose leaving honours the SLA are
proposed instead, with the reason."""

from __future__ import annotations

from whalegen.placement.aware import AwarePolicy
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    NodeState,
    Outcome,
    PartitionMode,
    RunningTask,
    TaskProfile,
    TaskRequest,
)

GIB = 1024
BUSY = TaskProfile(compute_exponent=0.5, sm_util_pct=100.0)
SERVICE = TaskProfile(compute_exponent=0.5, sm_util_pct=30.0, sla_min_factor=0.9)


def _node(name: str, mode: PartitionMode = PartitionMode.SHARED) -> NodeState:
    mem = 80 * GIB
    gpu = GpuState(0, "A100-80GB", WHOLE_GPU_MILLI, mem, mem, mode)
    return NodeState(name, 64_000, 64_000, 512 * GIB, 512 * GIB, (gpu,))


def _job(task_id: str, milli: int, preemptible: bool) -> TaskRequest:
    return TaskRequest(
        task_id, 1000, GIB, 1, milli, priority=0 if preemptible else 1, preemptible=preemptible, profile=BUSY
    )


def _service(task_id: str = "svc", profile: TaskProfile = SERVICE) -> TaskRequest:
    return TaskRequest(task_id, 1000, GIB, 1, 400, priority=10, sla_online=True, profile=profile)


def _engine(nodes: tuple[NodeState, ...], jobs: list[TaskRequest], policy: str = "whalegen-aware") -> Engine:
    engine = Engine(ClusterSnapshot(nodes), EngineConfig(policy=policy))
    for job in jobs:
        assert engine.solve((job,), 0.0).placements
    return engine


def test_a_service_refused_beside_a_preemptible_batch_job_preempts_that_job_with_the_reason() -> None:
    engine = _engine((_node("n1"),), [_job("bj", 500, preemptible=True)])
    result = engine.solve((_service(),), 600.0)
    assert result.placements == ()
    [preemption] = result.preemptions
    assert (preemption.victim_task_id, preemption.node, preemption.for_task_id) == ("bj", "n1", "svc")
    assert "so that the co-location keeps the SLA" in preemption.reason
    assert "below svc's SLA 0.90" in preemption.reason
    [unplaced] = result.unplaced
    assert unplaced.outcome is Outcome.WAITING_FOR_PREEMPTION and "refused" in unplaced.message
    # Once the victim leaves, the service takes the GPU.
    engine.release("bj")
    assert [p.task_id for p in engine.solve((_service(),), 660.0).placements] == ["svc"]


def test_no_victims_where_the_refusal_stays_after_they_leave() -> None:
    # The GPU has room (400 of 1000 milli free) beside a busy job nobody may preempt and a preemptible
    # one. Preempting the preemptible one alone leaves the busy one there, so the co-location still
    # breaks the SLA: the engine proposes nothing, and says why (not "no capacity"). The batch floor is
    # lowered to 0.6 so that the two busy jobs share the GPU at all (predicted 0.66× each).
    engine = _engine(
        (_node("n1"),),
        [_job("keep", 300, preemptible=False), _job("bj", 300, preemptible=True)],
        policy="whalegen-aware:floor=0.6",
    )
    result = engine.solve((_service(),), 600.0)
    assert result.preemptions == ()
    [unplaced] = result.unplaced
    assert unplaced.outcome is Outcome.SLA_REFUSED
    assert "n1 GPU 0 refused: sharing it predicts" in unplaced.message


def test_victims_by_resources_are_still_proposed_on_nodes_where_nothing_was_refused() -> None:
    # n1: a shared GPU refused for the SLA (its busy job is not preemptible); n2: a whole GPU held by a
    # preemptible job. Freeing n2 gives the service an unshared GPU, which keeps its SLA.
    engine = _engine(
        (_node("n1"), _node("n2", PartitionMode.WHOLE)),
        [_job("keep", 500, preemptible=False), _job("bj", WHOLE_GPU_MILLI, preemptible=True)],
    )
    assert engine.state.names[engine.state.bindings["bj"].node] == "n2"
    result = engine.solve((_service(),), 600.0)
    assert [(p.victim_task_id, p.node) for p in result.preemptions] == [("bj", "n2")]


def test_a_policy_without_profiles_keeps_the_no_capacity_outcome() -> None:
    nodes = (_node("n1"),)
    engine = Engine(ClusterSnapshot(nodes), EngineConfig(policy="whalegen"))
    engine.solve((_job("bj", 800, preemptible=True),), 0.0)
    result = engine.solve((_service(),), 600.0)
    assert {u.outcome for u in result.unplaced} == {Outcome.WAITING_FOR_PREEMPTION}
    assert engine.policy.sla_refusal("svc") is None


def test_a_fresh_engine_reads_its_running_neighbours_profiles_from_the_snapshot() -> None:
    # Production builds one engine per cycle: the neighbour's profile comes with the running task. A
    # quiet neighbour (10 % SM) admits a service at SLA 0.85 (99 in 100 measured pairs near (30 %, 10 %)
    # keep 0.87; none keeps 0.90, so a 0.90 service is refused beside anything); unknown, the neighbour
    # counts as busy and the GPU is refused.
    service = _service(profile=TaskProfile(compute_exponent=0.5, sm_util_pct=30.0, sla_min_factor=0.85))
    node = _node("n1")
    busy_gpu = GpuState(0, "A100-80GB", 500, 80 * GIB - 4 * GIB, 80 * GIB, PartitionMode.SHARED)
    held = NodeState("n1", 64_000, 63_000, 512 * GIB, 511 * GIB, (busy_gpu,))
    assert node.gpus[0].free_milli == WHOLE_GPU_MILLI

    def cycle(profile: TaskProfile | None) -> Engine:
        running = RunningTask("bj", "n1", (0,), 500, 1000, GIB, gpu_mem_mib=4 * GIB, profile=profile)
        snapshot = ClusterSnapshot((held,), pending=(service,), running=(running,))
        engine = Engine(snapshot, EngineConfig(policy="whalegen-aware", preemption=False))
        engine.solve(snapshot.pending, 0.0)
        return engine

    quiet = cycle(TaskProfile(compute_exponent=0.5, sm_util_pct=10.0))
    assert "svc" in quiet.state.bindings
    unknown = cycle(None)
    assert "svc" not in unknown.state.bindings
    policy = unknown.policy
    assert isinstance(policy, AwarePolicy)
    refusal = policy.sla_refusal("svc")
    assert refusal is not None and refusal.refused_nodes == frozenset({"n1"})
