"""The `whalegen` policy: FGD's descent, on a measure that also counts what CPU, host memory and model
scarcity strand, with shared GPUs packed after an optimal plan of the mix's shares.

Why each part leaves fewer fragments (measured in docs/placement.md):

1. **Stranded GPU.** FGD counts only idle GPU that no expected shape can use *by size*. On the openb
   cluster most GPUs sit on 8-GPU nodes with 12 cores and 48 GiB per GPU, while the work brings about
   11 cores per GPU on average and some tasks far more: a node whose free CPU or host memory runs out
   first keeps idle GPUs nobody can start on. The node measure adds `idle − min(idle, cpu/ρ_cpu,
   mem/ρ_mem)`: the idle GPU the node's free CPU and memory cannot feed at the mix's own CPU and memory
   per GPU (ρ, volume-weighted over GPU shapes, so CPU-only work does not count). CPU-heavy and CPU-only
   tasks then drift to CPU-rich nodes (T4 × 2 carries 52 cores per GPU) instead of starving G2 nodes.
   Host memory also enters each shape's feasibility, as CPU does in FGD.
2. **Model scarcity.** Type-constrained work can only use some models. Placing any GPU work on model M
   displaces, in expectation, the fraction of M's capacity that constrained work will need relative to
   M's share of the cluster (`pressure(M)`, capped at 1). It is added to Δ in GPU milli, the unit of Δ.
3. **Sum-of-squares packing for shared GPUs.** A partly used GPU is a bin with a gap. A share goes to
   the gap (or a fresh GPU) that minimises Σ_h N(h)², N(h) the number of GPUs with gap h (Csirik et al.,
   "On the sum-of-squares algorithm for bin packing", STOC 2000): gap sizes stay balanced, so arriving
   shares keep finding exact complements. Gaps smaller than every expected share are closed and not
   counted. The fresh GPU, when chosen, is on the node FGD's descent prefers; within a gap size the
   first node in order that has the CPU and memory wins. Since the share plan (4.) this is the fallback
   for shares the plan has no place for.
4. **Share plan.** At saturation no GPU is fresh and the unallocated GPU is the sum of the gaps; a gap is
   final once no later share fits it, so the loss is decided by which shares end up together. The mix
   gives the share sizes and their rates, so the packing that uses the fewest GPUs per arriving share is
   a small LP over per-GPU share sets (`share_plan`, solved once by `fewest_bins`). Sum-of-squares
   balances gap counts, and on a distribution with unavoidable waste (810-milli shares leave 190 milli
   that almost nothing fills) it also balances the dead gaps and pairs shares the optimum does not
   (550 + 320 and 650 + 230 instead of 650 + 320 and 550 + 230 + 220); Csirik et al. fix this with the
   distribution's LP, as here. Online: a share takes a GPU that waits for its size (first in node
   order); otherwise the tightest room no plan claims; otherwise it opens a fresh GPU with the plan's
   share set that lags most behind its planned rate, on the best-scored node that can still start the
   shares the GPU will wait for; only when no fresh GPU fits does sum-of-squares place it in a gap.
5. **Keeping CPU and memory for waiting shares.** A GPU waiting for a share is lost if its node's CPU
   or memory goes first. Each node keeps the mean CPU and memory (over the mix's shapes of that size)
   of the shares its GPUs wait for: a new planned GPU needs that much left on its node, other work
   prefers nodes where it leaves the kept amount free (the best node otherwise), and a share filling a
   slot prefers a node where its other waiting shares keep theirs.

Everything is derived from the shape mix and the cluster; there are no constants fitted to a workload.
Options (`whalegen:memory=0`, `strand=0`, `scarcity=0`, `sumsq=0`, `plan=0`, `spare=0`) switch one idea
off for ablations (`sumsq=0` also switches the plan off).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import numpy.typing as npt

from whalegen.placement.policies import NEG_INF, Choice, Policy, ScoreCache, fgd_score
from whalegen.placement.state import ClusterState, Request
from whalegen.placement.types import WHOLE_GPU_MILLI, Isolation, PartitionMode, ShapeMix

# (gpu_milli, ((weight, cpu_milli, mem_mib, num_gpu), …)) per group of shapes sharing a GPU size.
Groups = tuple[tuple[int, tuple[tuple[float, int, int, int], ...]], ...]
MAX_PATTERNS = 5_000  # a bound on the LP's size (computation), not a tuned figure
OPTIONS = ("memory", "strand", "scarcity", "sumsq", "plan", "spare")


class WhalegenPolicy(Policy):
    name = "whalegen"

    def __init__(self, **options: str) -> None:
        unknown = set(options) - set(OPTIONS)
        if unknown or any(value not in {"0", "1"} for value in options.values()):
            raise ValueError(f"whalegen options are {', '.join(OPTIONS)} set to 0 or 1, got {options}")
        self.use_memory = options.get("memory", "1") == "1"
        self.strand = options.get("strand", "1") == "1"
        self.scarcity = options.get("scarcity", "1") == "1"
        self.sumsq = options.get("sumsq", "1") == "1"
        self.use_plan = options.get("plan", "1") == "1"
        self.spare = options.get("spare", "1") == "1"

    def attach(self, state: ClusterState, mix: ShapeMix, rng: random.Random) -> None:
        super().attach(state, mix, rng)
        pairs = list(zip(mix.shapes, mix.weights, strict=True))
        # 1. Per-model view of the mix: shapes that can never use the model collapse into a base weight.
        self.groups: dict[str | None, tuple[float, Groups]] = {}
        self.cuts: dict[str | None, tuple[list[int], list[int]]] = {}
        for model in set(state.models):
            base = 0.0
            by_milli: dict[int, list[tuple[float, int, int, int]]] = {}
            for shape, weight in pairs:
                allowed = not shape.allowed_models or (model is not None and model in shape.allowed_models)
                if shape.num_gpu == 0 or not allowed:
                    base += weight
                    continue
                mem = shape.mem_mib if self.use_memory else 0
                by_milli.setdefault(shape.gpu_milli, []).append((weight, shape.cpu_milli, mem, shape.num_gpu))
            self.groups[model] = (base, tuple((m, tuple(rows)) for m, rows in sorted(by_milli.items())))
            requests = [row for _, rows in by_milli.items() for row in rows]
            self.cuts[model] = (sorted({r[1] for r in requests}), sorted({r[2] for r in requests}))
        # 2. CPU and host memory the expected GPU work brings per GPU milli (volume-weighted).
        volume = sum(w * sh.num_gpu * sh.gpu_milli for sh, w in pairs)
        cpu_total = sum(w * sh.cpu_milli for sh, w in pairs if sh.num_gpu)
        mem_total = sum(w * sh.mem_mib for sh, w in pairs if sh.num_gpu)
        self.cpu_per_milli = cpu_total / volume if volume else 0.0
        self.mem_per_milli = mem_total / volume if volume and self.use_memory else 0.0
        # 3. Model pressure from type-constrained shapes.
        supply: dict[str | None, int] = {}
        for n, model in enumerate(state.models):
            supply[model] = supply.get(model, 0) + WHOLE_GPU_MILLI * state.gpu_count[n]
        total_supply = sum(supply.values())
        pressure: dict[str | None, float] = {}
        for sh, w in pairs:
            eligible = sum(supply.get(m, 0) for m in sh.allowed_models)
            if not sh.num_gpu or not eligible or not volume:
                continue
            demand_share = w * sh.num_gpu * sh.gpu_milli / volume
            for m in sh.allowed_models:
                pressure[m] = pressure.get(m, 0.0) + demand_share * total_supply / eligible
        self.pressure = {m: min(1.0, p) for m, p in pressure.items()} if self.scarcity else {}
        # 4. Sum-of-squares bookkeeping: partly used shared GPUs by gap; gaps below every share are closed.
        shares = [sh.gpu_milli for sh in mix.shapes if sh.num_gpu == 1 and sh.gpu_milli < WHOLE_GPU_MILLI]
        self.min_share = min(shares) if shares else WHOLE_GPU_MILLI
        # Members are coded `n * width + d`, so that the smallest code is the first (node, device) in
        # node order; finding the first member whose node has the CPU and memory is one numpy sweep.
        self.width = max(state.gpu_count, default=0) or 1
        self.gaps: dict[int, set[int]] = {}
        self.allowed_masks: dict[Request, npt.NDArray[np.bool_]] = {}
        self.registered: list[list[int]] = [[0] * count for count in state.gpu_count]
        # 5. The share plan (see `share_plan`): per-GPU share sets of an optimal packing of the mix's
        # shares, the GPUs that wait for shares of the plan, and what those shares are expected to bring.
        self.plan = share_plan(mix) if self.use_plan and self.sumsq else SharePlan((), {})
        self.opened = [0] * len(self.plan.patterns)  # GPUs opened per pattern
        self.planned: dict[int, tuple[int, ...]] = {}  # code -> share sizes the GPU still waits for
        self.slots: dict[int, set[int]] = {}  # share size -> codes of the GPUs waiting for one
        self.reserved_cpu = np.zeros(len(state), np.int64)  # per node, kept for its waiting shares
        self.reserved_mem = np.zeros(len(state), np.int64)
        self.expected_request = _expected_share_requests(mix)
        self.seen_free: list[list[int]] = [[0] * count for count in state.gpu_count]
        self.opening: tuple[int, tuple[int, ...], int] | None = None  # (code, waiting, share size)
        # Every set of shares that completes part of a pattern, largest total first (for adopted gaps).
        self.fillers = sorted(
            {(sum(sub), sub) for pattern in self.plan.patterns for sub in _sub_multisets(pattern)},
            reverse=True,
        )
        self.share_requests: dict[tuple[str | None, int], list[tuple[int, int]]] = {}
        for model, (_, groups) in self.groups.items():
            for milli, rows in groups:
                for _, cpu_m, mem_m, k in rows:
                    if k == 1 and milli < WHOLE_GPU_MILLI:
                        self.share_requests.setdefault((model, milli), []).append((cpu_m, mem_m))
        self.frag_memo: dict[tuple[object, ...], float] = {}
        # Each node's measure as it is (None: not computed since its last change; see `_before`).
        self.before_value: list[float | None] = [None] * len(state)
        for n in range(len(state)):
            self._reindex(n)
        state.listen(self._reindex)

    def _reindex(self, n: int) -> None:
        s = self.state
        self.before_value[n] = None  # the node changed: its measure is recomputed when next asked
        registered = self.registered[n]
        for d, free in enumerate(s.gpu_free[n]):
            gap = free if 0 < free < WHOLE_GPU_MILLI and s.modes[n][d] is PartitionMode.SHARED else 0
            old = registered[d]
            if gap == old:
                continue
            if old:
                members = self.gaps[old]
                members.discard(n * self.width + d)
                if not members:
                    del self.gaps[old]
            if gap:
                self.gaps.setdefault(gap, set()).add(n * self.width + d)
            registered[d] = gap
        if not self.plan.patterns:
            return
        # Plans follow what really lands on a GPU (a wrapper policy may move the pick): a share of a
        # size the GPU waits for takes that slot; a fresh GPU opened for the plan starts waiting when the
        # share that opened it lands there. A plan stays while the gap still holds what it waits for. A
        # gap that grew (a share left, or the GPU came with the snapshot) waits for the largest set of the
        # plan's shares that fits it and that the node could start.
        seen = self.seen_free[n]
        opening = self.opening
        for d, free in enumerate(s.gpu_free[n]):
            code = n * self.width + d
            waiting = self.planned.get(code)
            taken = seen[d] - free
            if taken > 0 and waiting is not None and taken in waiting:
                waiting = _without(waiting, taken)
                self._set_plan(code, waiting)
            elif taken > 0 and opening is not None and opening[0] == code and opening[2] == taken:
                waiting = opening[1]
                self._set_plan(code, waiting)
            if code in self.planned and (not registered[d] or sum(self.planned[code]) > free):
                self._drop_plan(code)
            if code not in self.planned and registered[d] and taken < 0:
                self._adopt(n, d, free)
            seen[d] = free
        if opening is not None and opening[0] // self.width == n:
            self.opening = None

    # -- node measure ------------------------------------------------------------------------------

    def frag(self, model: str | None, cpu: int, mem: int, gpus: list[int]) -> float:
        """Expected unusable idle GPU (milli): FGD's measure with host memory, plus stranded GPU."""
        ordered = tuple(sorted(gpus))
        idle = sum(ordered)
        # The shape part depends on CPU and memory only through which shape requests they cover, so it
        # is memoised on those ranks; the stranded part is plain arithmetic on the exact figures.
        cpu_cuts, mem_cuts = self.cuts[model]
        key = (model, bisect_right(cpu_cuts, cpu), bisect_right(mem_cuts, mem), ordered)
        value = self.frag_memo.get(key)
        if value is None:
            value = self._shape_part(model, cpu, mem, ordered, idle)
            self.frag_memo[key] = value
        if self.strand and idle:
            reachable = float(idle)
            if self.cpu_per_milli:
                reachable = min(reachable, cpu / self.cpu_per_milli)
            if self.mem_per_milli:
                reachable = min(reachable, mem / self.mem_per_milli)
            value += idle - reachable
        return value

    def _shape_part(
        self, model: str | None, cpu: int, mem: int, ordered: tuple[int, ...], idle: int
    ) -> float:
        base, groups = self.groups[model]
        value = base * idle
        count = len(ordered)
        # `ordered` is sorted, so per GPU size the devices too small for it are a prefix: one bisection
        # and a prefix sum instead of a pass over the devices per size (integers: the same figures).
        prefix = [0, *accumulate(ordered)]
        for milli, rows in groups:
            small_devices = bisect_left(ordered, milli)
            fitting = count - small_devices
            small = prefix[small_devices]
            for weight, cpu_m, mem_m, k in rows:
                if cpu < cpu_m or mem < mem_m or fitting < k:
                    value += weight * idle
                else:
                    value += weight * small
        return value

    def _value(self, delta: float, req: Request, model: str | None) -> float:
        delta += self.pressure.get(model, 0.0) * req.num_gpu * req.gpu_milli
        return float(fgd_score(delta))

    def _before(self, n: int) -> float:
        """The node's measure as it is: the same for every request until the node changes (every change
        reaches `_reindex`, which forgets it)."""
        before = self.before_value[n]
        if before is None:
            s = self.state
            before = self.frag(s.models[n], s.cpu_free[n], s.mem_free[n], s.gpu_free[n])
            self.before_value[n] = before
        return before

    def score_node(self, n: int, req: Request) -> Choice:
        return self.score_nodes([n], req)[0]

    def score_nodes(self, nodes: list[int], req: Request) -> list[Choice]:
        """`score` after the engine's filter, in one step for the common case: a node of shared-mode
        GPUs and no GPU-memory bound (every node of the trace clusters), where feasibility is CPU,
        memory, model and free milli, and the candidate device is fixed (see `score`). It is the
        engine's innermost loop (about 850,000 node scorings on the 5,000-node bench), so `frag`,
        `_before` and `_value` are written out here, and what depends only on the request is read once
        per sweep; the property test holds it to the generic path. Every float operation is the one
        `frag` and `_value` make, in their order, so the scores are the same to the last bit."""
        s = self.state
        num_gpu = req.num_gpu
        milli = req.gpu_milli
        share = num_gpu == 1 and milli < WHOLE_GPU_MILLI
        generic = bool(req.gpu_mem_mib) or (share and not self.sumsq)
        mig_only = bool(num_gpu) and req.isolation is Isolation.MIG
        allowed = req.allowed_models if num_gpu else frozenset()
        req_cpu, req_mem = req.cpu_milli, req.mem_mib
        plain, schedulable, models = s.plain, s.schedulable, s.models
        cpu_free, mem_free, gpu_free = s.cpu_free, s.mem_free, s.gpu_free
        before_value, frag_memo, cuts = self.before_value, self.frag_memo, self.cuts
        strand, cpu_per_milli, mem_per_milli = self.strand, self.cpu_per_milli, self.mem_per_milli
        pressure = self.pressure
        extras: dict[str | None, float] = {}  # per model: the scarcity term, the same for every node
        exp = math.exp
        out: list[Choice] = []
        for n in nodes:
            if generic or not plain[n]:
                out.append(super().score_node(n, req))
                continue
            cpu = cpu_free[n] - req_cpu
            mem = mem_free[n] - req_mem
            if not schedulable[n] or cpu < 0 or mem < 0:
                out.append((NEG_INF, ()))
                continue
            model = models[n]
            if allowed and (model is None or model not in allowed):
                out.append((NEG_INF, ()))
                continue
            gpus = gpu_free[n]
            chosen: tuple[int, ...] = ()
            if num_gpu:
                if mig_only:
                    out.append((NEG_INF, ()))
                    continue
                if share:
                    # Partly used GPUs are offered through the gap index: per node only the first fresh one.
                    if WHOLE_GPU_MILLI not in gpus:
                        out.append((NEG_INF, ()))
                        continue
                    chosen = (gpus.index(WHOLE_GPU_MILLI),)
                else:
                    chosen = tuple([d for d, free in enumerate(gpus) if free >= milli][:num_gpu])
                    if len(chosen) < num_gpu:
                        out.append((NEG_INF, ()))
                        continue
                gpus = list(gpus)
                for d in chosen:
                    gpus[d] -= milli
            # `frag(model, cpu, mem, gpus)`:
            ordered = tuple(sorted(gpus))
            idle = sum(ordered)
            cpu_cuts, mem_cuts = cuts[model]
            key = (model, bisect_right(cpu_cuts, cpu), bisect_right(mem_cuts, mem), ordered)
            after = frag_memo.get(key)
            if after is None:
                after = frag_memo[key] = self._shape_part(model, cpu, mem, ordered, idle)
            if strand and idle:
                # `min(reachable, x)` written out: it keeps `reachable` unless x is smaller, as `min` does.
                reachable = float(idle)
                if cpu_per_milli and (fed := cpu / cpu_per_milli) < reachable:
                    reachable = fed
                if mem_per_milli and (fed := mem / mem_per_milli) < reachable:
                    reachable = fed
                after += idle - reachable
            # `_value(after − _before(n), req, model)`:
            before = before_value[n]
            if before is None:
                before = before_value[n] = self.frag(model, cpu_free[n], mem_free[n], gpu_free[n])
            delta = after - before
            extra = extras.get(model)
            if extra is None:
                extra = extras[model] = pressure.get(model, 0.0) * num_gpu * milli
            delta += extra
            x = delta / 1000
            out.append(((0.0 if x > 700 else float(int(100 / (1 + exp(x))))), chosen))
        return out

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        model = s.models[n]
        cpu = s.cpu_free[n]
        mem = s.mem_free[n]
        gpus = s.gpu_free[n]
        # No memo of the choice here: the engine memoises scores on the whole node state.
        before = self._before(n)
        cpu_after = cpu - req.cpu_milli
        mem_after = mem - req.mem_mib
        choice: Choice
        if req.num_gpu == 0:
            choice = (self._value(self.frag(model, cpu_after, mem_after, gpus) - before, req, model), ())
        else:
            if not req.is_share:
                candidates: list[tuple[int, ...]] = [self.first_devices(req, devices)]
            elif self.sumsq:
                # Partly used shared GPUs are offered through the gap index; per node a fresh GPU is
                # scored, and so is every MIG GPU with room (MIG slices are not in the gap index), the
                # fullest first so that equal scores fill a partly used MIG GPU and keep fresh ones whole.
                fresh = [d for d in devices if gpus[d] == WHOLE_GPU_MILLI]
                if s.plain[n]:
                    candidates = [(fresh[0],)] if fresh else []
                else:
                    modes = s.modes[n]
                    mig = sorted((d for d in devices if modes[d] is PartitionMode.MIG), key=lambda d: gpus[d])
                    other = [d for d in fresh if modes[d] is not PartitionMode.MIG]
                    candidates = [(d,) for d in mig]
                    candidates += [(other[0],)] if other else []
            else:
                candidates = [(d,) for d in devices]
            plain = s.plain[n]
            choice = (NEG_INF, ())
            for chosen in candidates:
                after = list(gpus)
                waste = 0
                for d in chosen:
                    held = req.gpu_milli if plain else s.held_milli(n, d, req)
                    after[d] -= held
                    if not plain and s.mig_free[n][d] is not None:
                        # A carved instance larger than the ask: what it holds beyond the ask is lost to
                        # everyone while the task runs, a fragment the measure does not see (the GPU
                        # looks full). Counted as one, a small task takes the smallest instance around,
                        # not a 7g that would leave "no fragment".
                        waste += max(held - req.gpu_milli, 0)
                value = self._value(
                    self.frag(model, cpu_after, mem_after, after) - before + waste, req, model
                )
                if value > choice[0]:
                    choice = (value, chosen)
        return choice

    def device_threshold(self, req: Request) -> int:
        if req.is_share and self.sumsq and req.isolation is not Isolation.MIG:
            # Gaps are offered by `select`; per node only a fresh GPU is scored (see `score`).
            return WHOLE_GPU_MILLI
        return req.gpu_milli

    # -- selection ---------------------------------------------------------------------------------

    def select(self, req: Request, scores: Callable[[], ScoreCache]) -> tuple[int, tuple[int, ...]] | None:
        self.opening = None  # a pick the engine did not bind (an undone gang) opens nothing
        if not (req.is_share and self.sumsq) or req.isolation is Isolation.MIG:
            # The gap index holds shared-mode GPUs only; a MIG-only request is scored per node.
            if self.planned and self.spare:
                return self._select_sparing(req, scores)
            return super().select(req, scores)
        size = req.gpu_milli
        if size in self.plan.by_size:
            pick = self._planned_pick(req, scores)
            if pick is not None:
                return pick
        floor = self.min_share
        counts = {gap: len(members) for gap, members in self.gaps.items() if gap >= floor}
        # (Δ Σ N², gap left, gap used); gap used 0 = open a fresh GPU.
        options: list[tuple[int, int, int]] = []
        for gap in self.gaps:
            if gap < size:
                continue
            left = gap - size
            delta = 1 - 2 * counts.get(gap, 0) if gap >= floor else 0
            delta += 2 * counts.get(left, 0) + 1 if left >= floor else 0
            options.append((delta, left, gap))
        fresh_left = WHOLE_GPU_MILLI - size
        options.append((2 * counts.get(fresh_left, 0) + 1 if fresh_left >= floor else 0, fresh_left, 0))
        options.sort()
        for _, _, gap in options:
            if gap == 0:
                # Only now are the per-node scores of opening a fresh GPU needed.
                pick = super().select(req, scores)
                if pick is not None:
                    return pick
                continue
            pick = self._first_fitting(gap, req)
            if pick is not None:
                return pick
        return None

    def _first_fitting(
        self, gap: int, req: Request, skip_planned: bool = False
    ) -> tuple[int, tuple[int, ...]] | None:
        """The first member of a gap size, in node order, whose node has the CPU, memory and model."""
        s = self.state
        members = self.gaps[gap]
        if skip_planned:
            members = members - self.planned.keys()
            if not members:
                return None
        codes = np.fromiter(members, np.int64, len(members))
        nodes = codes // self.width
        ok = self._can_start(nodes, req)
        fitting = codes[ok]
        if len(fitting) and not req.gpu_mem_mib:
            n, d = divmod(int(fitting.min()), self.width)
            return n, (d,)
        for code in np.sort(fitting).tolist():
            n, d = divmod(code, self.width)
            if s.gpu_mem_free[n][d] >= req.gpu_mem_mib:
                return n, (d,)
        return None

    # -- share plan ----------------------------------------------------------------------------------

    def _reserve(self, code: int, waiting: tuple[int, ...], sign: int) -> None:
        n = code // self.width
        self.reserved_cpu[n] += sign * sum(self.expected_request[t][0] for t in waiting)
        self.reserved_mem[n] += sign * sum(self.expected_request[t][1] for t in waiting)

    def _drop_plan(self, code: int) -> None:
        self._reserve(code, self.planned.get(code, ()), -1)
        for size in set(self.planned.pop(code, ())):
            members = self.slots.get(size)
            if members is not None:
                members.discard(code)
                if not members:
                    del self.slots[size]

    def _set_plan(self, code: int, waiting: tuple[int, ...]) -> None:
        self._drop_plan(code)
        if not waiting:
            return
        self.planned[code] = waiting
        self._reserve(code, waiting, 1)
        for size in set(waiting):
            self.slots.setdefault(size, set()).add(code)

    def _planned_pick(
        self, req: Request, scores: Callable[[], ScoreCache]
    ) -> tuple[int, tuple[int, ...]] | None:
        size = req.gpu_milli
        members = self.slots.get(size)
        if members:
            pick = self._first_member(members, req)
            if pick is not None:
                return pick  # the slot is taken when the share lands (`_reindex`)
        # Room nobody waits for (a GPU the plan leaves alone, or one whose set is complete but still has
        # room): the tightest that fits, before a fresh GPU is opened.
        for gap in sorted(g for g in self.gaps if g >= size):
            pick = self._first_fitting(gap, req, skip_planned=True)
            if pick is not None:
                return pick
        return self._open_planned(req, scores)

    def _select_sparing(
        self, req: Request, scores: Callable[[], ScoreCache]
    ) -> tuple[int, tuple[int, ...]] | None:
        """The best-scored node where the request leaves what the node keeps for waiting shares; the
        best node overall when there is none."""
        cache = scores()
        state = self.state
        best = int(np.argmax(cache.scores))
        if cache.scores[best] == NEG_INF:
            return None
        # The first best node overall is also the first best among sparing ones when it spares (one
        # that came before it would have been the first best overall): the mask is only needed otherwise.
        if (
            state.cpu_free[best] - req.cpu_milli >= self.reserved_cpu[best]
            and state.mem_free[best] - req.mem_mib >= self.reserved_mem[best]
        ):
            return best, cache.devices_of(best)
        spare = (state.np_cpu_free - req.cpu_milli >= self.reserved_cpu) & (
            state.np_mem_free - req.mem_mib >= self.reserved_mem
        )
        masked = np.where(spare, cache.scores, NEG_INF)
        n = int(np.argmax(masked))
        if masked[n] == NEG_INF:
            n = best
        return n, cache.devices_of(n)

    def _open_planned(
        self, req: Request, scores: Callable[[], ScoreCache]
    ) -> tuple[int, tuple[int, ...]] | None:
        """A fresh GPU for a share the plan pairs with others, on the best-scored node that can still
        start those others (beyond what it keeps already); the best node without a plan otherwise."""
        size = req.gpu_milli
        cache = scores()
        state = self.state
        best = int(np.argmax(cache.scores))
        if cache.scores[best] == NEG_INF:
            return None
        # What the first best node overall keeps after the share; when it can start a pattern's waiting
        # shares it is that pattern's node (see `_select_sparing`), and the masks over all nodes are
        # built only for a pattern it cannot serve.
        best_cpu = state.cpu_free[best] - req.cpu_milli
        best_mem = state.mem_free[best] - req.mem_mib
        if self.spare:
            best_cpu -= int(self.reserved_cpu[best])
            best_mem -= int(self.reserved_mem[best])
        after: tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None
        # Patterns in order of how far the GPUs opened with them lag behind the plan's rate.
        ordered = sorted(self.plan.by_size[size], key=lambda item: (self.opened[item[0]] / item[1], item[0]))
        for j, _ in ordered:
            waiting = _without(self.plan.patterns[j], size)
            need_cpu = sum(self.expected_request[t][0] for t in waiting)
            need_mem = sum(self.expected_request[t][1] for t in waiting)
            if best_cpu >= need_cpu and best_mem >= need_mem:
                n = best
            else:
                if after is None:
                    cpu_after = state.np_cpu_free - req.cpu_milli
                    mem_after = state.np_mem_free - req.mem_mib
                    if self.spare:
                        cpu_after = cpu_after - self.reserved_cpu
                        mem_after = mem_after - self.reserved_mem
                    after = (cache.scores > NEG_INF, cpu_after, mem_after)
                feasible, cpu_after, mem_after = after
                mask = feasible & (cpu_after >= need_cpu) & (mem_after >= need_mem)
                if not mask.any():
                    continue
                n = int(np.argmax(np.where(mask, cache.scores, NEG_INF)))
            devices = cache.devices_of(n)
            d = devices[0]
            if state.gpu_free[n][d] != WHOLE_GPU_MILLI or state.modes[n][d] is not PartitionMode.SHARED:
                return n, devices
            cpu_left = state.cpu_free[n] - req.cpu_milli
            if not self._hostable(waiting, state.models[n], cpu_left, state.mem_free[n] - req.mem_mib):
                continue
            self.opened[j] += 1
            self.opening = (n * self.width + d, waiting, size)  # starts waiting when the share lands
            return n, devices
        return best, cache.devices_of(best)

    def _adopt(self, n: int, d: int, free: int) -> None:
        s = self.state
        cpu = s.cpu_free[n] - (int(self.reserved_cpu[n]) if self.spare else 0)
        mem = s.mem_free[n] - (int(self.reserved_mem[n]) if self.spare else 0)
        for total, waiting in self.fillers:
            if total <= free and self._hostable(waiting, s.models[n], cpu, mem):
                self._set_plan(n * self.width + d, waiting)
                return

    def _hostable(self, waiting: tuple[int, ...], model: str | None, cpu: int, mem: int) -> bool:
        """Whether a node with this much CPU and memory left could still start the waiting shares (each
        takes the expected shape of its size that needs the least CPU among those that fit)."""
        for size in waiting:
            fits = [(c, m) for c, m in self.share_requests.get((model, size), ()) if c <= cpu and m <= mem]
            if not fits:
                return False
            c, m = min(fits)
            cpu -= c
            mem -= m
        return True

    def _can_start(self, nodes: np.ndarray, req: Request) -> np.ndarray:
        """Per node index in `nodes`: has it the CPU, host memory and GPU model `req` needs?"""
        s = self.state
        allowed = self.allowed_masks.get(req)
        if allowed is None:
            allowed = s.allowed_mask(req)
            self.allowed_masks[req] = allowed
        ok: np.ndarray = (
            (s.np_cpu_free[nodes] >= req.cpu_milli) & (s.np_mem_free[nodes] >= req.mem_mib) & allowed[nodes]
        )
        return ok

    def _first_member(self, members: set[int], req: Request) -> tuple[int, tuple[int, ...]] | None:
        """The first GPU in node order, among those waiting for this size, whose node can start it."""
        s = self.state
        codes = np.fromiter(members, np.int64, len(members))
        nodes = codes // self.width
        ok = self._can_start(nodes, req)
        if self.spare:
            # Prefer GPUs whose node keeps, after this share, what its other waiting shares need.
            own_cpu, own_mem = self.expected_request[req.gpu_milli]
            sparing = (
                ok
                & (s.np_cpu_free[nodes] - req.cpu_milli >= self.reserved_cpu[nodes] - own_cpu)
                & (s.np_mem_free[nodes] - req.mem_mib >= self.reserved_mem[nodes] - own_mem)
            )
            if sparing.any():
                ok = sparing
        ordered = np.sort(codes[ok]).tolist()
        for code in ordered:
            n, d = divmod(code, self.width)
            if s.gpu_free[n][d] >= req.gpu_milli and s.gpu_mem_free[n][d] >= req.gpu_mem_mib:
                return n, (d,)
        return None


