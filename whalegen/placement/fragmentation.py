"""The FGD fragmentation measure (reference/fragmentation.md §1), for one node and for a cluster.

`frag_n(m)` is the idle GPU (milli) on a node that a task of shape `m` could not use; the node's
fragmentation is its expectation over the target shape mix, `F_n = Σ_m p(m)·frag_n(m)`. Host memory is
not part of the measure. The cluster figure is `F = Σ_n F_n`, reported as an amount (% of capacity) and
as a ratio (% of idle GPU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from whalegen.placement.types import WHOLE_GPU_MILLI, NodeState, Shape, ShapeMix, TaskRequest

# The simulator keeps the most popular shapes until they cover 95 % of tasks (podPopularityThreshold).
POPULARITY_THRESHOLD = 0.95


def task_shape(task: TaskRequest, *, with_memory: bool = False) -> Shape:
    return Shape(
        cpu_milli=task.cpu_milli,
        num_gpu=task.num_gpu,
        gpu_milli=task.gpu_milli if task.num_gpu else 0,
        allowed_models=task.allowed_models,
        mem_mib=task.mem_mib if with_memory else 0,
    )


def shape_mix_from_tasks(
    tasks: Iterable[TaskRequest], *, threshold: float = POPULARITY_THRESHOLD, with_memory: bool = False
) -> ShapeMix:
    """Steps of §1.1: count per shape, sort by count, keep until `threshold` of tasks, renormalise."""
    # 1. Count tasks per shape (CPU-only tasks included), on plain tuples: hashing a frozen dataclass per
    #    task cost 15 ms for a 10,000-task backlog, and a backlog has a few hundred shapes at most.
    keys = Counter(
        (
            t.cpu_milli,
            t.num_gpu,
            t.gpu_milli if t.num_gpu else 0,
            t.allowed_models,
            t.mem_mib if with_memory else 0,
        )
        for t in tasks
    )
    counts = {
        Shape(cpu, num_gpu, milli, allowed, mem): n for (cpu, num_gpu, milli, allowed, mem), n in keys.items()
    }
    total = sum(counts.values())
    if total == 0:
        return ShapeMix((), ())
    # 2. Most popular first; equal counts in a fixed order so the mix is reproducible.
    ranked = sorted(
        counts.items(),
        key=lambda item: (
            -item[1],
            item[0].num_gpu,
            item[0].gpu_milli,
            item[0].cpu_milli,
            item[0].mem_mib,
            sorted(item[0].allowed_models),
        ),
    )
    # 3. Keep shapes until they cover at least `threshold` of all tasks.
    kept: list[tuple[Shape, int]] = []
    covered = 0
    for shape, count in ranked:
        kept.append((shape, count))
        covered += count
        if covered >= threshold * total:
            break
    # 4. Renormalise the kept counts.
    kept_total = sum(count for _, count in kept)
    return ShapeMix(tuple(s for s, _ in kept), tuple(c / kept_total for _, c in kept))


@dataclass(frozen=True)
class ModelMix:
    """The mix as seen from nodes of one GPU model, arranged for a fast inner loop.

    Shapes that can never use this model's GPUs (CPU-only, or a type constraint that excludes the
    model) see all idle GPU as fragment whatever the state, so their weights collapse into `base_weight`.
    The others are grouped by GPU milli, so one pass over the devices serves every shape of a group.
    """

    base_weight: float
    groups: tuple[tuple[int, tuple[tuple[float, int, int], ...]], ...]  # (gpu_milli, ((w, cpu, num_gpu)…))


def model_mix(mix: ShapeMix, model: str | None) -> ModelMix:
    base = 0.0
    groups: dict[int, list[tuple[float, int, int]]] = {}
    for shape, weight in zip(mix.shapes, mix.weights, strict=True):
        allowed = not shape.allowed_models or (model is not None and model in shape.allowed_models)
        if shape.num_gpu == 0 or not allowed:
            base += weight
        else:
            groups.setdefault(shape.gpu_milli, []).append((weight, shape.cpu_milli, shape.num_gpu))
    return ModelMix(base, tuple((milli, tuple(rows)) for milli, rows in sorted(groups.items())))


def node_fragmentation_milli(cpu_free_milli: int, gpu_free_milli: Sequence[int], mix: ModelMix) -> float:
    """`F_n` in GPU milli for a node with this free CPU and free milli per device (§1.2, §1.3)."""
    idle = sum(gpu_free_milli)
    if idle == 0:
        return 0.0
    frag = mix.base_weight * idle
    for gpu_milli, rows in mix.groups:
        fitting = 0
        too_small = 0
        for free in gpu_free_milli:
            if free >= gpu_milli:
                fitting += 1
            else:
                too_small += free
        for weight, cpu_milli, num_gpu in rows:
            # A shape the node cannot host (CPU or devices) sees all idle GPU as fragment; one it can
            # host sees only the devices too small for it.
            if cpu_free_milli < cpu_milli or fitting < num_gpu:
                frag += weight * idle
            else:
                frag += weight * too_small
    return frag


@dataclass(frozen=True)
class ClusterFragmentation:
    frag_milli: float
    idle_milli: int
    capacity_milli: int

    @property
    def amount_pct(self) -> float:
        """Fragmentation as a percentage of total cluster GPU capacity."""
        return 100.0 * self.frag_milli / self.capacity_milli if self.capacity_milli else 0.0

    @property
    def ratio_pct(self) -> float:
        """Fragmentation as a percentage of the cluster's idle GPU (100 % when nothing idle is usable)."""
        return 100.0 * self.frag_milli / self.idle_milli if self.idle_milli else 0.0


def node_fragmentation(node: NodeState, mix: ShapeMix) -> float:
    return node_fragmentation_milli(
        node.cpu_free_milli, [gpu.free_milli for gpu in node.gpus], model_mix(mix, node.model)
    )


def takeable_mix(mix: ShapeMix, nodes: Sequence[NodeState]) -> ShapeMix:
    """The mix without the shapes no node could ever take, renormalised. A request larger than every
    node is never placed; counted in the mix, it would call every idle GPU a fragment it cannot use
    (a pool whose nodes have 8 GPUs read 29-31% fragmented for one waiting 9-GPU task)."""
    kept = [
        (shape, weight)
        for shape, weight in zip(mix.shapes, mix.weights, strict=True)
        if any(n.takes(shape.num_gpu, shape.cpu_milli, shape.mem_mib, shape.allowed_models) for n in nodes)
    ]
    if len(kept) == len(mix.shapes):
        return mix
    total = sum(weight for _, weight in kept)
    if not kept or total <= 0:
        return ShapeMix((), ())
    return ShapeMix(tuple(s for s, _ in kept), tuple(w / total for _, w in kept))


def cluster_fragmentation(nodes: Iterable[NodeState], mix: ShapeMix) -> ClusterFragmentation:
    frag = 0.0
    idle = 0
    capacity = 0
    by_model: dict[str | None, ModelMix] = {}
    for node in nodes:
        if node.model not in by_model:
            by_model[node.model] = model_mix(mix, node.model)
        frees = [gpu.free_milli for gpu in node.gpus]
        frag += node_fragmentation_milli(node.cpu_free_milli, frees, by_model[node.model])
        idle += sum(frees)
        capacity += WHOLE_GPU_MILLI * len(node.gpus)
    return ClusterFragmentation(frag, idle, capacity)
