"""Re-carving as a last resort: a cycle decides on the units GPUs have now, and opens idle MIG GPUs to a
new layout only for the tasks no present unit can hold.

A re-carve costs minutes of agent work and destroys the GPU's present layout, so a task that a whole GPU,
an MPS share or a free MIG instance can hold this cycle never waits for one. `solve_recarving_last` runs
the engine in passes, each on the working copy the one before left:

1. **Present units.** Every pending task, in the cycle's order, with idle MIG GPUs as they are carved
   (their free instances only). The engine's MIG model sees free slices, not carved instances, so it may
   put a task on slices of an idle GPU that no free instance covers (a 4g.40gb over the slices of a free
   3g.40gb): that is a re-carve in disguise. Such single-GPU placements are taken back and their tasks
   tried again on present units with those GPUs closed (1b), until no disguised re-carve is left.
2. **Re-carve.** The tasks left for capacity (`no_capacity`, `waiting_for_preemption`,
   `gang_unplaceable`) that could run on a MIG instance, with every idle MIG GPU nothing landed on in
   pass 1 opened as a fresh GPU. Single one-GPU tasks go first, in the cycle's order; gangs and multi-GPU
   tasks after them (the commit never re-carves for those, so they only learn that a new layout would be
   needed: `needs_layout_change`, and cannot take a fresh GPU from a single task). No preemption here.

The merge keeps pass 1's reasons for tasks pass 2 could not place either (they speak of the units that
exist), and drops pass 1's preemption proposals for tasks pass 2 placed: re-carving an idle GPU stops no
running work. The commit maps placements to units; a single-GPU MIG placement no unit matches is
re-carved there (`plan_repartition`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from whalegen.gpus.mig import MEMORY_SLICES
from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    CycleResult,
    GpuState,
    Isolation,
    NodeState,
    Outcome,
    Placement,
    RunningTask,
    TaskRequest,
    UnitKind,
    Unplaced,
)

ALL_SLICES = (1 << MEMORY_SLICES) - 1
GpuKey = tuple[str, int]  # (engine node name, GPU index)
# Outcomes that say "no room now": a re-carve may make room.
CAPACITY_OUTCOMES = frozenset({Outcome.NO_CAPACITY, Outcome.WAITING_FOR_PREEMPTION, Outcome.GANG_UNPLACEABLE})


@dataclass(frozen=True)
class FreeInstance:
    """A carved MIG instance nobody holds."""

    mig_profile: str
    mig_start: int | None
    gpu_milli: int
    mem_mib: int


@dataclass(frozen=True)
class IdleMigGpu:
    """A MIG GPU the cycle may re-carve: healthy, nothing held, no process stopping, not promised."""

    node: str  # engine node name
    index: int
    instances: tuple[FreeInstance, ...]  # its present layout, every instance free


@dataclass(frozen=True)
class RecarveResult:
    result: CycleResult  # pass 1 and pass 2 merged
    nodes_after: tuple[NodeState, ...]  # the working copy after both; untouched idle MIG GPUs open
    recarve_pass: frozenset[str]  # tasks placed in pass 2 (with idle MIG GPUs open)


def can_use_mig(task: TaskRequest) -> bool:
    return task.num_gpu > 0 and task.isolation in (Isolation.ANY, Isolation.MIG)


def recarvable(task: TaskRequest) -> bool:
    """Only a single task on one GPU is re-carved for (a gang binds in one cycle or not at all)."""
    return can_use_mig(task) and task.gang_id is None and task.num_gpu == 1


def disguised_recarves(
    placements: Iterable[Placement], idle: Mapping[GpuKey, IdleMigGpu], requests: Mapping[str, TaskRequest]
) -> list[Placement]:
    """Single-GPU MIG placements on idle GPUs that no free carved instance can carry, in the order given.

    Mirrors the commit's mapping: the exact instance if free, else the smallest free one at least as big
    (compute and the task's GPU memory); each instance carries one placement.
    """
    taken: dict[GpuKey, set[int]] = defaultdict(set)
    out: list[Placement] = []
    for placement in placements:
        if placement.unit.kind is not UnitKind.MIG or len(placement.gpu_indexes) != 1:
            continue
        key = (placement.node, placement.gpu_indexes[0])
        gpu = idle.get(key)
        request = requests[placement.task_id]
        if gpu is None or not recarvable(request):
            continue
        free = [(i, u) for i, u in enumerate(gpu.instances) if i not in taken[key]]
        unit = placement.unit
        wanted = (unit.mig_profile, unit.mig_start_slice)
        exact = [i for i, u in free if (u.mig_profile, u.mig_start) == wanted]
        big = [
            (u.gpu_milli, u.mem_mib, i)
            for i, u in free
            if u.gpu_milli >= unit.gpu_milli and u.mem_mib >= request.gpu_mem_mib
        ]
        if exact:
            taken[key].add(exact[0])
        elif big:
            taken[key].add(min(big)[2])
        else:
            out.append(placement)
    return out


def _with_gpus(nodes: Sequence[NodeState], change: Mapping[GpuKey, GpuState | str]) -> tuple[NodeState, ...]:
    """Nodes with some GPUs opened ("open": a fresh GPU, every slice free), closed ("close": full) or put
    back as they were (a `GpuState`)."""
    if not change:
        return tuple(nodes)
    out: list[NodeState] = []
    for node in nodes:
        gpus: list[GpuState] = []
        for gpu in node.gpus:
            how = change.get((node.name, gpu.index))
            if isinstance(how, GpuState):
                gpu = how
            elif how == "open":
                gpu = replace(
                    gpu, free_milli=WHOLE_GPU_MILLI, free_mem_mib=gpu.total_mem_mib, mig_used_slices=0
                )
            elif how == "close":
                gpu = replace(gpu, free_milli=0, free_mem_mib=0, mig_used_slices=ALL_SLICES)
            gpus.append(gpu)
        out.append(replace(node, gpus=tuple(gpus)))
    return tuple(out)


def _as_running(placement: Placement, request: TaskRequest, now_s: float) -> RunningTask:
    return RunningTask(
        task_id=placement.task_id,
        node=placement.node,
        gpu_indexes=placement.gpu_indexes,
        gpu_milli=placement.unit.gpu_milli,
        cpu_milli=request.cpu_milli,
        mem_mib=request.mem_mib,
        gpu_mem_mib=request.gpu_mem_mib,
        priority=request.priority,
        tenant=request.tenant,
        preemptible=request.preemptible,
        started_at_s=now_s,
        borrowed=placement.borrowed,
        mig_profile=placement.unit.mig_profile if placement.unit.kind is UnitKind.MIG else None,
        mig_start_slice=placement.unit.mig_start_slice if placement.unit.kind is UnitKind.MIG else None,
    )


class _Passes:
    """The working copy carried from one engine to the next (a later pass is a new `Engine`)."""

    def __init__(self, engine: Engine, base: ClusterSnapshot, config: EngineConfig, now_s: float) -> None:
        self.engine = engine
        self.base = base
        self.config = replace(config, preemption=False)
        self.now_s = now_s
        self.placed: list[Placement] = []

    def next_engine(
        self, change: Mapping[GpuKey, GpuState | str], requests: Mapping[str, TaskRequest]
    ) -> Engine:
        """An engine on what the current one left, GPUs opened or closed; quota use carried over."""
        running = self.base.running + tuple(
            _as_running(p, requests[p.task_id], self.now_s) for p in self.placed
        )
        nodes = _with_gpus(self.engine.state.nodes(), change)
        engine = Engine(replace(self.base, nodes=nodes, pending=(), running=running), self.config)
        engine.usage_milli = defaultdict(int, self.engine.usage_milli)
        self.engine = engine
        return engine


def solve_recarving_last(
    engine: Engine,
    pending: Sequence[TaskRequest],
    now_s: float,
    *,
    idle: Mapping[GpuKey, IdleMigGpu],
    base: ClusterSnapshot,
    config: EngineConfig,
) -> RecarveResult:
    """Place `pending` on present units first, then re-carve idle MIG GPUs for what is left (see module).

    `engine` holds the cycle's working copy with idle MIG GPUs as carved; `base` is the snapshot it was
    built from (its running tasks, quotas and shape mix) and `config` its configuration, for the engines
    of the later passes.
    """
    requests = {t.task_id: t for t in pending}
    passes = _Passes(engine, base, config, now_s)
    # 1. Present units.
    first = engine.solve(tuple(pending), now_s)
    unplaced: dict[str, Unplaced] = {u.task_id: u for u in first.unplaced}
    todo = list(first.placements)
    saved: dict[GpuKey, GpuState] = {}  # closed GPUs as they were just before closing
    while True:
        disguised = disguised_recarves(todo, idle, requests)
        gone = {p.task_id for p in disguised}
        passes.placed += [p for p in todo if p.task_id not in gone]
        if not disguised:
            break
        # 1b. Taken back; tried again with the GPUs they landed on closed (present units only).
        for placement in disguised:
            passes.engine.release(placement.task_id)
        closing = {(p.node, p.gpu_indexes[0]) for p in disguised}
        for node in passes.engine.state.nodes():
            saved.update({(node.name, g.index): g for g in node.gpus if (node.name, g.index) in closing})
        retry = passes.next_engine(dict.fromkeys(closing, "close"), requests)
        again = retry.solve(tuple(requests[p.task_id] for p in disguised), now_s)
        unplaced.update({u.task_id: u for u in again.unplaced})
        todo = list(again.placements)

    # 2. Re-carve: idle MIG GPUs nothing landed on, opened, for what is left for capacity.
    touched = {(p.node, i) for p in passes.placed for i in p.gpu_indexes}
    change: dict[GpuKey, GpuState | str] = {key: gpu for key, gpu in saved.items() if key in touched}
    change.update({key: "open" for key in idle if key not in touched})
    left = [
        requests[t]
        for t, u in unplaced.items()
        if u.outcome in CAPACITY_OUTCOMES
        and can_use_mig(requests[t])
        # A multi-GPU task or a gang member with victims proposed keeps them: it is never re-carved for.
        and (recarvable(requests[t]) or u.outcome is not Outcome.WAITING_FOR_PREEMPTION)
    ]
    # A gang goes to pass 2 whole or not at all.
    ids = {t.task_id for t in left}
    gangs_out = {t.gang_id for t in pending if t.gang_id is not None and t.task_id not in ids}
    left = [t for t in left if t.gang_id is None or t.gang_id not in gangs_out]
    preemptions = first.preemptions
    placements = list(passes.placed)
    recarve_pass: frozenset[str] = frozenset()
    if left and any(how == "open" for how in change.values()):
        offset = 1 + max((t.order_key or 0 for t in pending), default=0)
        ordered = tuple(
            t if recarvable(t) else replace(t, order_key=offset + (t.order_key or 0)) for t in left
        )
        second = passes.next_engine(change, requests).solve(ordered, now_s)
        placements += second.placements
        recarve_pass = frozenset(p.task_id for p in second.placements)
        for task_id in recarve_pass:
            unplaced.pop(task_id, None)
        preemptions = tuple(p for p in preemptions if p.for_task_id not in recarve_pass)
        touched |= {(p.node, i) for p in second.placements for i in p.gpu_indexes}
        # Idle MIG GPUs nothing landed on stay open in the picture after the cycle.
        change = {key: "open" for key in idle if key not in touched}
    nodes_after = _with_gpus(passes.engine.state.nodes(), change)
    return RecarveResult(
        result=CycleResult(tuple(placements), preemptions, tuple(unplaced.values()), first.notes),
        nodes_after=nodes_after,
        recarve_pass=recarve_pass,
    )
