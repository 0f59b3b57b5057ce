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
2. **Decisions.** Every `step_s` in which something arrived, ended or was preempted, the waiting tasks
   (the first `lookahead` by priority, then arrival) go to one session of the production decision
   (`Decider.step`); placements start, preemption victims lose the work since their last checkpoint and
   wait again, departures are released from the session.
3. **Physics** (the truth, which no policy reads): a job's speed is `SpeedModel.throughput` of its type on
   the GPU's model (MIG: the slice's share); on a shared GPU two jobs slow each other by Gavel's pair
   factor (measured, else fitted), a job and a service by the Lucid utilisation rule on the job's SM
   utilisation and the service's utilisation now; more than two: the product over the neighbours.
   A job type's SM utilisation is derived from Gavel: the mean factor it imposes on its V100 neighbours,
   inverted through the utilisation rule beside a neighbour at 100 %.
4. **Telemetry and learning.** What a policy may read is the task's `profile`: for a job, learned from
   the telemetry of earlier runs of the same workload (its name; never its true exponent): throughput
   alone per GPU model fitted by the speed rule's power law, SM utilisation; for a service, the P95 of
   its own utilisation over the last hour. Unseen workloads take the pooled prior (a service not seen
   running yet: the P95 of the running services' last hour).

Deterministic for (fleet, jobs, services, policy, seed, load).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from whalegen.goodput.data import GavelData, JobType
from whalegen.goodput.fleet import FleetSpec, fleet_nodes
from whalegen.goodput.headroom import online_headroom_milli
from whalegen.goodput.interference import InterferenceModel, UtilisationFit, gavel_observations
from whalegen.goodput.jobs import GENAI_STEP_S, REFERENCE_MODEL, Job, Service
from whalegen.goodput.speed import SpeedModel
from whalegen.gpus.catalogue import get_model
from whalegen.gpus.mig import COMPUTE_SLICES, MEMORY_SLICES, profile_by_name
from whalegen.gpus.speed import fit_power_law, gpu_figures
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    PartitionMode,
    RunningTask,
    TaskProfile,
    TaskRequest,
    UnitKind,
)
from whalegen.scheduling import Config, Decider, Snapshot
from whalegen.sim.stats import mean, nearest_rank_percentile

SERVICE_PRIORITY = 10
SERIES_BINS = 48
SERVICE_WINDOW_S = 3600  # the service telemetry a profile is learned from
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
    """The truth of a replay: speeds, pair factors, the utilisation rule, each job type's SM utilisation."""

    speed: SpeedModel
    interference: InterferenceModel
    util_rule: UtilisationFit
    job_util_pct: dict[JobType, float]
    speedup: dict[str, float]  # model → mean throughput over the reference model's, over job types

    @staticmethod
    def build(gavel: GavelData, util_rule: UtilisationFit, models: Sequence[str]) -> World:
        speed = SpeedModel(gavel)
        pressure: dict[JobType, list[float]] = defaultdict(list)
        for _, beside, factor in gavel_observations(gavel, REFERENCE_MODEL):
            pressure[beside].append(factor)
        job_util: dict[JobType, float] = {}
        means = {job: sum(v) / len(v) for job, v in pressure.items()}
        fallback = sorted(means.values())[len(means) // 2] if means else 0.7
        for job in speed.job_types:
            job_util[job] = util_from_imposed(means.get(job, fallback), util_rule)
        speedup = {}
        for model in models:
            ratios = [
                speed.throughput(j, model) / speed.throughput(j, REFERENCE_MODEL)
                for j in speed.job_types
                if speed.measured(j, REFERENCE_MODEL)
            ]
            speedup[model] = sum(ratios) / len(ratios)
        return World(speed, InterferenceModel(gavel), util_rule, job_util, speedup)


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


# -- learning ------------------------------------------------------------------------------------------


class ProfileBook:
    """Profiles learned from telemetry: per workload name, throughput alone per model and SM utilisation."""

    def __init__(self) -> None:
        self.speeds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.utils: dict[str, list[float]] = defaultdict(list)
        self._cache: dict[str, TaskProfile] = {}

    def observe(self, workload: str, model: str, throughput: float, util_pct: float) -> None:
        self.speeds[workload][model].append(throughput)
        self.utils[workload].append(util_pct)
        self._cache.pop(workload, None)
        self._cache.pop("", None)

    def profile(self, workload: str) -> TaskProfile:
        cached = self._cache.get(workload)
        if cached is not None:
            return cached
        by_model = self.speeds.get(workload, {})
        exponent: float | None = None
        if len(by_model) >= 2:
            points = [(gpu_figures(m), sum(v) / len(v)) for m, v in sorted(by_model.items())]
            exponent = fit_power_law(points).compute_exponent
        if exponent is None:
            exponent = self._prior_exponent()
        utils = self.utils.get(workload)
        util = sum(utils) / len(utils) if utils else None
        profile = TaskProfile(compute_exponent=exponent, sm_util_pct=util)
        self._cache[workload] = profile
        return profile

    def _prior_exponent(self) -> float:
        fitted = [
            fit_power_law([(gpu_figures(m), sum(v) / len(v)) for m, v in sorted(by.items())]).compute_exponent
            for by in self.speeds.values()
            if len(by) >= 2
        ]
        return sum(fitted) / len(fitted) if fitted else 0.5


def dense_part(jobs: Sequence[Job], drop_fraction: float = 0.01) -> tuple[Job, ...]:
    """The jobs from the trace's dense part on: openb's first tasks (about 1 %) were created up to 110 days
    before the rest (pods alive before the collection window); they would stretch a scaled window."""
    if not jobs:
        return ()
    ordered = sorted(j.arrival_s for j in jobs)
    start = ordered[min(len(ordered) - 1, int(drop_fraction * len(ordered)))]
    return tuple(j for j in jobs if j.arrival_s >= start)


def workload_name(job_type: JobType) -> str:
    """What a fleet sees of a job: its name (the model and batch size it runs, and its GPU count)."""
    return str(job_type)


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


@dataclass
class _Tally:
    work_ref_s: float = 0.0  # reference GPU-seconds done in the window
    milli_s: float = 0.0
    busy_s: float = 0.0
    service_s: float = 0.0
    violating_s: float = 0.0
    bins_work: list[float] = field(default_factory=lambda: [0.0] * SERIES_BINS)
    bins_service: list[float] = field(default_factory=lambda: [0.0] * SERIES_BINS)
    bins_violating: list[float] = field(default_factory=lambda: [0.0] * SERIES_BINS)


def offered_window_s(
    jobs: Sequence[Job], fleet: FleetSpec, world: World, load: float, max_runtime_s: float
) -> float:
    """The window over which the jobs' work is `load` × the fleet's capacity in reference GPUs."""
    offered = sum(min(j.reference_runtime_s, max_runtime_s) * j.num_gpus for j in jobs)
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
            ),
        )
        for job in jobs
    ]


