"""Trace replay under the FGD paper's protocol (reference/fragmentation.md §4).

Per seed: shuffle the node order (the simulator's random node-name prefixes, which decide ties) and the
tasks; resample tasks with replacement until their GPU request reaches 130 % of capacity; submit them one
at a time through the production decision (`whalegen.scheduling.Decider.step`, one cycle per arrival, on
the engine's working copy); a task that fits nowhere
fails and later tasks still arrive; nothing departs. After every task: allocated GPU milli, arrived GPU
milli, fragmentation. Curves are binned like the authors' analysis scripts: arrived % rounded to an
integer, the mean of the records in each bin (neighbouring bins when one is empty).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from whalegen.placement.fragmentation import (
    ModelMix,
    model_mix,
    node_fragmentation_milli,
    shape_mix_from_tasks,
)
from whalegen.placement.state import ClusterState
from whalegen.placement.types import WHOLE_GPU_MILLI, ClusterSnapshot, NodeState, ShapeMix, TaskRequest
from whalegen.scheduling import Config, Decider, Snapshot
from whalegen.sim.loop import Departures, run_events

INFLATION = 1.30
MAX_PCT = 130


def arrivals(tasks: Sequence[TaskRequest], capacity_milli: int, seed: int) -> list[TaskRequest]:
    """Steps 3–4: shuffle, then resample with replacement (or drop at random) to 130 % of capacity."""
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    target = INFLATION * capacity_milli
    total = sum(t.gpu_request_milli for t in order)
    copies = 0
    while total < target:
        task = tasks[rng.randrange(len(tasks))]
        copies += 1
        order.append(dataclasses.replace(task, task_id=f"{task.task_id}~{copies}"))
        total += task.gpu_request_milli
    while total - order[-1].gpu_request_milli >= target and len(order) > 1:
        total -= order.pop(rng.randrange(len(order))).gpu_request_milli
    return order


def shuffled_nodes(nodes: Sequence[NodeState], seed: int) -> tuple[NodeState, ...]:
    order = list(nodes)
    random.Random(seed * 7_919 + 1).shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class RunResult:
    policy: str
    seed: int
    tasks: int
    failed_tasks: int
    seconds: float  # wall clock
    cpu_seconds: float  # CPU time of this process: what one core spent, whatever else the machine runs
    # Index = arrived % of GPU capacity (0 … 130); None where no record falls near that bin.
    unallocated_pct: tuple[float | None, ...]
    frag_amount_pct: tuple[float | None, ...]
    frag_ratio_pct: tuple[float | None, ...]

    def at(self, curve: tuple[float | None, ...], pct: int) -> float:
        value = curve[pct]
        if value is None:
            raise ValueError(f"run {self.policy}/{self.seed} has no record near arrived {pct} %")
        return value


class _FragTracker:
    """Cluster fragmentation under the workload's mix, updated for the one node each placement touches."""

    def __init__(self, state: ClusterState, mix: ShapeMix) -> None:
        self.state = state
        self.mixes: dict[str | None, ModelMix] = {m: model_mix(mix, m) for m in set(state.models)}
        self.memo: dict[tuple[str | None, int, tuple[int, ...]], float] = {}
        self.per_node = [self._node(n) for n in range(len(state))]
        self.total = sum(self.per_node)

    def _node(self, n: int) -> float:
        s = self.state
        key = (s.models[n], s.cpu_free[n], tuple(sorted(s.gpu_free[n])))
        value = self.memo.get(key)
        if value is None:
            value = node_fragmentation_milli(s.cpu_free[n], s.gpu_free[n], self.mixes[s.models[n]])
            self.memo[key] = value
        return value

    def update(self, n: int) -> None:
        value = self._node(n)
        self.total += value - self.per_node[n]
        self.per_node[n] = value


def _binned(arrived_pct: list[int], values: list[float]) -> tuple[float | None, ...]:
    sums = [0.0] * (MAX_PCT + 1)
    counts = [0] * (MAX_PCT + 1)
    for pct, value in zip(arrived_pct, values, strict=True):
        if 0 <= pct <= MAX_PCT:
            sums[pct] += value
            counts[pct] += 1
    out: list[float | None] = []
    for pct in range(MAX_PCT + 1):
        if counts[pct]:
            out.append(sums[pct] / counts[pct])
            continue
        near = [p for p in (pct - 1, pct, pct + 1) if 0 <= p <= MAX_PCT and counts[p]]
        out.append(sum(sums[p] for p in near) / sum(counts[p] for p in near) if near else None)
    return tuple(out)


