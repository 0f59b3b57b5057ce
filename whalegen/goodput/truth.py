"""The goodput replay's truth: what the simulated world does, which no policy reads (issue #41 item 1).

The policies' estimates (whalegen/gpus/speed.py's rule in `whalegen-aware`, the Lucid utilisation rule
behind its SLA predictor) are *not* the truth here; each rule below is measured data where it exists
and, where it does not, a rule the policies do not share (or share only with a drawn error):

1. **Speed alone** (`TrueSpeed`): a job type's throughput on one whole GPU of a model is Gavel's
   measurement on K80, P100 and V100 (V100M32: the V100M16 chip); on every other model it is the
   anchored roofline rule (whalegen.goodput.speed) times a per-(job type, model) error exp(σ·z),
   z ~ N(0, 1) drawn from the run's seed, σ = `SPEED_ERROR_SIGMA` (the rule's own hold-out error on
   the measured cards is 0.3–0.5 median relative, docs/notes/goodput-design.md §2; σ = 0.4 is that size).
   A job type Gavel found does not fit a model's memory runs there at 0: it is never placed there, and a
   job no model of the fleet runs is refused when the replay loads it.
2. **Fractional demand** (`job_demand`, `job_rate`): an openb job asking `gpu_milli` < 1000 can use that
   share of one GPU and no more: alone it runs at `speed × min(demand, capacity)`, where capacity is 1
   on a whole or shared GPU and the slice's scale on MIG (c^a × b^(1 − a), a the job type's exponent
   fitted on Gavel's measurements): near full speed on a slice at least its size.
3. **Sharing a GPU** (`MeasuredPairs`): every occupant of an MPS or time-sliced GPU runs at the factor of
   a *measured* Lucid pair near (its SM utilisation alone, the sum of its neighbours'): one of the `k`
   nearest measured pairs, picked per task with the seed (the measurements' spread, not a fitted curve;
   the policies' SLA predictor is the fitted Lucid rule). A job's utilisation is its type's times its
   demand, so fractional jobs packed as the trace's owners packed them (their milli within the GPU) run
   near full speed (measured 0.9–1.0 at 20–40 % each), saturating pairs at 0.5–0.7.
4. **A service on MIG** (`mig_service_factor`): capped by its slice: factor min(1, 100·c / u) for a slice
   with a share c of the compute and the service's utilisation u (% of a whole GPU) now.
5. **GPU memory** (`job_memory_mib`): per job type, estimated from Gavel's memory-fit data so that every
   pair Gavel marks as not fitting together exceeds the card's memory (and, conservatively, 3 % of the
   pairs it measured together too: 57 of 1,881); requests carry it, so the placement never co-locates
   an unfit pair.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from whalegen.goodput.data import GavelData, JobType, LucidSolo
from whalegen.goodput.jobs import Job
from whalegen.goodput.speed import SpeedModel
from whalegen.gpus.catalogue import get_model

# Lognormal σ of the true speed around the roofline rule on a model Gavel did not measure (module docstring).
SPEED_ERROR_SIGMA = 0.4
# Measured service pairs a service's factor is drawn from: the k nearest in (own, other) utilisation.
NEAREST_PAIRS = 8
_UTIL_GRID_PCT = 5.0


class TrueSpeed:
    """True throughput (Gavel's iterations per second) of a job type alone on one GPU of a model."""

    def __init__(self, gavel: GavelData, seed: int, sigma: float = SPEED_ERROR_SIGMA) -> None:
        self._rule = SpeedModel(gavel)
        self.seed = seed
        self.sigma = sigma
        self._cache: dict[tuple[JobType, str], float] = {}

    @property
    def job_types(self) -> tuple[JobType, ...]:
        return self._rule.job_types

    def measured(self, job: JobType, model_name: str) -> bool:
        return self._rule.measured(job, model_name) is not None

    def error(self, job: JobType, model_name: str) -> float:
        """The drawn multiplicative error of the rule for (job, model): exp(σ·z), median 1."""
        model = get_model(model_name).name
        z = random.Random(f"speed-error:{self.seed}:{job}:{model}").gauss(0.0, 1.0)
        return math.exp(self.sigma * z)

    def speed(self, job: JobType, model_name: str) -> float:
        """Measured where Gavel measured it (0.0: it does not fit), else the rule times its drawn error."""
        key = (job, model_name)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        measured = self._rule.measured(job, model_name)
        value = (
            measured
            if measured is not None
            else self._rule.throughput(job, model_name) * self.error(job, model_name)
        )
        self._cache[key] = value
        return value

    def runs_on(self, job: JobType, model_name: str) -> bool:
        return self.speed(job, model_name) > 0.0

    def slice_scale(self, job: JobType, compute_fraction: float, bandwidth_fraction: float) -> float:
        """The share of a whole GPU's speed a MIG slice gives the job type: c^a × b^(1 − a)."""
        a = self._rule.compute_exponent(job)
        scale: float = compute_fraction**a * bandwidth_fraction ** (1 - a)
        return scale


def job_demand(job: Job) -> float:
    """The share of one GPU a job can use: its `gpu_milli` / 1000 when it asks a fraction, else 1."""
    return job.gpu_milli / 1000 if job.shareable else 1.0


def job_rate(truth: TrueSpeed, job: Job, model_name: str, capacity: float = 1.0) -> float:
    """Iterations per second per GPU of the job alone on `model_name`, holding `capacity` of the GPU (1:
    a whole or shared GPU; a MIG slice: its `slice_scale`)."""
    return truth.speed(job.job_type, model_name) * min(job_demand(job), capacity)


def mig_service_factor(util_pct: float, compute_fraction: float) -> float:
    """A service on a MIG slice: what the slice's compute gives of what its utilisation now asks."""
    if util_pct <= 0.0:
        return 1.0
    return min(1.0, 100.0 * compute_fraction / util_pct)


@dataclass(frozen=True)
class MeasuredPairs:
    """Measured Lucid factors indexed by (own SM utilisation alone, neighbour's), both in %."""

    points: tuple[tuple[float, float, float], ...]  # (own util %, other util %, own factor)
    k: int = NEAREST_PAIRS
    _nearest: dict[tuple[int, int], tuple[float, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @staticmethod
    def from_lucid(observations: Sequence[tuple[LucidSolo, LucidSolo, float]]) -> MeasuredPairs:
        return MeasuredPairs(tuple((a.gpu_util_pct, b.gpu_util_pct, f) for a, b, f in observations))

    def factor(self, util_pct: float, other_util_pct: float, pick: int) -> float:
        """The `pick`-th (mod k, by factor) of the k measured pairs nearest to the utilisations, on a 5 %
        grid clamped to [0, 100] (the measured range)."""
        cell = (_cell(util_pct), _cell(other_util_pct))
        nearest = self._nearest.get(cell)
        if nearest is None:
            u, o = cell[0] * _UTIL_GRID_PCT, cell[1] * _UTIL_GRID_PCT
            ranked = sorted(self.points, key=lambda p: ((p[0] - u) ** 2 + (p[1] - o) ** 2, p[2]))
            nearest = tuple(sorted(p[2] for p in ranked[: self.k]))
            self._nearest[cell] = nearest
        return nearest[pick % len(nearest)]


def _cell(util_pct: float) -> int:
    return round(min(100.0, max(0.0, util_pct)) / _UTIL_GRID_PCT)


def pick_for(seed: int, task_id: str) -> int:
    """A task's fixed draw among the nearest measured pairs (its own spread, the same for the whole run)."""
    return random.Random(f"pair-pick:{seed}:{task_id}").randrange(1 << 30)


# --- GPU memory per job type ------------------------------------------------------------------------------


_MEMORY_ROUNDS = 300
_MEMORY_PASSES = 3
_MEMORY_FLOOR_MIB = 512


@dataclass(frozen=True)
class MemoryFit:
    """Per job type GPU memory (MiB per GPU) and how it honours Gavel's memory-fit data."""

    mem_mib: Mapping[JobType, int]
    unfit_pairs: int  # one-GPU pairs Gavel marks as not fitting together (all exceed memory, by construction)
    fit_pairs: int  # one-GPU pairs Gavel measured together
    fit_pairs_excluded: int  # of those, pairs the estimate keeps apart all the same (conservative)


def job_memory_mib(gavel: GavelData) -> MemoryFit:
    """Memory per job type from the fit data: every pair Gavel marks unfit sums past the card's memory
    (hard), as few measured pairs as can be do too (soft), and every type fits alone where Gavel ran it.

    1. Subgradient steps on the hinge losses (unfit pairs weighted 20×) from 40 % of the smallest card
       each type ran on; 2. a repair pass raising, for any unfit pair still fitting, the side whose raise
       keeps apart the fewest measured pairs; 3. each type in an unfit pair lowered to the least memory
       its unfit pairs allow. Multi-GPU types take the one-GPU type of the same model and batch size
       (per GPU: data parallel replicates the model)."""
    ones = [j for j in gavel.job_types if j.num_gpus == 1]
    cap = {m: int(get_model(m).mem_mib or 0) for m in gavel.gpu_models}
    upper = {j: min(cap[m] for m in gavel.gpu_models if (m, j) in gavel.solo) for j in ones}
    hard = [(cap[m], a, b) for (m, a, b) in sorted(gavel.unfit) if a in upper and b in upper]
    soft = [(cap[m], a, b) for (m, a, b) in sorted(gavel.pairs) if a in upper and b in upper]
    mem = _descend(ones, upper, hard, soft)
    _repair(mem, upper, hard, soft)
    for _ in range(_MEMORY_PASSES):
        for job in ones:
            bounds = [c - mem[b] + 1 for c, a, b in hard if a == job]
            if bounds:
                mem[job] = min(mem[job], max([_MEMORY_FLOOR_MIB, *bounds]))
    by_name = {j.model: v for j, v in mem.items()}
    half = min(cap.values()) // 2  # a multi-GPU type without a one-GPU twin
    out = {j: mem.get(j, by_name.get(j.model, half)) for j in gavel.job_types}
    excluded = sum(1 for c, a, b in soft if out[a] + out[b] > c)
    return MemoryFit(out, len(hard), len(soft), excluded)


_Pairs = list[tuple[int, JobType, JobType]]


def _descend(
    ones: list[JobType], upper: dict[JobType, int], hard: _Pairs, soft: _Pairs
) -> dict[JobType, int]:
    mem = {j: 0.4 * upper[j] for j in ones}
    for r in range(_MEMORY_ROUNDS):
        grad = dict.fromkeys(ones, 0.0)
        for c, a, b in hard:
            if mem[a] + mem[b] <= c:
                grad[a] -= 20.0
                grad[b] -= 20.0
        for c, a, b in soft:
            if mem[a] + mem[b] > c:
                grad[a] += 1.0
                grad[b] += 1.0
        step = 8.0 / (1.0 + r / 50.0)
        mem = {j: min(upper[j], max(_MEMORY_FLOOR_MIB, mem[j] - step * grad[j])) for j in ones}
    return {j: math.ceil(v) for j, v in mem.items()}


def _repair(mem: dict[JobType, int], upper: dict[JobType, int], hard: _Pairs, soft: _Pairs) -> None:
    partners: dict[JobType, list[tuple[int, JobType]]] = {j: [] for j in mem}
    for c, a, b in soft:
        partners[a].append((c, b))

    def broken(job: JobType, value: int) -> int:
        return sum(1 for c, other in partners[job] if value + mem[other] > c >= mem[job] + mem[other])

    for c, a, b in hard:
        if mem[a] + mem[b] > c:
            continue
        options = [
            (broken(j, c - mem[o] + 1), str(j), j, c - mem[o] + 1)
            for j, o in ((a, b), (b, a))
            if c - mem[o] + 1 <= upper[j]
        ]
        if not options:
            raise ValueError(f"Gavel's memory-fit data leaves no memory for {a} beside {b} on {c} MiB")
        *_, job, value = min(options)
        mem[job] = value