@dataclass(frozen=True)
class Ceilings:
    """Bounds on a run's goodput, in % of the fleet's GPU-hours of the window (docs/goodput.md §8)."""

    no_queue_pct: float  # every job on arrival on its fastest model, alone: strict
    mean_capacity_pct: float  # every GPU busy at its model's mean speed over the job types: not strict
    best_job_capacity_pct: float  # every GPU busy at its model's best job type's speed: strict

    @property
    def strict_pct(self) -> float:
        return min(self.no_queue_pct, self.best_job_capacity_pct)


def ceilings(fleet: FleetSpec, jobs: Sequence[Job], world: World, config: ReplayConfig) -> Ceilings:
    window_s, scaled = scaled_jobs(jobs, fleet, world, config)
    gpus = fleet.total_gpus
    models = sorted({get_model(p.gpu_model).name for p in fleet.pools})
    tasks = [_Task(job.job_id, TaskRequest(job.job_id, 0, 0), arrival, job=job) for arrival, job in scaled]
    ref = {t.task_id: world.speed.throughput(t.job.job_type, REFERENCE_MODEL) for t in tasks if t.job}
    no_queue = _no_queue_work_s(tasks, world, models, window_s, ref)
    best = {m: _best_speedup(world, m) for m in models}
    capacity_s = gpus * window_s
    return Ceilings(
        100 * no_queue / capacity_s,
        100 * sum(world.speedup[p.gpu_model] * p.total_gpus for p in fleet.pools) / gpus,
        100 * sum(best[get_model(p.gpu_model).name] * p.total_gpus for p in fleet.pools) / gpus,
    )


