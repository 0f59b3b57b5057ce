"""The goodput replay: time-stepped, every decision through the production `Decider.step` (docs/goodput.md).

One run = one fleet, one policy, one seed, one load:

1. **Work.** The jobs of `jobs.load_jobs` (openb arrivals and sizes, a Gavel job type per job, work in
   iterations), their reference runtime clipped to `max_runtime_s`; arrivals scaled so that the offered
   work is `load` × the fleet's capacity over the window (capacity in reference GPUs: each GPU counts
   its model's mean speed over V100 across Gavel's job types). Online services (genai-2026 pods) ask
   `service_milli` of one GPU at priority 10 (they may preempt preemptible batch work) and have an SLA
   (the lowest throughput factor they tolerate); half are there at t = 0, the rest arrive over the
   window, and each leaves after an exponential lifetime (`ReplayConfig.service_churn`). A policy name's
   `+headroom` keeps idle the milli the services' arrival forecast asks for (whalegen.goodput.headroom).
2. **Decisions.** On the step clock of `whalegen.sim.loop` (`run_steps`, fixed steps of `step_s`): in
   every step after something arrived, left or ended, the waiting tasks (the first `lookahead` by
   priority, then arrival) go to one session of the production decision (`Decider.step`); placements
   start, preemption victims lose the work since their last checkpoint and wait again, departures are
   released from the session. The metrics (goodput, allocation, SLA) are the loop's observers.
3. **Physics** (the truth, which no policy reads; whalegen.goodput.truth): a job runs at its type's true
   speed on the GPU's model (Gavel's measurement on K80/P100/V100, else the roofline rule times an error
   drawn with the seed) times the share it can use (`gpu_milli` / 1000 for a fractional job; on MIG at
   most the slice's scale); on a shared GPU every occupant runs at a measured Lucid pair's factor near
   its SM utilisation and its neighbours' (a job's: its type's, derived from Gavel's measured pressure
   through the utilisation rule, times its demand); a service on a MIG slice is capped by the slice.
   Requests carry each job type's GPU memory (estimated from Gavel's memory-fit data, so that pairs
   Gavel could not co-locate never share a GPU) and the fleet models that run it; a job no model of the
   fleet runs is refused at load. A fleet's `max_shares` cuts a shared GPU into that many shares.
4. **Telemetry and learning** (whalegen.goodput.telemetry): the policy's side (`PolicySide`: the decision
   and its `Telemetry`) never holds the truth. A job alone on a GPU reports noisy samples of its
   throughput and SM utilisation; profiles per workload (its name: job type, GPU count and, for a
   fractional job, its milli) are learned from them as production does (throughput per model fitted by
   the speed rule's power law, mean utilisation); a service reports its utilisation every step, and its
   profile is the P95 of its last hour (a service not seen running yet: the running services' pooled
   P95). Only the `+oracle` option hands the decision the true profile, by name.
5. **Counting**: goodput is the retained work: what a preemption throws away (the work since the
   victim's last checkpoint) is taken back from the work done and reported as `work_lost_gpu_h`.

Deterministic for (fleet, jobs, services, policy, seed, load).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from whalegen.goodput.data import GavelData, JobType
from whalegen.goodput.fleet import FleetSpec, fleet_nodes
from whalegen.goodput.headroom import online_headroom_milli
from whalegen.goodput.interference import UtilisationFit, gavel_observations
from whalegen.goodput.jobs import GENAI_STEP_S, REFERENCE_MODEL, Job, Service
from whalegen.goodput.telemetry import PolicySide, Telemetry
from whalegen.goodput.truth import (
    MeasuredPairs,
    TrueSpeed,
    job_demand,
    job_memory_mib,
    job_rate,
    mig_service_factor,
    pick_for,
)
from whalegen.gpus.catalogue import get_model
from whalegen.gpus.mig import COMPUTE_SLICES, MEMORY_SLICES, profile_by_name
from whalegen.gpus.speed import fit_power_law, gpu_figures
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    NodeState,
    PartitionMode,
    RunningTask,
    TaskProfile,
    TaskRequest,
    UnitKind,
)
from whalegen.scheduling import Config, Decider, Snapshot
from whalegen.sim.loop import Departures, StepClock, StepObserver, run_steps
from whalegen.sim.stats import mean, nearest_rank_percentile

SERVICE_PRIORITY = 10
SERIES_BINS = 48
# Replay options a policy name may carry after "+" (e.g. "whalegen-aware+headroom+oracle"):
# `headroom`: keep idle the GPU milli the services' forecast expects to need (whalegen.goodput.headroom);
# `oracle`: the policy reads every job's true profile (its speed rule exponent and SM utilisation) instead
# of the one learned from telemetry: an upper bound on what better profiles could give;
# `peer`: services arrive at the preemptible jobs' priority (0) instead of SERVICE_PRIORITY, as production's
# queue default puts an online task beside batch work: only the online reserve lets them displace it.
MODIFIERS = frozenset({"headroom", "oracle", "peer"})


def split_policy(name: str) -> tuple[str, frozenset[str]]:
    """`"whalegen-aware+headroom"` → (`"whalegen-aware"`, {"headroom"}); an unknown option is an error."""
    base, *options = name.split("+")
    unknown = set(options) - MODIFIERS
    if unknown:
        raise ValueError(
            f"replay options after '+' are {', '.join(sorted(MODIFIERS))}, got {sorted(unknown)}"
        )
    return base, frozenset(options)


@dataclass(frozen=True)
class ReplayConfig:
    load: float = 1.0
    step_s: float = 60.0
    max_runtime_s: float = 24 * 3600.0
    lookahead: int = 64
    checkpoint_s: float = 1800.0  # a preempted job keeps its work up to its last checkpoint
    drain_factor: float = 2.0  # JCT: the replay runs on after the window, up to this × the window
    service_milli: int = 500
    service_cpu_milli: int = 4000
    service_mem_mib: int = 16 * 1024
    # Services arrive and leave: this share is there at t = 0, the rest arrive uniformly over the window;
    # each stays an exponential lifetime of mean `service_mean_life` × the window (at least 30 min).
    # False: every service from t = 0 to the end (the first runs of docs/notes/goodput-runs.md).
    service_churn: bool = True
    service_present_share: float = 0.5
    service_mean_life: float = 0.5


@dataclass(frozen=True)
class World:
    """The truth of a replay (whalegen.goodput.truth), which no policy reads: true speeds, the measured
    co-location pairs, each job type's SM utilisation and GPU memory."""

    truth: TrueSpeed
    shared_pairs: MeasuredPairs  # the co-location truth on a shared GPU
    job_util_pct: dict[JobType, float]
    job_mem_mib: Mapping[JobType, int]
    speedup: dict[str, float]  # model → mean true throughput over the reference model's, over job types
    seed: int = 0

    @staticmethod
    def build(
        gavel: GavelData,
        util_rule: UtilisationFit,
        models: Sequence[str],
        shared_pairs: MeasuredPairs,
        seed: int = 0,
    ) -> World:
        """`util_rule` only turns Gavel's measured pressure into an SM utilisation per job type (what NVML
        would show of it); the co-location truth itself is measured pairs (whalegen.goodput.truth, rule 3)."""
        truth = TrueSpeed(gavel, seed)
        pressure: dict[JobType, list[float]] = defaultdict(list)
        for _, beside, factor in gavel_observations(gavel, REFERENCE_MODEL):
            pressure[beside].append(factor)
        job_util: dict[JobType, float] = {}
        means = {job: sum(v) / len(v) for job, v in pressure.items()}
        fallback = sorted(means.values())[len(means) // 2] if means else 0.7
        for job in truth.job_types:
            job_util[job] = util_from_imposed(means.get(job, fallback), util_rule)
        speedup = {}
        for model in models:
            ratios = [
                truth.speed(j, model) / truth.speed(j, REFERENCE_MODEL)
                for j in truth.job_types
                if truth.runs_on(j, REFERENCE_MODEL) and truth.measured(j, REFERENCE_MODEL)
            ]
            speedup[model] = sum(ratios) / len(ratios)
        memory = job_memory_mib(gavel).mem_mib
        return World(truth, shared_pairs, job_util, memory, speedup, seed)

    def runs_on(self, job: Job, model_name: str) -> bool:
        """Whether the job's type runs on the model at all: a non-zero speed and its memory on the card."""
        card = get_model(model_name).mem_mib or 0
        return self.truth.runs_on(job.job_type, model_name) and self.job_mem_mib[job.job_type] <= card


def util_from_imposed(mean_factor: float, rule: UtilisationFit) -> float:
    """The SM utilisation u whose rule factor beside a neighbour at 100 % is `mean_factor`, in [5, 100]."""
    f = min(max(mean_factor, 1e-3), 1.0 - rule.contention)
    if rule.exponent <= 0:
        return 100.0
    demand: float = ((1.0 - rule.contention) / f) ** (1.0 / rule.exponent)
    return min(100.0, max(5.0, 100.0 * (demand - 1.0)))


@dataclass(frozen=True)
class RunResult:
    policy: str
    seed: int
    load: float
    gpus: int
    jobs: int
    services: int
    window_h: float
    goodput_pct: float
    allocated_pct: float
    busy_pct: float
    sla_violation_pct: float
    mean_jct_h: float
    p95_jct_h: float
    mean_wait_h: float
    p95_wait_h: float
    preemptions: int
    work_lost_gpu_h: float
    finished: int
    cpu_s: float
    series_goodput_pct: tuple[float, ...] = ()
    series_sla_violation_pct: tuple[float, ...] = ()
    reasons: tuple[tuple[str, str], ...] = ()  # a sample of placement reasons (profile-aware policies)
    refusals: int = 0  # co-locations refused by a profile-aware policy
    # The work offered (reference GPU-hours per fleet GPU-hour of the window: `load` × capacity), and a
    # ceiling on goodput: the smaller of (a) every job starting on arrival on its fastest model, with no
    # queue and no sharing, until the window ends, and (b) the fleet's capacity, every GPU busy at its
    # model's mean speed over the job types.
    offered_pct: float = 0.0
    ceiling_pct: float = 0.0
    headroom_gpus_mean: float = 0.0  # the online headroom kept, in GPUs, averaged over decisions
    service_preemptions: int = 0  # preemptions proposed for an online service
    # Work in the window, reference GPU-hours: done (gross), and retained (less what preemptions threw
    # away, which `goodput_pct` counts); jobs refused at load (no model of the fleet runs their type).
    work_done_ref_gpu_h: float = 0.0
    work_retained_ref_gpu_h: float = 0.0
    refused_jobs: int = 0
    # When the last job finished, hours from the window's start; None if a job was still unfinished at the
    # drain limit (ReplayConfig.drain_factor). × the fleet's GPUs: the GPU-hours bought to finish the work.
    last_finish_h: float | None = None


# -- the work -----------------------------------------------------------------------------------------


def dense_part(jobs: Sequence[Job], drop_fraction: float = 0.01) -> tuple[Job, ...]:
    """The jobs from the trace's dense part on: openb's first tasks (about 1 %) were created up to 110 days
    before the rest (pods alive before the collection window); they would stretch a scaled window."""
    if not jobs:
        return ()
    ordered = sorted(j.arrival_s for j in jobs)
    start = ordered[min(len(ordered) - 1, int(drop_fraction * len(ordered)))]
    return tuple(j for j in jobs if j.arrival_s >= start)


def workload_name(job: Job) -> str:
    """What a fleet sees of a job: its name (the model and batch size it runs, its GPU count, and the share
    of a GPU it asks when it asks a fraction: a different profile key)."""
    return f"{job.job_type} @{job.gpu_milli}m" if job.shareable else str(job.job_type)


def refuse_unrunnable(
    jobs: Sequence[Job], fleet: FleetSpec, world: World
) -> tuple[tuple[Job, ...], tuple[str, ...]]:
    """The jobs some model of the fleet runs, and one line per job type refused (its count and why): a
    job type with zero throughput, or more memory than the card, on every model of the fleet."""
    models = fleet_models(fleet)
    kept: list[Job] = []
    refused: dict[JobType, int] = defaultdict(int)
    for job in jobs:
        if any(world.runs_on(job, m) for m in models):
            kept.append(job)
        else:
            refused[job.job_type] += 1
    lines = tuple(
        f"{count} job(s) of {job_type} refused: no GPU model of the fleet ({', '.join(models)}) runs it "
        f"(zero measured throughput or more than the card's memory, {world.job_mem_mib[job_type]} MiB)"
        for job_type, count in sorted(refused.items())
    )
    return tuple(kept), lines


# -- the run -------------------------------------------------------------------------------------------


@dataclass
class _Task:
    task_id: str
    request: TaskRequest
    arrival_s: float
    job: Job | None = None
    service: Service | None = None
    leave_s: float | None = None  # a service's departure (None: stays to the end)
    done: float = 0.0  # iterations
    window_done: float = 0.0  # iterations done in the measured window and not thrown away since
    checkpointed: float = 0.0
    run_start_s: float = 0.0
    first_start_s: float | None = None
    finish_s: float | None = None
    node: int = -1
    devices: tuple[tuple[int, int], ...] = ()  # (node, device position)
    slice_fraction: tuple[float, float] | None = None  # MIG (compute, bandwidth) share
    rate: float = 0.0  # iterations per second now
    factor: float = 1.0
    model: str = ""


def offered_window_s(
    jobs: Sequence[Job], fleet: FleetSpec, world: World, load: float, max_runtime_s: float
) -> float:
    """The window over which the jobs' work is `load` × the fleet's capacity in reference GPUs."""
    offered = sum(j.work_ref_gpu_s * min(1.0, max_runtime_s / j.reference_runtime_s) for j in jobs)
    capacity = sum(world.speedup[p.gpu_model] * p.total_gpus for p in fleet.pools)
    return offered / (load * capacity)


def scaled_jobs(
    jobs: Sequence[Job], fleet: FleetSpec, world: World, config: ReplayConfig
) -> tuple[float, list[tuple[float, Job]]]:
    """The window, and each job with its scaled arrival and its work clipped to `max_runtime_s`."""
    window_s = offered_window_s(jobs, fleet, world, config.load, config.max_runtime_s)
    first_arrival = min((j.arrival_s for j in jobs), default=0)
    last_arrival = max((j.arrival_s for j in jobs), default=0)
    scale = window_s / max(1, last_arrival - first_arrival)
    return window_s, [
        (
            (job.arrival_s - first_arrival) * scale,
            replace(
                job,
                work_iterations=job.work_iterations
                * min(1.0, config.max_runtime_s / job.reference_runtime_s),
                reference_runtime_s=min(job.reference_runtime_s, config.max_runtime_s),
            ),
        )
        for job in jobs
    ]


@dataclass(frozen=True)
class Ceilings:
    """Bounds on a run's goodput, in % of the fleet's GPU-hours of the window
    (docs/notes/goodput-design.md §8)."""

    no_queue_pct: float  # every job on arrival on its fastest model, alone: strict
    mean_capacity_pct: float  # every GPU busy at its model's mean speed over the job types: not strict
    best_job_capacity_pct: float  # every GPU busy at its model's best job type's speed: strict

    @property
    def strict_pct(self) -> float:
        return min(self.no_queue_pct, self.best_job_capacity_pct)


def ceilings(fleet: FleetSpec, jobs: Sequence[Job], world: World, config: ReplayConfig) -> Ceilings:
    """The bounds over the jobs a run keeps (those some model of the fleet runs), on the same window."""
    runnable, _ = refuse_unrunnable(jobs, fleet, world)
    window_s, scaled = scaled_jobs(runnable, fleet, world, config)
    gpus = fleet.total_gpus
    models = sorted({get_model(p.gpu_model).name for p in fleet.pools})
    tasks = [_Task(job.job_id, TaskRequest(job.job_id, 0, 0), arrival, job=job) for arrival, job in scaled]
    ref = {t.task_id: world.truth.speed(t.job.job_type, REFERENCE_MODEL) for t in tasks if t.job}
    no_queue = _no_queue_work_s(tasks, world, models, window_s, ref)
    best = {m: _best_speedup(world, m) for m in models}
    capacity_s = gpus * window_s
    return Ceilings(
        100 * no_queue / capacity_s,
        100 * sum(world.speedup[p.gpu_model] * p.total_gpus for p in fleet.pools) / gpus,
        100 * sum(best[get_model(p.gpu_model).name] * p.total_gpus for p in fleet.pools) / gpus,
    )


def _best_speedup(world: World, model: str) -> float:
    """The fastest job type's true speed on `model` over its reference-model speed."""
    return max(
        world.truth.speed(j, model) / world.truth.speed(j, REFERENCE_MODEL)
        for j in world.truth.job_types
        if world.truth.runs_on(j, REFERENCE_MODEL)
    )


def run_goodput(
    fleet: FleetSpec,
    jobs: Sequence[Job],
    services: Sequence[Service],
    world: World,
    policy: str,
    seed: int,
    config: ReplayConfig = ReplayConfig(),
    on_progress: Callable[[float], None] | None = None,
) -> RunResult:
    """One run (the module docstring): the step clock of `whalegen.sim.loop` with this replay's arrivals,
    the services' departures, the decisions and the physics; the figures read the observers."""
    started_cpu = time.process_time()
    base_policy, options = split_policy(policy)
    # 1. The fleet, the work (less the jobs no model of the fleet runs) and the production decision over
    # them; the decision's side gets the telemetry only (whalegen.goodput.telemetry).
    nodes = fleet_nodes(fleet)
    runnable, _ = refuse_unrunnable(jobs, fleet, world)
    window_s, scaled = scaled_jobs(runnable, fleet, world, config)
    tasks = _tasks(services, scaled, window_s, seed, config, options, _RequestTruth(world, fleet))
    mix = shape_mix_from_tasks([t.request for t in tasks.values()])
    snapshot = Snapshot(ClusterSnapshot(nodes, shape_mix=mix), unit_exact=False)
    side = PolicySide(Decider(snapshot, Config(policy=base_policy, seed=seed)), Telemetry(seed))
    replay = _GoodputReplay(side, snapshot, nodes, tasks, world, config, options)
    # 2. The clock: arrivals by time (ties by id), the services' drawn departures, fixed steps up to the
    # drain limit; the metrics watch every step.
    departures = Departures()
    for task in replay.service_tasks:
        if task.leave_s is not None:
            departures.add(task.task_id, task.leave_s)
    arrivals = [(t.arrival_s, t) for t in sorted(tasks.values(), key=lambda t: (t.arrival_s, t.task_id))]
    end_s = window_s * config.drain_factor
    window = _Window(window_s)
    observers = _Observers(
        _Allocation(replay, window), _ServiceLevel(replay, window), _Goodput(replay, window)
    )
    watching: list[StepObserver] = [observers.allocation, observers.service_level, observers.goodput]
    if on_progress is not None:
        watching.append(_Progress(on_progress, end_s))
    last_s = run_steps(arrivals, replay, departures, StepClock(config.step_s, end_s), watching)
    # 3. Figures.
    return _result(
        fleet=fleet,
        world=world,
        config=config,
        policy=policy,
        seed=seed,
        services=len(services),
        replay=replay,
        observers=observers,
        window=window,
        last_s=last_s,
        started_cpu=started_cpu,
        refused_jobs=len(jobs) - len(runnable),
    )


@dataclass(frozen=True)
class _RequestTruth:
    """What a job's request states about it, as its owner would: its GPU memory and the fleet's models it
    runs on (both facts a user writes in a request, not the truth's speeds)."""

    world: World
    fleet: FleetSpec

    def memory_mib(self, job: Job) -> int:
        return int(self.world.job_mem_mib[job.job_type])

    def allowed_models(self, job: Job) -> frozenset[str]:
        """Empty (any model) where every model runs it; else the models that do."""
        models = fleet_models(self.fleet)
        runs = frozenset(m for m in models if self.world.runs_on(job, m))
        return frozenset() if len(runs) == len(models) else runs


def _tasks(
    services: Sequence[Service],
    scaled: Sequence[tuple[float, Job]],
    window_s: float,
    seed: int,
    config: ReplayConfig,
    options: frozenset[str],
    stated: _RequestTruth,
) -> dict[str, _Task]:
    """The services (their arrival and departure drawn for the seed, with churn) and then the jobs."""
    tasks: dict[str, _Task] = {}
    life_rng = random.Random(f"services:{seed}")
    present = math.ceil(config.service_present_share * len(services))
    for i, svc in enumerate(services):
        arrival, leave = 0.0, None
        if config.service_churn:
            arrival = 0.0 if i < present else life_rng.uniform(0.0, window_s)
            life = max(1800.0, life_rng.expovariate(1.0 / (config.service_mean_life * window_s)))
            leave = arrival + life
        request = TaskRequest(
            svc.service_id,
            config.service_cpu_milli,
            config.service_mem_mib,
            1,
            config.service_milli,
            priority=0 if "peer" in options else SERVICE_PRIORITY,
            submitted_at_s=arrival,
            sla_online=True,
            profile=TaskProfile(compute_exponent=0.5, sla_min_factor=svc.sla_min_factor),
        )
        tasks[svc.service_id] = _Task(svc.service_id, request, arrival, service=svc, leave_s=leave)
    for arrival, job in scaled:
        request = TaskRequest(
            job.job_id,
            job.cpu_milli,
            job.mem_mib,
            job.num_gpus,
            job.gpu_milli if job.shareable else WHOLE_GPU_MILLI,
            gpu_mem_mib=stated.memory_mib(job),
            allowed_models=stated.allowed_models(job),
            priority=0 if job.preemptible else 1,
            preemptible=job.preemptible,
            submitted_at_s=arrival,
        )
        tasks[job.job_id] = _Task(job.job_id, request, arrival, job=job)
    return tasks


@dataclass
class _Decisions:
    """What the decisions did, counted where they are applied."""

    made: int = 0
    headroom_milli: float = 0.0  # the online headroom kept, summed over decisions
    preemptions: int = 0
    service_preemptions: int = 0  # preemptions proposed for an online service
    lost_ref_s: float = 0.0  # reference GPU-seconds of preempted jobs' work since their last checkpoint
    reasons: list[tuple[str, str]] = field(default_factory=list)  # a sample (profile-aware policies)
    refusals: int = 0  # co-locations refused by a profile-aware policy


class _GoodputReplay:
    """The goodput replay as a configuration of the step clock: arrivals queue; services leave at their
    drawn times; a decision goes through the production `Decider.step` with the profiles learned so far;
    the physics (the truth, which no policy reads) moves the running jobs on at their rates.

    The policy's side is `self.side` (the decision and its telemetry): every figure a decision reads
    comes from it or from the tasks' requests. The truth (`self.world`) reaches it only as telemetry
    samples (`_report`), and as the true profiles of the explicit `+oracle` option."""

    def __init__(
        self,
        side: PolicySide,
        snapshot: Snapshot,
        nodes: Sequence[NodeState],
        tasks: dict[str, _Task],
        world: World,
        config: ReplayConfig,
        options: frozenset[str],
    ) -> None:
        self.side = side
        self.decider = side.decider
        self.snapshot = snapshot
        self.names = [n.name for n in nodes]
        self.node_model = [n.model or "" for n in nodes]
        self.modes = [[g.mode for g in n.gpus] for n in nodes]
        self.gpus = sum(len(n.gpus) for n in nodes)
        self.tasks = tasks
        self.world = world
        self.config = config
        self.options = options
        self.policy = side.decider.engine.policy
        self.aware = self.policy.task_aware
        self.service_tasks = [t for t in tasks.values() if t.service is not None]
        self.ref_speed = {
            t.task_id: world.truth.speed(t.job.job_type, REFERENCE_MODEL) for t in tasks.values() if t.job
        }
        self.pick = {t: pick_for(world.seed, t) for t in tasks}
        self.waiting: dict[str, _Task] = {}
        self.running: dict[str, _Task] = {}
        self.on_device: dict[tuple[int, int], list[str]] = defaultdict(list)
        self.dirty: set[tuple[int, int]] = set()  # devices whose occupants changed since their last rates
        self.gone: set[str] = set()  # services that left
        self.seen_arrivals: list[
            float
        ] = []  # services' arrivals after t = 0: the headroom forecast's history
        self.decisions = _Decisions()
        self.decide_again = False  # the last decision stopped victims: decide at the next step

    # -- the loop's configuration ------------------------------------------------------------------------

    def arrive(self, task: _Task, at_s: float) -> None:
        self.waiting[task.task_id] = task
        if task.service is not None and task.arrival_s > 0:
            self.seen_arrivals.append(task.arrival_s)

    def depart(self, task_id: str, at_s: float) -> None:
        self.gone.add(task_id)
        self.waiting.pop(task_id, None)
        if task_id in self.running:
            self.stop(self.running[task_id])

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def decide(self, now_s: float) -> None:
        if not self.waiting:
            return
        # 1. What the policy reads: the running services' profiles (a profile-aware policy's feed), and the
        # first `lookahead` waiting tasks by priority, then arrival, with theirs; all from the telemetry.
        if self.aware:
            feed = getattr(self.policy, "profiles", None)
            if isinstance(feed, dict):
                for t in self.running.values():
                    if t.service is not None:
                        feed[t.task_id] = self.service_profile(t, now_s)
        ordered = sorted(self.waiting.values(), key=lambda t: (-t.request.priority, t.arrival_s, t.task_id))
        pending = tuple(
            replace(
                t.request,
                profile=self.job_profile(t) if t.job is not None else self.service_profile(t, now_s),
            )
            for t in ordered[: self.config.lookahead]
        )
        # 2. The session's snapshot names what runs now: the decision keeps only preemptions of running
        # tasks (victims placed in this very step are not stoppable).
        running = tuple(
            RunningTask(t.task_id, self.names[t.node], (), 0, 0, 0, priority=t.request.priority)
            for t in self.running.values()
        )
        self.decider.snapshot = replace(
            self.snapshot, cluster=replace(self.snapshot.cluster, running=running)
        )
        # 3. With `+headroom`, the idle milli the services' arrival forecast asks for.
        if "headroom" in self.options:
            reserve = online_headroom_milli(self.seen_arrivals, now_s, self.config.service_milli)
            self.decider.engine_config = replace(self.decider.engine_config, online_reserve_milli=reserve)
            self.decider.engine.config = self.decider.engine_config
            self.decisions.headroom_milli += reserve
        self.decisions.made += 1
        # 4. Decide; stop the victims, then start the placements.
        decided = self.decider.step(pending, now_s, estimates=False, nodes_after=False)
        for preemption in decided.preemptions:
            self.preempt(preemption.victim_task_id, preemption.for_task_id)
        # The victims' units are free only now: the task they were stopped for is placed by the next
        # decision, at the next step (as production's next cycle does), not at the next arrival.
        self.decide_again = bool(decided.preemptions)
        for bound in decided.placements:
            self.start(self.waiting.pop(bound.task_id), now_s)
        if self.aware:
            chosen = getattr(self.policy, "reasons", {})
            for bound in decided.placements:
                if bound.task_id in chosen and len(self.decisions.reasons) < 12:
                    self.decisions.reasons.append((bound.task_id, chosen[bound.task_id]))
            self.decisions.refusals = len(getattr(self.policy, "refusals", {}))

    def settle(self, now_s: float) -> None:
        """Rates from the truth on every device whose occupants changed or that holds a service (whose
        utilisation moves with time); every running service reports its utilisation now."""
        for task in self.running.values():
            if task.service is not None:
                self.side.telemetry.service_sample(task.task_id, now_s, self.service_util(task, now_s))
        for key in list(self.on_device):
            if not self.on_device[key]:
                continue
            if key in self.dirty or any(self.running[t].service is not None for t in self.on_device[key]):
                self.refresh(key, now_s)
        self.dirty.clear()

    def progress(self, now_s: float, step_s: float) -> bool:
        """Every running job does its step's work; one that finishes stops at its end inside the step.
        True: a new decision is due (a job ended, or the last decision stopped victims)."""
        ended, self.decide_again = self.decide_again, False
        for task in list(self.running.values()):
            if task.job is None:
                continue
            remaining = task.job.work_iterations - task.done
            gain, ran = _step_work(task, step_s)
            task.done += gain
            runs = math.floor((now_s + ran - task.run_start_s) / self.config.checkpoint_s)
            if runs > math.floor((now_s - task.run_start_s) / self.config.checkpoint_s):
                task.checkpointed = task.done
            if gain >= remaining:
                task.finish_s = now_s + ran
                self.stop(task)
                ended = True
        return ended

    # -- its steps -----------------------------------------------------------------------------------------

    def start(self, task: _Task, at_s: float) -> None:
        binding = self.decider.engine.state.bindings[task.task_id]
        task.node = binding.node
        task.devices = tuple((binding.node, d) for d in binding.gpu_indexes)
        task.model = self.node_model[binding.node]
        task.slice_fraction = None
        if binding.unit.kind is UnitKind.MIG and binding.unit.mig_profile:
            profile = profile_by_name(task.model, binding.unit.mig_profile)
            task.slice_fraction = (
                profile.compute_slices / COMPUTE_SLICES,
                profile.memory_slices / MEMORY_SLICES,
            )
        task.run_start_s = at_s
        if task.first_start_s is None:
            task.first_start_s = at_s
        self.running[task.task_id] = task
        for key in task.devices:
            self.on_device[key].append(task.task_id)
            self.dirty.add(key)

    def stop(self, task: _Task) -> None:
        self.running.pop(task.task_id, None)
        for key in task.devices:
            self.on_device[key].remove(task.task_id)
            self.dirty.add(key)
        self.decider.release(task.task_id)

    def preempt(self, victim_id: str, for_task_id: str) -> None:
        """A running victim loses its work since its last checkpoint and waits again: the work thrown away
        leaves the retained count (`window_done`) too."""
        victim = self.running.get(victim_id)
        if victim is None:
            return
        self.decisions.preemptions += 1
        if self.tasks[for_task_id].service is not None:
            self.decisions.service_preemptions += 1
        if victim.job is not None:
            lost = victim.done - victim.checkpointed
            self.decisions.lost_ref_s += lost / self.ref_speed[victim.task_id] * victim.job.num_gpus
            victim.done = victim.checkpointed
            victim.window_done = min(victim.window_done, victim.checkpointed)
        self.stop(victim)
        self.waiting[victim.task_id] = victim

    def refresh(self, key: tuple[int, int], at_s: float) -> None:
        """Every occupant's factor and rate on one device, from the truth; a job alone on a GPU (on its
        first device, not a MIG slice) reports a telemetry sample."""
        members = [self.running[t] for t in self.on_device.get(key, [])]
        model = self.node_model[key[0]]
        shared = self.modes[key[0]][key[1]] is PartitionMode.SHARED and len(members) > 1
        utils = {m.task_id: self.util_of(m, at_s) for m in members}
        for m in members:
            if shared:
                m.factor = self.factor(m, members, utils)
            elif m.service is not None and m.slice_fraction is not None:
                m.factor = mig_service_factor(utils[m.task_id], m.slice_fraction[0])
            else:
                m.factor = 1.0
            if m.job is not None:
                capacity = 1.0
                if m.slice_fraction is not None:
                    capacity = self.world.truth.slice_scale(m.job.job_type, *m.slice_fraction)
                alone = job_rate(self.world.truth, m.job, model, capacity)
                m.rate = alone * m.factor
                if len(members) == 1 and m.slice_fraction is None and m.devices[0] == key:
                    self._report(m, model, alone, utils[m.task_id])

    def _report(self, task: _Task, model: str, throughput: float, util_pct: float) -> None:
        """The only way the truth reaches the policy's side: one telemetry sample (the side adds noise)."""
        assert task.job is not None
        self.side.telemetry.job_sample(workload_name(task.job), model, throughput, util_pct)

    def factor(self, m: _Task, members: Sequence[_Task], utils: dict[str, float]) -> float:
        """`m`'s throughput factor beside the others on a shared GPU (whalegen.goodput.truth, rule 3): a
        measured Lucid pair near its utilisation and its neighbours' sum, picked per task."""
        others = sum(utils[o.task_id] for o in members if o is not m)
        return self.world.shared_pairs.factor(utils[m.task_id], others, self.pick[m.task_id])

    def service_util(self, task: _Task, at_s: float) -> float:
        assert task.service is not None
        series = task.service.profile.util_pct
        return series[int(at_s // GENAI_STEP_S) % len(series)]

    def util_of(self, task: _Task, at_s: float) -> float:
        """SM utilisation now, % of a whole GPU: a service's trace; a job type's, times its demand."""
        if task.service is not None:
            return self.service_util(task, at_s)
        assert task.job is not None
        return self.world.job_util_pct.get(task.job.job_type, 100.0) * job_demand(task.job)

    def job_profile(self, task: _Task) -> TaskProfile:
        assert task.job is not None
        if "oracle" in self.options:
            return self._oracle_profile(task.job)
        return self.side.telemetry.job_profile(workload_name(task.job))

    def _oracle_profile(self, job: Job) -> TaskProfile:
        """`+oracle` only, by name: the power law through the job's true speeds on the fleet's models and
        its true utilisation — the one place the truth reaches a decision, as the named upper bound."""
        models = sorted({m for m in self.node_model if m and self.world.runs_on(job, m)})
        points = [(gpu_figures(m), self.world.truth.speed(job.job_type, m)) for m in models]
        exponent = fit_power_law(points).compute_exponent if len(points) >= 2 else 0.5
        util = self.world.job_util_pct.get(job.job_type, 100.0) * job_demand(job)
        return TaskProfile(exponent, util)

    def service_profile(self, task: _Task, at_s: float) -> TaskProfile:
        assert task.service is not None
        return self.side.telemetry.service_profile(task.task_id, at_s, task.service.sla_min_factor)


def _step_work(task: _Task, step_s: float) -> tuple[float, float]:
    """The iterations a job does over a step at its rate now, and the seconds it runs (less: it ends)."""
    assert task.job is not None
    remaining = task.job.work_iterations - task.done
    gain = task.rate * step_s
    if gain >= remaining and task.rate > 0:
        return remaining, remaining / task.rate
    return gain, step_s


# -- the metrics: observers of the step clock --------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """The measured window (the jobs' arrivals; the drain after it counts for JCT only) and its bins."""

    window_s: float

    @property
    def bin_s(self) -> float:
        return self.window_s / SERIES_BINS

    def part(self, now_s: float, step_s: float) -> tuple[float, int]:
        """The seconds of the step in the window, and the step's series bin (-1: after the window)."""
        in_window = min(step_s, max(0.0, self.window_s - now_s))
        b = min(SERIES_BINS - 1, int(now_s // self.bin_s)) if now_s < self.window_s else -1
        return in_window, b


class _Allocation:
    """Observer: GPU milli held, and GPUs busy (SM utilisation, a MIG slice by its compute share, at most
    100 % a GPU), × seconds in the window."""

    def __init__(self, replay: _GoodputReplay, window: _Window) -> None:
        self.replay = replay
        self.window = window
        self.milli_s = 0.0
        self.busy_s = 0.0

    def step(self, now_s: float, step_s: float) -> None:
        in_window, _ = self.window.part(now_s, step_s)
        if not in_window:
            return
        held = self.replay.decider.engine.state
        used = sum(WHOLE_GPU_MILLI * len(g) - sum(g) for g in held.gpu_free)
        self.milli_s += used * in_window
        for members in self.replay.on_device.values():
            if not members:
                continue
            util = 0.0
            for member in members:
                occupant = self.replay.running[member]
                share = occupant.slice_fraction[0] if occupant.slice_fraction else 1.0
                util += self.replay.util_of(occupant, now_s) * share
            self.busy_s += min(100.0, util) / 100.0 * in_window


class _ServiceLevel:
    """Observer: service-seconds in the window (from arrival to departure), and those below the SLA (not
    running, or slowed below its factor), in total and per bin."""

    def __init__(self, replay: _GoodputReplay, window: _Window) -> None:
        self.replay = replay
        self.window = window
        self.service_s = 0.0
        self.violating_s = 0.0
        self.bins_service = [0.0] * SERIES_BINS
        self.bins_violating = [0.0] * SERIES_BINS

    def step(self, now_s: float, step_s: float) -> None:
        in_window, b = self.window.part(now_s, step_s)
        if not in_window:
            return
        for task in self.replay.service_tasks:
            assert task.service is not None
            if task.arrival_s > now_s or task.task_id in self.replay.gone:
                continue
            self.service_s += in_window
            self.bins_service[b] += in_window
            ok = task.task_id in self.replay.running and task.factor >= task.service.sla_min_factor
            if not ok:
                self.violating_s += in_window
                self.bins_violating[b] += in_window


class _Goodput:
    """Observer: the jobs' work done in the window in reference GPU-seconds, in total and per bin (gross);
    each task's iterations in the window (`window_done`), from which preemptions take back what they throw
    away: the retained work."""

    def __init__(self, replay: _GoodputReplay, window: _Window) -> None:
        self.replay = replay
        self.window = window
        self.work_ref_s = 0.0
        self.bins_work = [0.0] * SERIES_BINS

    def step(self, now_s: float, step_s: float) -> None:
        in_window, b = self.window.part(now_s, step_s)
        if not in_window:
            return
        for task in self.replay.running.values():
            if task.job is None:
                continue
            gain, ran = _step_work(task, step_s)
            share = min(ran, in_window) / ran if ran else 0.0
            task.window_done += gain * share
            work = gain * share / self.replay.ref_speed[task.task_id] * task.job.num_gpus
            self.work_ref_s += work
            if b >= 0:
                self.bins_work[b] += work

    def retained_ref_s(self) -> float:
        return sum(
            t.window_done / self.replay.ref_speed[t.task_id] * t.job.num_gpus
            for t in self.replay.tasks.values()
            if t.job is not None
        )


class _Progress:
    """Observer: the share of the drain limit reached, every 200 steps."""

    def __init__(self, on_progress: Callable[[float], None], end_s: float) -> None:
        self.on_progress = on_progress
        self.end_s = end_s

    def step(self, now_s: float, step_s: float) -> None:
        after_s = now_s + step_s
        if int(after_s / step_s) % 200 == 0:
            self.on_progress(min(1.0, after_s / self.end_s))


@dataclass(frozen=True)
class _Observers:
    allocation: _Allocation
    service_level: _ServiceLevel
    goodput: _Goodput


def _result(
    *,
    fleet: FleetSpec,
    world: World,
    config: ReplayConfig,
    policy: str,
    seed: int,
    services: int,
    replay: _GoodputReplay,
    observers: _Observers,
    window: _Window,
    last_s: float,
    started_cpu: float,
    refused_jobs: int,
) -> RunResult:
    """The run's figures; a job not finished (or not started) by the end counts to the end. Goodput counts
    the retained work only (what preemptions threw away is not work done)."""
    job_tasks = [t for t in replay.tasks.values() if t.job is not None]
    jct = [((t.finish_s if t.finish_s is not None else last_s) - t.arrival_s) / 3600 for t in job_tasks]
    waits = [
        ((t.first_start_s if t.first_start_s is not None else last_s) - t.arrival_s) / 3600 for t in job_tasks
    ]
    gpus, window_s = replay.gpus, window.window_s
    capacity_s = gpus * window_s
    bin_capacity = gpus * window.bin_s
    capacity_ref = sum(world.speedup[p.gpu_model] * p.total_gpus for p in fleet.pools)
    offered_pct = 100 * config.load * capacity_ref / gpus if gpus else 0.0
    models = sorted({m for m in replay.node_model if m})
    no_queue_s = _no_queue_work_s(job_tasks, world, models, window_s, replay.ref_speed)
    allocation, service_level, goodput = observers.allocation, observers.service_level, observers.goodput
    decisions = replay.decisions
    retained_s = goodput.retained_ref_s()
    return RunResult(
        policy=policy,
        seed=seed,
        load=config.load,
        gpus=gpus,
        jobs=len(job_tasks),
        services=services,
        window_h=window_s / 3600,
        goodput_pct=100 * retained_s / capacity_s if capacity_s else 0.0,
        allocated_pct=100 * allocation.milli_s / (WHOLE_GPU_MILLI * capacity_s) if capacity_s else 0.0,
        busy_pct=100 * allocation.busy_s / capacity_s if capacity_s else 0.0,
        sla_violation_pct=(
            100 * service_level.violating_s / service_level.service_s if service_level.service_s else 0.0
        ),
        mean_jct_h=mean(jct),
        p95_jct_h=nearest_rank_percentile(jct, 95),
        mean_wait_h=mean(waits),
        p95_wait_h=nearest_rank_percentile(waits, 95),
        preemptions=decisions.preemptions,
        work_lost_gpu_h=decisions.lost_ref_s / 3600,
        finished=sum(1 for t in job_tasks if t.finish_s is not None),
        cpu_s=time.process_time() - started_cpu,
        series_goodput_pct=tuple(100 * w / bin_capacity for w in goodput.bins_work),
        series_sla_violation_pct=tuple(
            100 * v / s if s else 0.0
            for v, s in zip(service_level.bins_violating, service_level.bins_service, strict=True)
        ),
        reasons=tuple(decisions.reasons),
        refusals=decisions.refusals,
        offered_pct=offered_pct,
        ceiling_pct=min(100 * no_queue_s / capacity_s, 100 * capacity_ref / gpus) if capacity_s else 0.0,
        headroom_gpus_mean=(
            decisions.headroom_milli / decisions.made / WHOLE_GPU_MILLI if decisions.made else 0.0
        ),
        service_preemptions=decisions.service_preemptions,
        work_done_ref_gpu_h=goodput.work_ref_s / 3600,
        work_retained_ref_gpu_h=retained_s / 3600,
        refused_jobs=refused_jobs,
        last_finish_h=(
            max((t.finish_s or 0.0 for t in job_tasks), default=0.0) / 3600
            if all(t.finish_s is not None for t in job_tasks)
            else None
        ),
    )


def _no_queue_work_s(
    job_tasks: Sequence[_Task],
    world: World,
    models: Sequence[str],
    window_s: float,
    ref_speed: dict[str, float],
) -> float:
    """Reference GPU-seconds done in the window if every job started on arrival on its fastest model."""
    best: dict[JobType, float] = {}
    total = 0.0
    for task in job_tasks:
        assert task.job is not None
        job_type = task.job.job_type
        if job_type not in best:
            best[job_type] = max(world.truth.speed(job_type, m) for m in models)
        rate = best[job_type] * job_demand(task.job)
        done = min(task.job.work_iterations, rate * max(0.0, window_s - task.arrival_s))
        total += done / ref_speed[task.task_id] * task.job.num_gpus
    return total


def fleet_models(fleet: FleetSpec) -> list[str]:
    return sorted({get_model(p.gpu_model).name for p in fleet.pools})
