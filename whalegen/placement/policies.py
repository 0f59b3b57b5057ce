"""Placement policies: each scores one feasible node for one request and picks its devices.

The engine filters (CPU, host memory, allowed model, devices), caches each node's score per request
until the node changes, and selects the highest score; equal scores go to the node that comes first in
the snapshot's order. That fixed order is how the FGD paper's simulator behaves in effect (random node
name prefixes per seed, reference/fragmentation.md §7), and it matters: it keeps piling work onto the
same nodes and leaves whole nodes free.

Baseline constants (128 cores, 8 GPUs as the "max node spec") and score formulas follow
reference/fragmentation.md §3; FGD follows §2, including integer scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np

from whalegen.placement.fragmentation import ModelMix, model_mix, node_fragmentation_milli
from whalegen.placement.state import ClusterState, Request
from whalegen.placement.types import WHOLE_GPU_MILLI, RunningTask, ShapeMix, SlaRefusal, TaskRequest

MAX_NODE_CPU_MILLI = 128_000
MAX_NODE_GPU_MILLI = 8 * WHOLE_GPU_MILLI

Choice = tuple[float, tuple[int, ...]]  # (score, device positions on the node)
NEG_INF = float("-inf")  # the score of a node that cannot host the request


class ScoreCache:
    """Per-request scores and device choices for every node, valid while the node's version holds.

    Node-pure policies score one node per distinct node state (state class): a node's device choice is
    then its class's (`classes[n]` is the class it had when scored, which its unchanged version keeps
    current); other policies keep one choice per node.
    """

    __slots__ = ("class_devices", "class_scores", "classes", "devices", "log_position", "scores", "versions")

    def __init__(self, size: int) -> None:
        self.scores = np.full(size, NEG_INF)
        self.versions = np.full(size, -1, np.int64)
        self.log_position = -1  # the state's change count when last brought up to date (-1: never)
        self.devices: list[tuple[int, ...]] = [() for _ in range(size)]
        self.classes = np.full(size, -1, np.int64)
        # The request's memo over node state classes, kept across cycles: the score of every class
        # scored so far (NaN: not yet) and its device choice. An array, so that a sweep over stale
        # nodes looks up all their classes in one numpy gather.
        self.class_scores = np.full(0, np.nan)
        self.class_devices: dict[int, tuple[int, ...]] = {}

    def devices_of(self, n: int) -> tuple[int, ...]:
        cls = int(self.classes[n])
        return self.class_devices[cls] if cls >= 0 else self.devices[n]


class Policy:
    """Base class; subclasses override `score`."""

    name = "base"
    whole_gpus_only = False  # treat every GPU as whole-only (the stock device plugin)
    node_pure = True  # the score reads only the node's free resources, so equal nodes score equally
    task_aware = False  # reads the task itself (`begin_task`): equal requests may get different answers

    def attach(self, state: ClusterState, mix: ShapeMix, rng: random.Random) -> None:
        self.state = state
        self.mix = mix
        self.rng = rng

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        raise NotImplementedError

    def begin_task(self, task: TaskRequest, now_s: float) -> None:
        """The task the next `select` is for; only task-aware policies read it."""

    def know_running(self, task: RunningTask) -> None:
        """A task the snapshot lists as running (its profile, for profile-aware policies)."""

    def sla_refusal(self, task_id: str) -> SlaRefusal | None:
        """Why the last `select` for the task answered None for an online task's SLA, if it did."""
        return None

    def score_node(self, n: int, req: Request) -> Choice:
        """Node n's score and devices for `req`; NEG_INF where it cannot host it (what the engine caches).

        A policy may answer common cases directly, as long as it answers what this does."""
        devices = self.state.eligible_devices(n, req)
        if devices is None:
            return NEG_INF, ()
        return self.score(n, req, devices)

    def score_nodes(self, nodes: list[int], req: Request) -> list[Choice]:
        """`score_node` for each of `nodes`, in that order (the engine scores a request's stale nodes in
        one call, so a policy can read what depends only on the request once per sweep)."""
        return [self.score_node(n, req) for n in nodes]

    def device_threshold(self, req: Request) -> int:
        """Free milli a device of a shared-mode node needs before `score` can give the node a finite
        score (the engine's numpy pre-filter drops the other nodes without scoring them)."""
        return req.gpu_milli

    def select(self, req: Request, scores: Callable[[], ScoreCache]) -> tuple[int, tuple[int, ...]] | None:
        """The highest score wins; `argmax` returns the first maximum, i.e. the first node in order.

        `scores()` brings the request's cache up to date; a policy that can decide without it skips it.
        """
        cache = scores()
        n = int(np.argmax(cache.scores))
        if cache.scores[n] == NEG_INF:
            return None
        return n, cache.devices_of(n)

    # Shared device choices ---------------------------------------------------------------------

    def first_devices(self, req: Request, devices: list[int]) -> tuple[int, ...]:
        """Whole GPUs: idle devices are interchangeable, take the lowest indexes."""
        return tuple(devices[: req.num_gpu])

    def best_fit_devices(self, n: int, req: Request, devices: list[int]) -> tuple[int, ...]:
        """A shared GPU goes to the feasible device with the least free milli (lowest index on ties)."""
        if not req.is_share:
            return self.first_devices(req, devices)
        free = self.state.gpu_free[n]
        return (min(devices, key=lambda d: (free[d], d)),)