def _best_speedup(world: World, model: str) -> float:
    """The fastest job type's speed on `model` over its reference-model speed (measured types only)."""
    return max(
        world.speed.throughput(j, model) / world.speed.throughput(j, REFERENCE_MODEL)
        for j in world.speed.job_types
        if world.speed.measured(j, REFERENCE_MODEL)
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
    started_cpu = time.process_time()
    base_policy, options = split_policy(policy)
    nodes = fleet_nodes(fleet)
    names = [n.name for n in nodes]
    node_model = [n.model or "" for n in nodes]
    modes = [[g.mode for g in n.gpus] for n in nodes]
    gpus = sum(len(n.gpus) for n in nodes)
    window_s, scaled = scaled_jobs(jobs, fleet, world, config)
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
            priority=0 if job.preemptible else 1,
            preemptible=job.preemptible,
            submitted_at_s=arrival,
        )
        tasks[job.job_id] = _Task(job.job_id, request, arrival, job=job)
    service_tasks = [t for t in tasks.values() if t.service is not None]
    mix = shape_mix_from_tasks([t.request for t in tasks.values()])
    snapshot = Snapshot(ClusterSnapshot(nodes, shape_mix=mix), unit_exact=False)
    decider = Decider(snapshot, Config(policy=base_policy, seed=seed))
    book = ProfileBook()
    future = sorted(tasks.values(), key=lambda t: (t.arrival_s, t.task_id), reverse=True)
    waiting: dict[str, _Task] = {}
    running: dict[str, _Task] = {}
    on_device: dict[tuple[int, int], list[str]] = defaultdict(list)
    dirty: set[tuple[int, int]] = set()
    tally = _Tally()
    preemptions = 0
    lost_ref_s = 0.0
    reasons: list[tuple[str, str]] = []
    refusals = 0
    end_s = window_s * config.drain_factor
    bin_s = window_s / SERIES_BINS
    step = config.step_s
    now = 0.0
    changed = True
    ref_speed = {
        t.task_id: world.speed.throughput(t.job.job_type, REFERENCE_MODEL) for t in tasks.values() if t.job
    }
    departures = sorted(
        ((t.leave_s, t.task_id) for t in service_tasks if t.leave_s is not None), reverse=True
    )
    gone: set[str] = set()
    seen_arrivals: list[float] = []  # services' arrivals after t = 0: the headroom forecast's history
    headroom_sum = 0.0
    decisions_made = 0
    service_preemptions = 0

    def service_util(task: _Task, at_s: float) -> float:
        assert task.service is not None
        series = task.service.profile.util_pct
        return series[int(at_s // GENAI_STEP_S) % len(series)]

    def util_of(task: _Task, at_s: float) -> float:
        if task.service is not None:
            return service_util(task, at_s)
        assert task.job is not None
        return world.job_util_pct.get(task.job.job_type, 100.0)

    def refresh(key: tuple[int, int], at_s: float) -> None:
        """Every occupant's factor and rate on one device, from the truth."""
        members = [running[t] for t in on_device.get(key, [])]
        model = node_model[key[0]]
        shared = modes[key[0]][key[1]] is PartitionMode.SHARED and len(members) > 1
        utils = {m.task_id: util_of(m, at_s) for m in members}
        total = sum(utils.values())
        for m in members:
            factor = 1.0
            if shared:
                for other in members:
                    if other is m:
                        continue
                    if m.job is not None and other.job is not None:
                        factor *= world.interference.pair(m.job.job_type, other.job.job_type, model).first
                if m.service is not None or any(o.service is not None for o in members if o is not m):
                    others = total - utils[m.task_id]
                    if m.service is not None:
                        factor *= world.util_rule.factor(utils[m.task_id], others)
                    else:
                        svc_util = sum(utils[o.task_id] for o in members if o.service is not None)
                        factor *= world.util_rule.factor(utils[m.task_id], svc_util)
            m.factor = factor
            if m.job is not None:
                if m.slice_fraction is not None:
                    alone = world.speed.throughput_on_slice(m.job.job_type, model, *m.slice_fraction)
                else:
                    alone = world.speed.throughput(m.job.job_type, model)
                m.rate = alone * factor
                if len(members) == 1 and m.slice_fraction is None and m.devices[0] == key:
                    book.observe(workload_name(m.job.job_type), model, alone, utils[m.task_id])

    def start(task: _Task, at_s: float) -> None:
        binding = decider.engine.state.bindings[task.task_id]
        task.node = binding.node
        task.devices = tuple((binding.node, d) for d in binding.gpu_indexes)
        task.model = node_model[binding.node]
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
        running[task.task_id] = task
        for key in task.devices:
            on_device[key].append(task.task_id)
            dirty.add(key)

    def stop(task: _Task) -> None:
        running.pop(task.task_id, None)
        for key in task.devices:
            on_device[key].remove(task.task_id)
            dirty.add(key)
        decider.release(task.task_id)

    def job_profile(task: _Task) -> TaskProfile:
        assert task.job is not None
        if "oracle" in options:
            job_type = task.job.job_type
            return TaskProfile(
                world.speed.compute_exponent(job_type), world.job_util_pct.get(job_type, 100.0)
            )
        return book.profile(workload_name(task.job.job_type))

    pooled_at: dict[float, float | None] = {}

    def pooled_service_util(at_s: float) -> float | None:
        """The P95 over the running services' last hour: the prior of a service not seen running yet."""
        if at_s not in pooled_at:
            grid = _grid(max(0.0, at_s - SERVICE_WINDOW_S), at_s)
            samples = [service_util(o, t) for o in running.values() if o.service is not None for t in grid]
            pooled_at.clear()
            pooled_at[at_s] = nearest_rank_percentile(samples, 95) if samples else None
        return pooled_at[at_s]

    def service_profile(task: _Task, at_s: float) -> TaskProfile:
        assert task.service is not None
        if task.first_start_s is not None:
            samples = [service_util(task, t) for t in _grid(max(0.0, at_s - SERVICE_WINDOW_S), at_s)]
            util = nearest_rank_percentile(samples, 95) if samples else None
        else:
            util = pooled_service_util(at_s)
        return TaskProfile(compute_exponent=0.5, sm_util_pct=util, sla_min_factor=task.service.sla_min_factor)

    policy_object = decider.engine.policy
    aware = policy_object.task_aware
    while now < end_s and (future or waiting or running):
        # 1. Arrivals.
        while future and future[-1].arrival_s <= now:
            task = future.pop()
            waiting[task.task_id] = task
            if task.service is not None and task.arrival_s > 0:
                seen_arrivals.append(task.arrival_s)
            changed = True
        while departures and departures[-1][0] <= now:
            _, leaving = departures.pop()
            gone.add(leaving)
            waiting.pop(leaving, None)
            if leaving in running:
                stop(running[leaving])
            changed = True
        # 2. Decide.
        if changed and waiting:
            if aware:
                feed = getattr(policy_object, "profiles", None)
                if isinstance(feed, dict):
                    for t in running.values():
                        if t.service is not None:
                            feed[t.task_id] = service_profile(t, now)
            ordered = sorted(waiting.values(), key=lambda t: (-t.request.priority, t.arrival_s, t.task_id))
            pending = []
            for t in ordered[: config.lookahead]:
                profile = job_profile(t) if t.job is not None else service_profile(t, now)
                pending.append(replace(t.request, profile=profile))
            # The session's snapshot names what runs now: the decision keeps only preemptions of running
            # tasks (victims placed in this very step are not stoppable).
            decider.snapshot = replace(
                snapshot,
                cluster=replace(
                    snapshot.cluster,
                    running=tuple(
                        RunningTask(t.task_id, names[t.node], (), 0, 0, 0, priority=t.request.priority)
                        for t in running.values()
                    ),
                ),
            )
            if "headroom" in options:
                reserve = online_headroom_milli(seen_arrivals, now, config.service_milli)
                decider.engine_config = replace(decider.engine_config, online_reserve_milli=reserve)
                decider.engine.config = decider.engine_config
                headroom_sum += reserve
            decisions_made += 1
            decisions = decider.step(tuple(pending), now, estimates=False, nodes_after=False)
            for preemption in decisions.preemptions:
                victim = running.get(preemption.victim_task_id)
                if victim is None:
                    continue
                preemptions += 1
                if tasks[preemption.for_task_id].service is not None:
                    service_preemptions += 1
                if victim.job is not None:
                    lost = victim.done - victim.checkpointed
                    lost_ref_s += lost / ref_speed[victim.task_id] * victim.job.num_gpus
                    victim.done = victim.checkpointed
                stop(victim)
                waiting[victim.task_id] = victim
            for bound in decisions.placements:
                task = waiting.pop(bound.task_id)
                start(task, now)
            if aware:
                chosen = getattr(policy_object, "reasons", {})
                for bound in decisions.placements:
                    if bound.task_id in chosen and len(reasons) < 12:
                        reasons.append((bound.task_id, chosen[bound.task_id]))
                refusals = len(getattr(policy_object, "refusals", {}))
        changed = False
        # 3. Physics over [now, now + step).
        for key in list(on_device):
            if not on_device[key]:
                continue
            if key in dirty or any(running[t].service is not None for t in on_device[key]):
                refresh(key, now)
        dirty.clear()
        in_window = min(step, max(0.0, window_s - now))
        b = min(SERIES_BINS - 1, int(now // bin_s)) if now < window_s else -1
        if in_window:
            held = decider.engine.state
            used = sum(WHOLE_GPU_MILLI * len(g) - sum(g) for g in held.gpu_free)
            tally.milli_s += used * in_window
            for members in on_device.values():
                if not members:
                    continue
                util = 0.0
                for member in members:
                    occupant = running[member]
                    share = occupant.slice_fraction[0] if occupant.slice_fraction else 1.0
                    util += util_of(occupant, now) * share
                tally.busy_s += min(100.0, util) / 100.0 * in_window
            for task in service_tasks:
                assert task.service is not None
                if task.arrival_s > now or task.task_id in gone:
                    continue
                tally.service_s += in_window
                tally.bins_service[b] += in_window
                ok = task.task_id in running and task.factor >= task.service.sla_min_factor
                if not ok:
                    tally.violating_s += in_window
                    tally.bins_violating[b] += in_window
        for task in list(running.values()):
            if task.job is None:
                continue
            remaining = task.job.work_iterations - task.done
            gain = task.rate * step
            ran = step
            if gain >= remaining and task.rate > 0:
                ran = remaining / task.rate
                gain = remaining
            if in_window:
                share = min(ran, in_window) / ran if ran else 0.0
                work = gain * share / ref_speed[task.task_id] * task.job.num_gpus
                tally.work_ref_s += work
                if b >= 0:
                    tally.bins_work[b] += work
            task.done += gain
            runs = math.floor((now + ran - task.run_start_s) / config.checkpoint_s)
            if runs > math.floor((now - task.run_start_s) / config.checkpoint_s):
                task.checkpointed = task.done
            if gain >= remaining:
                task.finish_s = now + ran
                stop(task)
                changed = True
        now += step
        if on_progress is not None and int(now / step) % 200 == 0:
            on_progress(min(1.0, now / end_s))
    # 4. Figures.
    job_tasks = [t for t in tasks.values() if t.job is not None]
    jct = [((t.finish_s if t.finish_s is not None else now) - t.arrival_s) / 3600 for t in job_tasks]
    waits = [
        ((t.first_start_s if t.first_start_s is not None else now) - t.arrival_s) / 3600 for t in job_tasks
    ]
    capacity_s = gpus * window_s
    bin_capacity = gpus * bin_s
    capacity_ref = sum(world.speedup[p.gpu_model] * p.total_gpus for p in fleet.pools)
    offered_pct = 100 * config.load * capacity_ref / gpus if gpus else 0.0
    no_queue_s = _no_queue_work_s(job_tasks, world, sorted({m for m in node_model if m}), window_s, ref_speed)
    return RunResult(
        policy=policy,
        seed=seed,
        load=config.load,
        gpus=gpus,
        jobs=len(job_tasks),
        services=len(services),
        window_h=window_s / 3600,
        goodput_pct=100 * tally.work_ref_s / capacity_s if capacity_s else 0.0,
        allocated_pct=100 * tally.milli_s / (WHOLE_GPU_MILLI * capacity_s) if capacity_s else 0.0,
        busy_pct=100 * tally.busy_s / capacity_s if capacity_s else 0.0,
        sla_violation_pct=100 * tally.violating_s / tally.service_s if tally.service_s else 0.0,
        mean_jct_h=mean(jct),
        p95_jct_h=nearest_rank_percentile(jct, 95),
        mean_wait_h=mean(waits),
        p95_wait_h=nearest_rank_percentile(waits, 95),
        preemptions=preemptions,
        work_lost_gpu_h=lost_ref_s / 3600,
        finished=sum(1 for t in job_tasks if t.finish_s is not None),
        cpu_s=time.process_time() - started_cpu,
        series_goodput_pct=tuple(100 * w / bin_capacity for w in tally.bins_work),
        series_sla_violation_pct=tuple(
            100 * v / s if s else 0.0 for v, s in zip(tally.bins_violating, tally.bins_service, strict=True)
        ),
        reasons=tuple(reasons),
        refusals=refusals,
        offered_pct=offered_pct,
        ceiling_pct=min(100 * no_queue_s / capacity_s, 100 * capacity_ref / gpus) if capacity_s else 0.0,
        headroom_gpus_mean=headroom_sum / decisions_made / WHOLE_GPU_MILLI if decisions_made else 0.0,
        service_preemptions=service_preemptions,
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
            best[job_type] = max(world.speed.throughput(job_type, m) for m in models)
        done = min(task.job.work_iterations, best[job_type] * max(0.0, window_s - task.arrival_s))
        total += done / ref_speed[task.task_id] * task.job.num_gpus
    return total


def _grid(lo_s: float, hi_s: float) -> list[float]:
    """The service trace's sample times in [lo, hi)."""
    first = math.ceil(lo_s / GENAI_STEP_S)
    last = math.ceil(hi_s / GENAI_STEP_S)
    return [k * GENAI_STEP_S for k in range(first, last)]


def fleet_models(fleet: FleetSpec) -> list[str]:
    return sorted({get_model(p.gpu_model).name for p in fleet.pools})
