"""Decisions in a row as the production cycle makes them: each from a fresh snapshot of what runs, its
preemptions' victims requeued as pending and its placements started (apps/scheduling/services.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from whalegen.placement.types import (
    ClusterSnapshot,
    NodeState,
    Quota,
    RunningTask,
    TaskRequest,
)
from whalegen.scheduling import Config, Decisions, Snapshot, decide


@dataclass
class Cycles:
    """A pool of shared-mode nodes (as built, all idle) stepped one decision at a time."""

    nodes: Sequence[NodeState]
    pending: list[TaskRequest]
    config: Config
    quotas: Sequence[Quota] = ()
    running: dict[str, RunningTask] = field(default_factory=dict)
    requests: dict[str, TaskRequest] = field(default_factory=dict)
    stopped: Counter[str] = field(default_factory=Counter)
    history: list[Decisions] = field(default_factory=list)

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            tuple(self._free(n) for n in self.nodes),
            tuple(self.pending),
            tuple(self.running.values()),
            tuple(self.quotas),
        )

    def _free(self, node: NodeState) -> NodeState:
        on = [t for t in self.running.values() if t.node == node.name]
        gpus = tuple(
            replace(
                g,
                free_milli=g.free_milli - sum(t.gpu_milli for t in on if g.index in t.gpu_indexes),
                free_mem_mib=g.free_mem_mib - sum(t.gpu_mem_mib for t in on if g.index in t.gpu_indexes),
            )
            for g in node.gpus
        )
        return replace(
            node,
            cpu_free_milli=node.cpu_free_milli - sum(t.cpu_milli for t in on),
            mem_free_mib=node.mem_free_mib - sum(t.mem_mib for t in on),
            gpus=gpus,
        )

    def step(self, now_s: float) -> Decisions:
        """One cycle: decide, stop the victims (requeued, as `workloads.task_preempt` does), start others."""
        for t in self.pending:
            self.requests[t.task_id] = t
        decisions = decide(Snapshot(cluster=self.snapshot(), unit_exact=False), self.config, now_s)
        for preemption in decisions.preemptions:
            gone = self.running.pop(preemption.victim_task_id)
            self.stopped[gone.task_id] += 1
            self.pending.append(self.requests[gone.task_id])
        placed = {b.task_id for b in decisions.placements}
        for bound in decisions.placements:
            request = self.requests[bound.task_id]
            self.running[bound.task_id] = RunningTask(
                bound.task_id,
                bound.placement.node,
                bound.placement.gpu_indexes,
                request.gpu_milli,
                request.cpu_milli,
                request.mem_mib,
                request.gpu_mem_mib,
                priority=request.priority,
                tenant=request.tenant,
                preemptible=request.preemptible,
                started_at_s=now_s,
                borrowed=bound.placement.borrowed,
            )
        self.pending = [t for t in self.pending if t.task_id not in placed]
        self.history.append(decisions)
        return decisions
