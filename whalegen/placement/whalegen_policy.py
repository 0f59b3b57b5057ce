"""The `whalegen` policy (experimental options; documented in docs/placement.md once settled)."""

from __future__ import annotations

import random

from whalegen.placement.policies import NEG_INF, Choice, Policy, ScoreCache, fgd_score
from whalegen.placement.state import ClusterState, Request
from whalegen.placement.types import WHOLE_GPU_MILLI, PartitionMode, ShapeMix

Row = tuple[float, int, int, int, int]  # (weight, cpu_milli, mem_mib, num_gpu, gpu_milli)


class WhalegenPolicy(Policy):
    name = "whalegen"

    def __init__(self, **options: str) -> None:
        self.use_mem = options.get("memory", "1") == "1"
        self.sumsq = options.get("sumsq", "1") == "1"
        self.closed = options.get("closed", "1") == "1"
        self.strand = options.get("strand", "1") == "1"

    def attach(self, state: ClusterState, mix: ShapeMix, rng: random.Random) -> None:
        super().attach(state, mix, rng)
        self.rows: dict[str | None, tuple[float, tuple[Row, ...]]] = {}
        for model in set(state.models):
            base = 0.0
            rows: list[Row] = []
            for shape, weight in zip(mix.shapes, mix.weights, strict=True):
                allowed = not shape.allowed_models or (model is not None and model in shape.allowed_models)
                if shape.num_gpu == 0 or not allowed:
                    base += weight
                else:
                    mem = shape.mem_mib if self.use_mem else 0
                    rows.append((weight, shape.cpu_milli, mem, shape.num_gpu, shape.gpu_milli))
            self.rows[model] = (base, tuple(rows))
        # CPU and host memory the expected GPU work brings per GPU (weighted by GPU volume).
        volume = sum(w * sh.num_gpu * sh.gpu_milli for sh, w in zip(mix.shapes, mix.weights, strict=True))
        cpu_total = sum(w * sh.cpu_milli for sh, w in zip(mix.shapes, mix.weights, strict=True) if sh.num_gpu)
        mem_total = sum(w * sh.mem_mib for sh, w in zip(mix.shapes, mix.weights, strict=True) if sh.num_gpu)
        self.cpu_per_milli = cpu_total / volume if volume else 0.0
        self.mem_per_milli = mem_total / volume if volume else 0.0
        shares = [sh.gpu_milli for sh in mix.shapes if sh.num_gpu == 1 and sh.gpu_milli < WHOLE_GPU_MILLI]
        # Gaps smaller than every share the mix expects can never be filled: they are closed bins.
        self.min_share = min(shares) if shares and self.closed else 1
        self.frag_memo: dict[tuple[object, ...], float] = {}
        self.choice_memo: dict[tuple[object, ...], Choice] = {}
        # Gap index: partly used shared GPUs by free milli (the "bins" of sum-of-squares packing).
        self.gaps: dict[int, set[tuple[int, int]]] = {}
        self.registered: list[list[int]] = [[0] * count for count in state.gpu_count]
        for n in range(len(state)):
            self._reindex(n)
        state.listeners.append(self._reindex)

    def _reindex(self, n: int) -> None:
        s = self.state
        old = self.registered[n]
        for d, free in enumerate(s.gpu_free[n]):
            gap = free if (0 < free < WHOLE_GPU_MILLI and s.modes[n][d] is PartitionMode.SHARED) else 0
            if gap == old[d]:
                continue
            if old[d]:
                members = self.gaps[old[d]]
                members.discard((n, d))
                if not members:
                    del self.gaps[old[d]]
            if gap:
                self.gaps.setdefault(gap, set()).add((n, d))
            old[d] = gap

    # -- node measure ------------------------------------------------------------------------------

    def frag(self, model: str | None, cpu: int, mem: int, gpus: list[int]) -> float:
        key = (model, cpu, mem, tuple(sorted(gpus)))
        value = self.frag_memo.get(key)
        if value is not None:
            return value
        idle = sum(gpus)
        base, rows = self.rows[model]
        value = base * idle
        for weight, cpu_m, mem_m, k, milli in rows:
            if cpu < cpu_m or mem < mem_m:
                value += weight * idle
                continue
            fitting = 0
            small = 0
            for g in gpus:
                if g >= milli:
                    fitting += 1
                else:
                    small += g
            value += weight * (idle if fitting < k else small)
        if self.strand:
            # Idle GPU this node's free CPU or memory cannot feed at the mix's CPU and memory per GPU.
            reachable = float(idle)
            if self.cpu_per_milli:
                reachable = min(reachable, cpu / self.cpu_per_milli)
            if self.mem_per_milli and self.use_mem:
                reachable = min(reachable, mem / self.mem_per_milli)
            value += idle - reachable
        self.frag_memo[key] = value
        return value

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        model = s.models[n]
        cpu = s.cpu_free[n]
        mem = s.mem_free[n]
        gpus = s.gpu_free[n]
        share = req.is_share and self.sumsq
        key = (model, cpu, mem, tuple(gpus), req.cpu_milli, req.mem_mib, req.num_gpu, req.gpu_milli, share)
        cached = self.choice_memo.get(key)
        if cached is not None:
            return cached
        before = self.frag(model, cpu, mem, gpus)
        cpu2 = cpu - req.cpu_milli
        mem2 = mem - req.mem_mib
        choice: Choice
        if req.num_gpu == 0:
            choice = (float(fgd_score(self.frag(model, cpu2, mem2, gpus) - before)), ())
        elif share:
            # Only the opening of a fresh GPU is scored per node; partly used GPUs go through the gap index.
            fresh = [d for d in devices if gpus[d] == WHOLE_GPU_MILLI]
            if not fresh:
                choice = (NEG_INF, ())
            else:
                after = list(gpus)
                after[fresh[0]] -= req.gpu_milli
                choice = (float(fgd_score(self.frag(model, cpu2, mem2, after) - before)), (fresh[0],))
        elif not req.is_share:
            chosen = self.first_devices(req, devices)
            after = list(gpus)
            for d in chosen:
                after[d] -= req.gpu_milli
            choice = (float(fgd_score(self.frag(model, cpu2, mem2, after) - before)), chosen)
        else:
            choice = (NEG_INF, ())
            for d in devices:
                after = list(gpus)
                after[d] -= req.gpu_milli
                value = float(fgd_score(self.frag(model, cpu2, mem2, after) - before))
                if value > choice[0]:
                    choice = (value, (d,))
        self.choice_memo[key] = choice
        return choice

    # -- selection ---------------------------------------------------------------------------------

    def select(self, req: Request, cache: ScoreCache) -> tuple[int, tuple[int, ...]] | None:
        if not (req.is_share and self.sumsq):
            return super().select(req, cache)
        s = self.state
        size = req.gpu_milli
        counts = {gap: len(members) for gap, members in self.gaps.items() if gap >= self.min_share}
        options: list[tuple[int, int, int]] = []  # (Δ sum of squares, leftover, gap); gap 0 = fresh GPU
        for gap, members in self.gaps.items():
            if gap < size:
                continue
            count = counts.get(gap, 0)
            left = gap - size
            delta = -2 * count + 1 + (2 * counts.get(left, 0) + 1 if left >= self.min_share else 0)
            options.append((delta, left, gap))
        fresh_left = WHOLE_GPU_MILLI - size
        fresh_delta = 2 * counts.get(fresh_left, 0) + 1 if fresh_left >= self.min_share else 0
        options.append((fresh_delta, fresh_left, 0))
        options.sort()
        for _, _, gap in options:
            if gap == 0:
                pick = super().select(req, cache)
                if pick is not None:
                    return pick
                continue
            members = sorted(self.gaps[gap])
            for n, d in members:
                if (
                    s.cpu_free[n] >= req.cpu_milli
                    and s.mem_free[n] >= req.mem_mib
                    and s.schedulable[n]
                    and s.model_allowed(n, req)
                    and s.gpu_mem_free[n][d] >= req.gpu_mem_mib
                ):
                    return n, (d,)
        return None