class _StaticReplay:
    """The paper's protocol as a configuration of the event loop: one decision per arrival, nothing
    departs; after each, the allocated, unallocated and fragmentation records."""

    def __init__(
        self,
        decider: Decider,
        tracker: _FragTracker,
        capacity: int,
        total: int,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        self.decider = decider
        self.tracker = tracker
        self.capacity = capacity
        state = decider.engine.state
        self.node_idle = [sum(frees) for frees in state.gpu_free]
        self.idle = sum(self.node_idle)
        self.arrived = self.allocated = self.failed = 0
        self.pcts: list[int] = []
        self.unalloc: list[float] = []
        self.frag_amount: list[float] = []
        self.frag_ratio: list[float] = []
        self.total = total
        self.on_progress = on_progress

    def arrive(self, item: TaskRequest, at_s: float) -> None:
        self.arrived += item.gpu_request_milli
        result = self.decider.step((item,), at_s, estimates=False, nodes_after=False)
        if result.placements:
            state = self.decider.engine.state
            self.allocated += item.gpu_request_milli
            n = state.index[result.placements[0].placement.node]
            self.idle += sum(state.gpu_free[n]) - self.node_idle[n]
            self.node_idle[n] = sum(state.gpu_free[n])
            self.tracker.update(n)
        else:
            self.failed += 1
        capacity = self.capacity
        self.pcts.append(round(100 * self.arrived / capacity))
        self.unalloc.append(100 - 100 * self.allocated / capacity)
        self.frag_amount.append(100 * self.tracker.total / capacity)
        self.frag_ratio.append(100 * self.tracker.total / self.idle if self.idle else 0.0)
        i = int(at_s)  # the clock is the arrival's index
        if self.on_progress is not None and (i % 500 == 0 or i == self.total - 1):
            self.on_progress(i + 1, self.total)

    def depart(self, task_id: str, at_s: float) -> None:
        raise AssertionError(f"{task_id}: nothing departs in the static replay")


def run_replay(
    nodes: Sequence[NodeState],
    tasks: Sequence[TaskRequest],
    policy: str,
    seed: int,
    *,
    mix: ShapeMix | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """One run of the protocol; `mix` defaults to the workload's own shape mix (what FGD is given)."""
    started = time.perf_counter()
    started_cpu = time.process_time()
    shape_mix = (
        mix
        if mix is not None
        else (
            shape_mix_from_tasks(tasks, with_memory=True)
            if policy.startswith("whalegen")
            else shape_mix_from_tasks(tasks)
        )
    )
    cluster = shuffled_nodes(nodes, seed)
    capacity = WHOLE_GPU_MILLI * sum(len(node.gpus) for node in cluster)
    stream = arrivals(tasks, capacity, seed)
    # A trace has no tenants, quotas or units: one tenant without a quota, and GPUs whose free milli is
    # their capacity (nothing to map).
    decider = Decider(
        Snapshot(ClusterSnapshot(cluster, shape_mix=shape_mix), unit_exact=False),
        Config(policy=policy, seed=seed),
    )
    # The reported fragmentation is always the paper's measure over the paper's mix.
    tracker = _FragTracker(decider.engine.state, shape_mix_from_tasks(tasks))
    replay = _StaticReplay(decider, tracker, capacity, len(stream), on_progress)
    # The clock is the arrival's index: one decision per arrival, in order.
    run_events([(float(i), task) for i, task in enumerate(stream)], replay, Departures())
    return RunResult(
        policy=policy,
        seed=seed,
        tasks=len(stream),
        failed_tasks=replay.failed,
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - started_cpu,
        unallocated_pct=_binned(replay.pcts, replay.unalloc),
        frag_amount_pct=_binned(replay.pcts, replay.frag_amount),
        frag_ratio_pct=_binned(replay.pcts, replay.frag_ratio),
    )