@dataclass(frozen=True)
class SharePlan:
    """Per-GPU share sets (patterns, sizes largest first) and, per share size, the patterns holding it
    with the rate at which the plan uses them for that size (bins of the pattern × copies of the size)."""

    patterns: tuple[tuple[int, ...], ...]
    by_size: dict[int, list[tuple[int, float]]]


def share_patterns(sizes: list[int], capacity: int = WHOLE_GPU_MILLI) -> list[tuple[int, ...]]:
    """Every multiset of share sizes that fits one GPU, sizes largest first."""
    ordered = sorted(set(sizes), reverse=True)
    out: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...], start: int, room: int) -> None:
        for i in range(start, len(ordered)):
            size = ordered[i]
            if size <= room:
                pattern = (*prefix, size)
                out.append(pattern)
                grow(pattern, i, room - size)

    grow((), 0, capacity)
    return out


def pattern_count(sizes: list[int], capacity: int = WHOLE_GPU_MILLI) -> int:
    """How many patterns `share_patterns` would list (multisets of sizes with total ≤ capacity)."""
    ways = [1] + [0] * capacity  # ways[c]: multisets with total exactly c
    for size in set(sizes):
        for c in range(size, capacity + 1):
            ways[c] += ways[c - size]
    return sum(ways) - 1


