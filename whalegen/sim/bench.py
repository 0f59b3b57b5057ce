"""Placement speed: the production decision against a plain per-node-loop FGD, timed in the same run.

The headline figure places through `whalegen.scheduling.Decider.step`, one cycle per arriving task, as
the static replay and production do (`decide`); the engine alone (`Engine.solve` per task, no ordering,
no unit mapping) runs on the same stream beside it, so what the one decision path costs over the engine
is a same-run ratio.

Times are CPU seconds of this process (`time.process_time`), so a shared machine slows the wall clock
but not the figures much; wall seconds are reported too.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.types import WHOLE_GPU_MILLI, ClusterSnapshot, GpuState, NodeState, TaskRequest
from whalegen.scheduling import Config, Decider, Snapshot
from whalegen.sim.naive import NaiveFgd
from whalegen.sim.replay import arrivals, shuffled_nodes

# A synthetic node is the trace's most common one (G2 × 8: 96 cores, 384 GiB host memory).
SYNTHETIC_MODEL = "G2"
SYNTHETIC_CPU_MILLI = 96_000
SYNTHETIC_MEM_MIB = 393_216


def synthetic_cluster(count: int, gpus_per_node: int = 8) -> tuple[NodeState, ...]:
    return tuple(
        NodeState(
            f"synthetic-{i:05d}",
            SYNTHETIC_CPU_MILLI,
            SYNTHETIC_CPU_MILLI,
            SYNTHETIC_MEM_MIB,
            SYNTHETIC_MEM_MIB,
            tuple(GpuState(d, SYNTHETIC_MODEL, WHOLE_GPU_MILLI, 0, 0) for d in range(gpus_per_node)),
        )
        for i in range(count)
    )


@dataclass(frozen=True)
class Timing:
    tasks: int
    placements: int
    cpu_s: float
    wall_s: float

    @property
    def placements_per_s(self) -> float:
        return self.placements / self.cpu_s if self.cpu_s else 0.0

    @property
    def decisions_per_s(self) -> float:
        return self.tasks / self.cpu_s if self.cpu_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "placements_per_s": round(self.placements_per_s, 1),
            "decisions_per_s": round(self.decisions_per_s, 1),
        }


def time_engine(
    nodes: Sequence[NodeState], stream: Sequence[TaskRequest], policy: str, mix_tasks: Sequence[TaskRequest]
) -> Timing:
    """One `Engine.solve` cycle per task, as the replay and a one-task-per-cycle production loop do."""
    started, started_cpu = time.perf_counter(), time.process_time()
    mix = shape_mix_from_tasks(mix_tasks, with_memory=policy.startswith("whalegen"))
    engine = Engine(ClusterSnapshot(tuple(nodes), shape_mix=mix), EngineConfig(policy=policy))
    placed = 0
    for i, task in enumerate(stream):
        placed += len(engine.solve((task,), float(i)).placements)
    return Timing(len(stream), placed, time.process_time() - started_cpu, time.perf_counter() - started)


def time_decide(
    nodes: Sequence[NodeState], stream: Sequence[TaskRequest], policy: str, mix_tasks: Sequence[TaskRequest]
) -> Timing:
    """One `Decider.step` per task: the production decision, as `whalegen replay` runs it."""
    started, started_cpu = time.perf_counter(), time.process_time()
    mix = shape_mix_from_tasks(mix_tasks, with_memory=policy.startswith("whalegen"))
    decider = Decider(
        Snapshot(ClusterSnapshot(tuple(nodes), shape_mix=mix), unit_exact=False), Config(policy=policy)
    )
    placed = 0
    for i, task in enumerate(stream):
        placed += len(decider.step((task,), float(i), estimates=False, nodes_after=False).placements)
    return Timing(len(stream), placed, time.process_time() - started_cpu, time.perf_counter() - started)


def time_naive(
    nodes: Sequence[NodeState], stream: Sequence[TaskRequest], mix_tasks: Sequence[TaskRequest]
) -> Timing:
    started, started_cpu = time.perf_counter(), time.process_time()
    naive = NaiveFgd(nodes, shape_mix_from_tasks(mix_tasks))
    placed = sum(1 for task in stream if naive.place(task) is not None)
    return Timing(len(stream), placed, time.process_time() - started_cpu, time.perf_counter() - started)


def bench_stream(
    nodes: Sequence[NodeState], tasks: Sequence[TaskRequest], *, seed: int, fill: float
) -> tuple[tuple[NodeState, ...], list[TaskRequest]]:
    """The protocol's node order and arrival stream for `seed`, cut where arrivals pass `fill` × capacity."""
    cluster = shuffled_nodes(nodes, seed)
    capacity = WHOLE_GPU_MILLI * sum(len(node.gpus) for node in cluster)
    stream = arrivals(tasks, capacity, seed)
    arrived = 0
    for i, task in enumerate(stream):
        arrived += task.gpu_request_milli
        if arrived > fill * capacity:
            return cluster, stream[:i]
    return cluster, stream