class RandomPolicy(Policy):
    name = "random"
    node_pure = False  # draws a device at random

    def select(self, req: Request, scores: Callable[[], ScoreCache]) -> tuple[int, tuple[int, ...]] | None:
        cache = scores()
        feasible = np.flatnonzero(cache.scores > NEG_INF)
        if len(feasible) == 0:
            return None
        n = int(feasible[self.rng.randrange(len(feasible))])
        return n, cache.devices_of(n)

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        if req.is_share:
            return 0.0, (self.rng.choice(devices),)
        return 0.0, self.first_devices(req, devices)


class DotProdPolicy(Policy):
    """Tetris-style alignment: the smaller node·task, the tighter the fit (`-dimext merge -norm max`)."""

    name = "dotprod"

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        node_cpu = s.cpu_free[n] / MAX_NODE_CPU_MILLI
        node_gpu = sum(s.gpu_free[n]) / MAX_NODE_GPU_MILLI
        task_cpu = req.cpu_milli / MAX_NODE_CPU_MILLI
        task_gpu = req.num_gpu * req.gpu_milli / MAX_NODE_GPU_MILLI
        dot = node_cpu * task_cpu + node_gpu * task_gpu
        return float(int(100 * (1 - dot / 2))), self.best_fit_devices(n, req, devices)


class ClusteringPolicy(Policy):
    """Keep tasks of one class (CPU-only, shared, k whole GPUs) together; fuller nodes first."""

    name = "clustering"
    node_pure = False  # reads the classes of the tasks a node hosts

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        if req.num_gpu == 0:
            return 0.0, ()
        s = self.state
        own = 1 if req.is_share else 1 + req.num_gpu
        # CPU-only tasks (class 0) do not enter a node's class set: the policy is about GPU classes.
        hosted = {c for c in s.classes[n] if c != 0}
        if not hosted:
            offset = 25
        elif hosted == {own}:
            offset = 75
        elif own in hosted:
            offset = 50
        else:
            offset = 0
        used = 25 * (MAX_NODE_GPU_MILLI - sum(s.gpu_free[n])) / MAX_NODE_GPU_MILLI
        return float(int(used + offset)), self.best_fit_devices(n, req, devices)


class PackingPolicy(Policy):
    """Fill partly used GPUs first, then partly used nodes, then the smallest idle node."""

    name = "packing"

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        if req.num_gpu == 0:
            return 0.0, ()
        free = self.state.gpu_free[n]
        chosen = self.best_fit_devices(n, req, devices)
        if all(f == WHOLE_GPU_MILLI for f in free):
            return float(33 - len(free)), chosen
        if all(free[d] < WHOLE_GPU_MILLI for d in chosen):
            used_free_pct = sum(free[d] / 10 for d in chosen)
            return float(int(max(50.0, 100 - used_free_pct / 10))), chosen
        fully_free_used = sum(1 for d in chosen if free[d] == WHOLE_GPU_MILLI)
        return float(max(33, 50 - fully_free_used)), chosen