def share_plan(mix: ShapeMix) -> SharePlan:
    """The mix's share sizes packed with the fewest GPUs per arriving share (see `fewest_bins`)."""
    demand: dict[int, float] = {}
    for shape, weight in zip(mix.shapes, mix.weights, strict=True):
        if shape.num_gpu == 1 and 0 < shape.gpu_milli < WHOLE_GPU_MILLI:
            demand[shape.gpu_milli] = demand.get(shape.gpu_milli, 0.0) + weight
    sizes = sorted(demand)
    # The patterns grow combinatorially as shares get small (a 10-milli share fits 100 times): the
    # smallest sizes leave the plan until the LP stays small. They fit almost any gap, and sum-of-squares
    # places what the plan does not cover.
    while sizes and pattern_count(sizes) > MAX_PATTERNS:
        sizes = sizes[1:]
    if not sizes:
        return SharePlan((), {})
    patterns = share_patterns(sizes)
    counts = np.array([[p.count(size) for p in patterns] for size in sizes], dtype=float)
    total = sum(demand[size] for size in sizes)
    rates = np.array([demand[size] / total for size in sizes])
    x = fewest_bins(counts, rates)
    used = [i for i in range(len(patterns)) if x[i] > 1e-9]
    kept = tuple(patterns[i] for i in used)
    by_size: dict[int, list[tuple[int, float]]] = {}
    for j, i in enumerate(used):
        for size in set(patterns[i]):
            by_size.setdefault(size, []).append((j, float(x[i]) * patterns[i].count(size)))
    return SharePlan(kept, by_size)