def fingerprint(
    nodes: Sequence[NodeState], tasks: Sequence[TaskRequest], policy: str, *, seed: int, fill: float
) -> dict[str, Any]:
    """SHA-256 of every decision, in order, through `decide` and through the engine alone.

    A speed change must leave both digests as they were: each step's placements (task, node, GPU indexes,
    unit, borrowed), preemptions and every unplaced task's code and sentence enter the digest, so a
    different pick, a different order or a reworded reason all show.
    """
    cluster, stream = bench_stream(nodes, tasks, seed=seed, fill=fill)
    mix = shape_mix_from_tasks(tasks, with_memory=policy.startswith("whalegen"))
    decider = Decider(
        Snapshot(ClusterSnapshot(tuple(cluster), shape_mix=mix), unit_exact=False), Config(policy=policy)
    )
    engine = Engine(ClusterSnapshot(tuple(cluster), shape_mix=mix), EngineConfig(policy=policy))
    decided, alone = hashlib.sha256(), hashlib.sha256()
    placed = 0
    for i, task in enumerate(stream):
        step = decider.step((task,), float(i), estimates=False, nodes_after=False)
        placed += len(step.placements)
        lines = [repr(b.placement) for b in step.placements] + [repr(p) for p in step.preemptions]
        lines += [f"{task_id} {r.code} {r.message}" for task_id, r in sorted(step.unplaced.items())]
        decided.update(("\n".join(lines) + "\n;\n").encode())
        result = engine.solve((task,), float(i))
        lines = [repr(p) for p in (*result.placements, *result.preemptions, *result.unplaced)]
        alone.update(("\n".join(lines) + "\n;\n").encode())
    return {
        "policy": policy,
        "nodes": len(cluster),
        "tasks": len(stream),
        "placements": placed,
        "decide_sha256": decided.hexdigest(),
        "engine_sha256": alone.hexdigest(),
    }


def bench_cluster(
    nodes: Sequence[NodeState],
    tasks: Sequence[TaskRequest],
    policy: str,
    *,
    seed: int,
    fill: float,
    naive_tasks: int,
) -> dict[str, Any]:
    """`decide` and the engine alone over the protocol's stream up to `fill` × capacity; naive FGD over
    its first tasks."""
    cluster, stream = bench_stream(nodes, tasks, seed=seed, fill=fill)
    capacity = WHOLE_GPU_MILLI * sum(len(node.gpus) for node in cluster)
    head = stream[:naive_tasks]
    decided = time_decide(cluster, stream, policy, tasks)
    engine = time_engine(cluster, stream, policy, tasks)
    decided_head = time_decide(cluster, head, policy, tasks)
    naive = time_naive(cluster, head, tasks)
    return {
        "nodes": len(cluster),
        "gpus": capacity // WHOLE_GPU_MILLI,
        "fill_pct": round(100 * fill),
        "decide": decided.as_dict(),
        "engine_alone": engine.as_dict(),
        # What placing through the one decision path costs over the engine alone (CPU, same stream).
        "decide_cpu_over_engine_alone_cpu": round(decided.cpu_s / engine.cpu_s, 2) if engine.cpu_s else None,
        "decide_first_tasks": decided_head.as_dict(),
        "naive_fgd_first_tasks": naive.as_dict(),
        "speedup_vs_naive_fgd": round(decided_head.decisions_per_s / naive.decisions_per_s, 1)
        if naive.decisions_per_s
        else None,
    }
