"""A plain per-node-loop FGD: the yardstick for the engine's speed and a cross-check of its decisions.

It does what the paper's simulator does per task: walk every node, filter, compute the node's
fragmentation before and after each candidate move, keep the best integer score (first node in order
and first device on ties). No caches, no numpy. `whalegen bench placement` times it next to the engine,
and the tests check that both pick the same node and devices.
"""

from __future__ import annotations

from collections.abc import Sequence

from whalegen.placement.fragmentation import ModelMix, model_mix, node_fragmentation_milli
from whalegen.placement.policies import fgd_score
from whalegen.placement.types import WHOLE_GPU_MILLI, NodeState, ShapeMix, TaskRequest


class NaiveFgd:
    def __init__(self, nodes: Sequence[NodeState], mix: ShapeMix) -> None:
        self.models = [node.model for node in nodes]
        self.cpu = [node.cpu_free_milli for node in nodes]
        self.mem = [node.mem_free_mib for node in nodes]
        self.gpus = [[gpu.free_milli for gpu in node.gpus] for node in nodes]
        self.mixes: dict[str | None, ModelMix] = {m: model_mix(mix, m) for m in set(self.models)}

    def place(self, task: TaskRequest) -> tuple[int, tuple[int, ...]] | None:
        """Choose and bind; None when no node can host the task."""
        best: tuple[int, int, tuple[int, ...]] | None = None  # (score, node, devices)
        share = task.num_gpu == 1 and task.gpu_milli < WHOLE_GPU_MILLI
        for n, gpus in enumerate(self.gpus):
            model = self.models[n]
            if self.cpu[n] < task.cpu_milli or self.mem[n] < task.mem_mib:
                continue
            if task.num_gpu and task.allowed_models and model not in task.allowed_models:
                continue
            fitting = [d for d, free in enumerate(gpus) if free >= task.gpu_milli]
            if task.num_gpu and len(fitting) < task.num_gpu:
                continue
            mix = self.mixes[model]
            before = node_fragmentation_milli(self.cpu[n], gpus, mix)
            cpu_after = self.cpu[n] - task.cpu_milli
            candidates = [(d,) for d in fitting] if share else [tuple(fitting[: task.num_gpu])]
            for devices in candidates:
                after = list(gpus)
                for d in devices:
                    after[d] -= task.gpu_milli
                score = fgd_score(node_fragmentation_milli(cpu_after, after, mix) - before)
                if best is None or score > best[0]:
                    best = (score, n, devices)
        if best is None:
            return None
        _, n, devices = best
        self.cpu[n] -= task.cpu_milli
        self.mem[n] -= task.mem_mib
        for d in devices:
            self.gpus[n][d] -= task.gpu_milli
        return n, devices
