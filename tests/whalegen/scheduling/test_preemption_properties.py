"""Preemption over decisions in a row, on random small pools (issue #41): victims are only stopped for a
task their leaving makes room for, in every resource, and that room is still there at the next cycle;
no task is stopped twice for the same task."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.whalegen.scheduling.cycles import Cycles
from whalegen.placement.types import GpuState, NodeState, PartitionMode, TaskRequest
from whalegen.scheduling import Config

MODELS = ("T4", "V100M32")
POLICIES = ("whalegen", "bestfit", "fgd", "k8s-default")


@st.composite
def pools(draw: st.DrawFn) -> tuple[NodeState, ...]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(MODELS))
        gpus = tuple(
            GpuState(d, model, 1000, 16_384, 16_384, PartitionMode.SHARED)
            for d in range(draw(st.integers(1, 4)))
        )
        cpu = draw(st.integers(2, 16)) * 1000
        mem = draw(st.integers(4, 64)) * 1024
        out.append(NodeState(f"n{i}", cpu, cpu, mem, mem, gpus))
    return tuple(out)


@st.composite
def work(draw: st.DrawFn, prefix: str, priorities: tuple[int, ...]) -> list[TaskRequest]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        num_gpu = draw(st.sampled_from([0, 1, 1, 2]))
        priority = draw(st.sampled_from(priorities))
        out.append(
            TaskRequest(
                task_id=f"{prefix}{i}",
                cpu_milli=draw(st.integers(0, 8)) * 1000,
                mem_mib=draw(st.integers(0, 16)) * 1024,
                num_gpu=num_gpu,
                gpu_milli=draw(st.sampled_from([250, 500, 1000])) if num_gpu == 1 else 1000 * (num_gpu > 0),
                gpu_mem_mib=draw(st.sampled_from([0, 0, 4096, 12_000])) if num_gpu else 0,
                allowed_models=frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=1))),
                priority=priority,
                preemptible=priority == 0,
                submitted_at_s=float(i),
            )
        )
    return out


def _fits_now(pool: Cycles, node_name: str, task: TaskRequest) -> bool:
    """Whether `task` fits `node_name` as the pool stands between two cycles (shared-mode GPUs)."""
    node = next(pool._free(n) for n in pool.nodes if n.name == node_name)
    if node.cpu_free_milli < task.cpu_milli or node.mem_free_mib < task.mem_mib:
        return False
    model = node.gpus[0].model if node.gpus else None
    if task.num_gpu and task.allowed_models and model not in task.allowed_models:
        return False
    devices = [g for g in node.gpus if g.free_milli >= task.gpu_milli and g.free_mem_mib >= task.gpu_mem_mib]
    return len(devices) >= task.num_gpu


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=pools(),
    running=work("be", (0,)),
    arriving=work("p", (0, 1, 2)),
    policy=st.sampled_from(POLICIES),
)
def test_a_preemption_leaves_room_for_its_task_and_nobody_is_stopped_twice_for_one_task(
    nodes: tuple[NodeState, ...], running: list[TaskRequest], arriving: list[TaskRequest], policy: str
) -> None:
    pool = Cycles(nodes, list(running), Config(policy=policy))
    pool.step(0.0)
    pool.pending += arriving
    pairs: Counter[tuple[str, str]] = Counter()
    for cycle in range(1, 9):
        decisions = pool.step(float(cycle))
        by_for: dict[str, set[str]] = {}
        for preemption in decisions.preemptions:
            pairs[(preemption.victim_task_id, preemption.for_task_id)] += 1
            by_for.setdefault(preemption.for_task_id, set()).add(preemption.node)
        for for_task, on in by_for.items():
            # One node per task, and with the victims gone (and this decision's placements made) the task
            # fits there in every resource: nothing else was put in the room it was promised.
            assert len(on) == 1
            assert _fits_now(pool, next(iter(on)), pool.requests[for_task]), (for_task, on, decisions)
    # No ping-pong: a task stopped for another is never stopped for it again (it got its room).
    assert all(count == 1 for count in pairs.values()), pairs