class BestFitPolicy(Policy):
    """Least CPU and GPU left over after placement, each normalised to the max node spec."""

    name = "bestfit"

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        left_cpu = (s.cpu_free[n] - req.cpu_milli) / MAX_NODE_CPU_MILLI
        left_gpu = (sum(s.gpu_free[n]) - req.num_gpu * req.gpu_milli) / MAX_NODE_GPU_MILLI
        leftover = 0.5 * left_cpu + 0.5 * left_gpu
        return float(int(100 * (1 - leftover))), self.best_fit_devices(n, req, devices)


class K8sDefaultPolicy(Policy):
    """A stock cluster: whole GPUs per task (NVIDIA device plugin), LeastAllocated CPU/memory spreading."""

    name = "k8s-default"
    whole_gpus_only = True

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        cpu_left = (s.cpu_free[n] - req.cpu_milli) / s.cpu_total[n] if s.cpu_total[n] else 0.0
        mem_left = (s.mem_free[n] - req.mem_mib) / s.mem_total[n] if s.mem_total[n] else 0.0
        return float(int(100 * (cpu_left + mem_left) / 2)), self.first_devices(req, devices)


def fgd_score(delta_milli: float) -> int:
    """The simulator's integer node score: floor(100·sigmoid(−Δ/1000)), Δ in GPU milli."""
    x = delta_milli / 1000
    if x > 700:
        return 0
    return int(100 / (1 + math.exp(x)))


class FgdPolicy(Policy):
    """Fragmentation Gradient Descent: the node and device whose placement grows `F_n` the least (§2)."""

    name = "fgd"

    def attach(self, state: ClusterState, mix: ShapeMix, rng: random.Random) -> None:
        super().attach(state, mix, rng)
        self.by_model: dict[str | None, ModelMix] = {m: model_mix(mix, m) for m in set(state.models)}
        self.frag_memo: dict[tuple[str | None, int, tuple[int, ...]], float] = {}
        self.choice_memo: dict[tuple[object, ...], Choice] = {}

    def frag(self, model: str | None, cpu_free: int, gpu_free: list[int]) -> float:
        key = (model, cpu_free, tuple(sorted(gpu_free)))
        value = self.frag_memo.get(key)
        if value is None:
            value = node_fragmentation_milli(cpu_free, gpu_free, self.by_model[model])
            self.frag_memo[key] = value
        return value

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        model = s.models[n]
        cpu = s.cpu_free[n]
        gpus = s.gpu_free[n]
        key = (model, cpu, tuple(gpus), req.cpu_milli, req.num_gpu, req.gpu_milli, tuple(devices))
        cached = self.choice_memo.get(key)
        if cached is not None:
            return cached
        choice = self._choose(model, cpu, gpus, req, devices)
        self.choice_memo[key] = choice
        return choice

    def _choose(
        self, model: str | None, cpu: int, gpus: list[int], req: Request, devices: list[int]
    ) -> Choice:
        before = self.frag(model, cpu, gpus)
        after_cpu = cpu - req.cpu_milli
        if req.num_gpu == 0:
            return float(fgd_score(self.frag(model, after_cpu, gpus) - before)), ()
        if not req.is_share:
            chosen = self.first_devices(req, devices)
            after = list(gpus)
            for d in chosen:
                after[d] -= req.gpu_milli
            return float(fgd_score(self.frag(model, after_cpu, after) - before)), chosen
        best: Choice = (-1.0, ())
        for d in devices:
            after = list(gpus)
            after[d] -= req.gpu_milli
            value = float(fgd_score(self.frag(model, after_cpu, after) - before))
            if value > best[0]:
                best = (value, (d,))
        return best


BASELINES: dict[str, Callable[[], Policy]] = {
    "random": RandomPolicy,
    "dotprod": DotProdPolicy,
    "clustering": ClusteringPolicy,
    "packing": PackingPolicy,
    "bestfit": BestFitPolicy,
    "fgd": FgdPolicy,
    "k8s-default": K8sDefaultPolicy,
}