def fewest_bins(counts: npt.NDArray[np.float64], rates: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The LP `min Σ x  s.t.  counts · x = rates, x ≥ 0` by the primal simplex with Bland's rule.

    Column j is a pattern (row i: copies of size i in it). The one-item patterns form the identity: a
    feasible start (each share alone on a GPU). Bland's rule (lowest index enters, ties leave by lowest
    index) cannot cycle, and the result is a vertex: a handful of patterns."""
    rows, cols = counts.shape
    cost = np.ones(cols)
    basis = [_unit_column(counts, i) for i in range(rows)]
    tableau = counts.astype(float).copy()
    rhs = rates.astype(float).copy()
    for _ in range(10_000):
        reduced = cost - cost[basis] @ tableau  # c_j − c_B·T_j (basis columns give 0)
        entering = next((j for j in range(cols) if reduced[j] < -1e-9 and j not in basis), None)
        if entering is None:
            break
        column = tableau[:, entering]
        ratios = [(rhs[i] / column[i], basis[i], i) for i in range(rows) if column[i] > 1e-9]
        _, _, row = min(ratios)
        pivot = column[row]
        tableau[row] /= pivot
        rhs[row] /= pivot
        for i in range(rows):
            if i != row and abs(tableau[i, entering]) > 0:
                factor = tableau[i, entering]
                tableau[i] -= factor * tableau[row]
                rhs[i] -= factor * rhs[row]
        basis[row] = entering
    x = np.zeros(cols)
    for i, j in enumerate(basis):
        x[j] = max(rhs[i], 0.0)
    return x


def _unit_column(counts: npt.NDArray[np.float64], row: int) -> int:
    unit = np.zeros(counts.shape[0])
    unit[row] = 1.0
    matches = np.flatnonzero((counts == unit[:, None]).all(axis=0))
    if not len(matches):
        raise ValueError(f"no one-item pattern for row {row}")
    return int(matches[0])


def _without(pattern: tuple[int, ...], size: int) -> tuple[int, ...]:
    rest = list(pattern)
    rest.remove(size)
    return tuple(rest)


def _expected_share_requests(mix: ShapeMix) -> dict[int, tuple[int, int]]:
    """Per share size, the CPU (millicores) and host memory (MiB) a share of that size brings on
    average over the mix (weighted by the shapes' weights)."""
    sums: dict[int, tuple[float, float, float]] = {}
    for shape, weight in zip(mix.shapes, mix.weights, strict=True):
        if shape.num_gpu == 1 and shape.gpu_milli < WHOLE_GPU_MILLI:
            w, cpu, mem = sums.get(shape.gpu_milli, (0.0, 0.0, 0.0))
            sums[shape.gpu_milli] = (w + weight, cpu + weight * shape.cpu_milli, mem + weight * shape.mem_mib)
    return {size: (int(cpu / w), int(mem / w)) if w else (0, 0) for size, (w, cpu, mem) in sums.items()}


def _sub_multisets(pattern: tuple[int, ...]) -> set[tuple[int, ...]]:
    """The non-empty sub-multisets of a pattern (sizes largest first, as in the pattern)."""
    out: set[tuple[int, ...]] = set()
    for mask in range(1, 1 << len(pattern)):
        out.add(tuple(size for i, size in enumerate(pattern) if mask >> i & 1))
    return out
