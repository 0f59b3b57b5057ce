"""A strict ceiling on a goodput replay for any fleet: the fluid LP bound (issue #41 item 2, docs/goodput.md).

The question it answers: how much reference work could *any* placement do in the replay's window, on this
fleet, with these jobs arriving when they arrive? A **fluid** schedule may split a job's time over GPU
models and over time freely (no gangs, no packing geometry, no carving, no preemption cost, no
interference); it keeps only what no placement can escape:

- a job does nothing before it arrives, and is in one place at a time: within any stretch of time it runs
  at most that stretch's length, summed over the models it runs on;
- on a model it runs at that model's true speed (the replay's truth, never faster), and while it runs it
  takes its GPU demand (`num_gpus`, or `num_gpus × gpu_milli / 1000` for a fractional job) of the model's
  GPUs, so a GPU gives at most one GPU of capacity per second;
- a job does at most its own work.

The best fluid schedule is a linear programme. Time is cut at the arrivals into intervals; variable
`t[j, i, m]` is the wall time job j runs on model m in interval i:

    maximise  Σ r[j, m] · t[j, i, m]                              (reference GPU-seconds done)
    s.t.      Σ_{i, m} r[j, m] · t[j, i, m] ≤ work[j]              (its own work)
              Σ_m t[j, i, m] ≤ end[i] − max(start[i], arrival[j])  (one place at a time, after arrival)
              Σ_j demand[j] · t[j, i, m] ≤ gpus[m] · (end[i] − start[i])  (each GPU its capacity)

with r[j, m] the reference GPU-seconds job j does per wall second on model m. With every arrival a cut it
is the best fluid schedule exactly (in each interval constant rates t / length realise any solution). To
keep it small, at most `max_intervals` cuts are kept (at arrival quantiles): a job then shares its
interval's capacity with time before its arrival, which only loosens the bound, so it stays an upper bound
on every real schedule (and on every finer cut). Any job's row caps it by its no-queue value (alone on its
fastest model from arrival), so the LP is never above the no-queue bound.

Why it bounds the replay's physics (whalegen.goodput.truth): a job alone runs at `job_rate` = true speed ×
min(demand, what it holds); on a shared GPU the shares it holds add up to at most one GPU and every pair
factor is at most 1; on MIG slices with compute share c and bandwidth share b the slice scales
c^a · b^(1 − a) of one GPU add up to at most 1 (Hölder's inequality, as the c's and the b's each add up to
at most 1). So per GPU and second no placement does more reference work than a fluid schedule charging
each job its demand; services, preemption losses and what the engine refuses only take work away.

Solved with HiGHS's interior-point method and crossover (`scipy.optimize.linprog`, "highs-ipm"): on 2,000
jobs (default fleet, load 0.8, 16 cuts) 4.8 CPU-s against 38.1 for HiGHS's default choice, the same
optimum. The structure is a generalised flow (a job's work turns into different amounts of reference work
on different models), not a plain max-flow.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from whalegen.goodput.fleet import FleetSpec
from whalegen.goodput.jobs import REFERENCE_MODEL, Job
from whalegen.goodput.replay import (
    Ceilings,
    ReplayConfig,
    World,
    ceilings,
    fleet_models,
    refuse_unrunnable,
    scaled_jobs,
)
from whalegen.goodput.truth import job_demand, job_rate
from whalegen.gpus.catalogue import get_model

# 16 cuts: on the default fleet (2,000 jobs) within 0.2 points of 32 cuts at a third of the CPU time
# (docs/notes/goodput-runs.md, "The strict ceiling").
DEFAULT_MAX_INTERVALS = 16


class CeilingError(RuntimeError):
    """The LP solver did not reach an optimum (it should always: the zero schedule is feasible)."""


@dataclass(frozen=True)
class FluidJob:
    """One job as the LP sees it, in reference GPU-seconds (what the replay's goodput counts)."""

    arrival_s: float
    work_ref_s: float  # its whole work: iterations over the reference speed × its GPUs
    demand_gpus: float  # GPU capacity it takes while it runs
    rate_ref: Mapping[str, float]  # model → reference GPU-seconds per wall second there (absent: cannot run)


@dataclass(frozen=True)
class FluidCeiling:
    work_ref_s: float  # the best fluid schedule's work done in the window
    capacity_gpu_s: float  # the fleet's GPU-seconds in the window
    intervals: int
    variables: int

    @property
    def pct(self) -> float:
        """Goodput's unit: reference GPU-hours per fleet GPU-hour of the window, in %."""
        return 100 * self.work_ref_s / self.capacity_gpu_s if self.capacity_gpu_s else 0.0


def interval_starts(arrivals_s: Sequence[float], window_s: float, max_intervals: int) -> list[float]:
    """The cuts: 0 and the distinct arrivals inside the window, thinned to `max_intervals` at quantiles."""
    if max_intervals < 1:
        raise ValueError(f"max_intervals must be at least 1, got {max_intervals}")
    inside = sorted({a for a in arrivals_s if 0 < a < window_s})
    cuts = [0.0, *inside]
    if len(cuts) <= max_intervals:
        return cuts
    # Evenly spaced ranks over the arrivals: as many jobs in each interval, so each job's arrival moves
    # back by at most one interval of its neighbourhood's arrival density.
    picked = sorted({cuts[round(k * (len(cuts) - 1) / max_intervals)] for k in range(max_intervals)})
    return picked


def fluid_ceiling(
    jobs: Sequence[FluidJob],
    gpus_by_model: Mapping[str, int],
    window_s: float,
    max_intervals: int = DEFAULT_MAX_INTERVALS,
) -> FluidCeiling:
    """The LP of the module docstring over [0, window_s)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    models = sorted(m for m, n in gpus_by_model.items() if n > 0)
    capacity_gpu_s = window_s * sum(gpus_by_model[m] for m in models)
    starts = interval_starts([j.arrival_s for j in jobs], window_s, max_intervals)
    ends = [*starts[1:], window_s]
    rows = _Rows(len(starts), len(models))
    for index, job in enumerate(jobs):
        _add_job(rows, index, job, models, starts, ends)
    if not rows.cost:
        return FluidCeiling(0.0, capacity_gpu_s, len(starts), 0)
    lengths = np.array(ends) - np.array(starts)
    capacity = [gpus_by_model[m] * lengths[i] for i in range(len(starts)) for m in models]
    matrix = coo_matrix((rows.values, (rows.row, rows.col)), shape=(rows.next_row, len(rows.cost))).tocsr()
    bound = np.concatenate([np.array(capacity), np.array(rows.limit)])
    solved = linprog(-np.array(rows.cost), A_ub=matrix, b_ub=bound, bounds=(0, None), method="highs-ipm")
    if solved.status != 0:
        raise CeilingError(f"HiGHS did not solve the ceiling LP: {solved.message}")
    return FluidCeiling(float(-solved.fun), capacity_gpu_s, len(starts), len(rows.cost))


class _Rows:
    """The constraint matrix in coordinate form. Rows: the capacity rows (model × interval) first, at
    `interval × models + model`, then each job's work row and its interval rows as they are added."""

    def __init__(self, intervals: int, models: int) -> None:
        self.models = models
        self.next_row = intervals * models
        self.row: list[int] = []
        self.col: list[int] = []
        self.values: list[float] = []
        self.cost: list[float] = []  # reference work per second of each variable
        self.limit: list[float] = []  # right-hand sides of the job rows, in order

    def add(self, row: int, col: int, value: float) -> None:
        self.row.append(row)
        self.col.append(col)
        self.values.append(value)

    def new_row(self, limit: float) -> int:
        self.limit.append(limit)
        self.next_row += 1
        return self.next_row - 1


def _add_job(
    rows: _Rows,
    index: int,
    job: FluidJob,
    models: Sequence[str],
    starts: Sequence[float],
    ends: Sequence[float],
) -> None:
    """One job's variables (interval × model it can run on, from its arrival) and its rows."""
    usable = [(k, job.rate_ref.get(m, 0.0)) for k, m in enumerate(models)]
    usable = [(k, r) for k, r in usable if r > 0]
    first = bisect.bisect_right(starts, job.arrival_s) - 1
    if not usable or job.work_ref_s <= 0 or first < 0 or job.arrival_s >= ends[-1]:
        return
    work_row = rows.new_row(job.work_ref_s)
    for interval in range(first, len(starts)):
        time_row = rows.new_row(ends[interval] - max(starts[interval], job.arrival_s))
        for k, rate in usable:
            col = len(rows.cost)
            rows.cost.append(rate)
            rows.add(work_row, col, rate)
            rows.add(time_row, col, 1.0)
            rows.add(interval * rows.models + k, col, job.demand_gpus)


def fluid_jobs(
    scaled: Sequence[tuple[float, Job]],
    models: Sequence[str],
    speed: Callable[[Job, str], float],
    reference_speed: Callable[[Job], float],
    demand_gpus: Callable[[Job], float],
) -> list[FluidJob]:
    """The replay's jobs (scaled arrival, job) for the LP. `speed(job, model)`: the job's true iterations
    per second alone on that model (the replay's truth); `reference_speed(job)`: its iterations per second
    on the reference model, which turns iterations into reference GPU-seconds as the replay counts them;
    `demand_gpus(job)`: the GPU capacity it takes while it runs."""
    out = []
    for arrival_s, job in scaled:
        reference = reference_speed(job)
        if reference <= 0:
            continue  # work the replay cannot count (it counts reference GPU-seconds)
        per_iteration = job.num_gpus / reference
        rates = {m: speed(job, m) * per_iteration for m in models}
        out.append(
            FluidJob(
                arrival_s=arrival_s,
                work_ref_s=job.work_iterations * per_iteration,
                demand_gpus=demand_gpus(job),
                rate_ref={m: r for m, r in rates.items() if r > 0},
            )
        )
    return out


@dataclass(frozen=True)
class FleetCeiling:
    """A replay's strict ceiling (the LP) beside the earlier bounds (`replay.ceilings`), in % goodput."""

    strict: FluidCeiling
    earlier: Ceilings
    window_s: float
    jobs: int  # the jobs the replay runs: those some model of the fleet runs

    @property
    def strict_pct(self) -> float:
        return self.strict.pct


def fleet_ceiling(
    fleet: FleetSpec,
    jobs: Sequence[Job],
    world: World,
    config: ReplayConfig,
    max_intervals: int = DEFAULT_MAX_INTERVALS,
) -> FleetCeiling:
    """The LP over exactly the work `run_goodput` replays: the jobs some model of the fleet runs, their
    arrivals scaled to the load, their work clipped; speeds are the replay's truth (a job runs on a model
    only where `world.runs_on`: non-zero speed and its memory on the card), demands its GPUs' shares."""
    runnable, _ = refuse_unrunnable(jobs, fleet, world)
    window_s, scaled = scaled_jobs(runnable, fleet, world, config)
    models = fleet_models(fleet)
    gpus: dict[str, int] = {}
    for pool in fleet.pools:
        name = get_model(pool.gpu_model).name
        gpus[name] = gpus.get(name, 0) + pool.total_gpus

    def speed(job: Job, model: str) -> float:
        return job_rate(world.truth, job, model) if world.runs_on(job, model) else 0.0

    fluid = fluid_jobs(
        scaled,
        models,
        speed,
        lambda job: world.truth.speed(job.job_type, REFERENCE_MODEL),
        lambda job: job.num_gpus * job_demand(job),
    )
    return FleetCeiling(
        fluid_ceiling(fluid, gpus, window_s, max_intervals),
        ceilings(fleet, runnable, world, config),
        window_s,
        len(runnable),
    )
