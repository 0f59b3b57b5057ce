"""Placement engine: snapshot types, filters, scores and `solve_cycle`. Pure: no Django, no I/O.

The production cycle, the replays and the benchmarks run the `Engine` inside `whalegen.scheduling.decide`,
which adds ordering, unit binding, re-carving and reasons around it; `solve_cycle(snapshot,
EngineConfig(policy=...), now)` is the engine alone (the benchmarks' baseline). See docs/placement.md.
"""

from whalegen.placement.engine import Engine, EngineConfig, solve_cycle
from whalegen.placement.fragmentation import cluster_fragmentation, node_fragmentation, shape_mix_from_tasks
from whalegen.placement.registry import POLICY_NAMES, make_policy
from whalegen.placement.types import (
    ClusterSnapshot,
    ComputeUnit,
    CycleResult,
    GpuState,
    NodeState,
    Outcome,
    PartitionMode,
    Placement,
    Preemption,
    Quota,
    RunningTask,
    Shape,
    ShapeMix,
    TaskPrediction,
    TaskRequest,
    UnitKind,
    Unplaced,
)

__all__ = [
    "POLICY_NAMES",
    "ClusterSnapshot",
    "ComputeUnit",
    "CycleResult",
    "Engine",
    "EngineConfig",
    "GpuState",
    "NodeState",
    "Outcome",
    "PartitionMode",
    "Placement",
    "Preemption",
    "Quota",
    "RunningTask",
    "Shape",
    "ShapeMix",
    "TaskPrediction",
    "TaskRequest",
    "UnitKind",
    "Unplaced",
    "cluster_fragmentation",
    "make_policy",
    "node_fragmentation",
    "shape_mix_from_tasks",
    "solve_cycle",
]
