"""Scenario replay: tenants, quotas, queues, priorities and gangs through the production decision.

A scenario (YAML, docs/scenario-replay.md) names a pool, tenants with quotas and queues, and task
streams. `run_scenario` moves time in scheduling cycles of `cycle_s` and at every cycle does what the
production cycle does: read a snapshot of the pool (free GPUs, running and pending tasks, quotas,
queues), call the production decision (`whalegen.scheduling.Decider.step`, the body of `decide`), and
commit it: placements start, preemption victims go back to the queue (with the production requeue
back-off and attempt limit), everything else waits. Nothing about admission, ordering, quotas, gangs or
preemption is decided here.

Pure: no Django, no clock, no I/O beyond parsing a text the caller read.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from whalegen.gpus.catalogue import canonical_model_name, get_model
from whalegen.placement.fragmentation import cluster_fragmentation, shape_mix_from_tasks
from whalegen.placement.registry import make_policy
from whalegen.placement.state import Binding
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    GpuState,
    Isolation,
    NodeState,
    PartitionMode,
    Placement,
    Quota,
    RunningTask,
    TaskPrediction,
    TaskRequest,
    UnitKind,
)
from whalegen.scheduling import Config, Decider, Decisions, Snapshot
from whalegen.sim.loop import CycleClock, Departures, run_cycles
from whalegen.sim.stats import mean, percentile

SERIES_BINS = 200  # points of the per-tenant allocation curve kept per run


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the field (`streams[1].shape.num_gpu: …`)."""


# -- the format --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeGroup:
    name: str
    count: int
    gpu_model: str
    gpus_per_node: int
    cpu_milli: int
    mem_mib: int
    partition_mode: PartitionMode = PartitionMode.WHOLE


@dataclass(frozen=True)
class QueueSpec:
    name: str
    weight: int = 1
    priority: int = 0  # the queue's default priority for its streams


@dataclass(frozen=True)
class TenantSpec:
    name: str
    guaranteed_milli: int
    borrow_limit_milli: int
    queues: tuple[QueueSpec, ...]


@dataclass(frozen=True)
class Arrival:
    """`poisson` (exponential gaps at `rate_per_h`), `every` (fixed gap `every_s`) or `at` (listed times)."""

    process: str
    rate_per_h: float = 0.0
    every_s: float = 0.0
    at_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Runtime:
    """`fixed` (`s`), `exponential` (`mean_s`), `lognormal` (`median_s`, `sigma`) or `uniform`
    (`min_s`…`max_s`)."""

    dist: str
    s: float = 0.0
    mean_s: float = 0.0
    median_s: float = 0.0
    sigma: float = 0.0
    min_s: float = 0.0
    max_s: float = 0.0

    @property
    def expected_s(self) -> float:
        """The mean, what a profile's duration would say (the snapshot's expected run time)."""
        if self.dist == "fixed":
            return self.s
        if self.dist == "exponential":
            return self.mean_s
        if self.dist == "lognormal":
            return self.median_s * math.exp(self.sigma**2 / 2)
        return (self.min_s + self.max_s) / 2

    def draw(self, rng: random.Random) -> float:
        if self.dist == "fixed":
            return self.s
        if self.dist == "exponential":
            return rng.expovariate(1.0 / self.mean_s)
        if self.dist == "lognormal":
            return rng.lognormvariate(math.log(self.median_s), self.sigma)
        return rng.uniform(self.min_s, self.max_s)


@dataclass(frozen=True)
class Stream:
    name: str
    tenant: str
    queue: str
    arrival: Arrival
    runtime: Runtime
    num_gpu: int
    gpu_milli: int
    gpu_mem_mib: int = 0
    cpu_milli: int = 1000
    mem_mib: int = 4096
    priority: int | None = None  # None: the queue's default
    preemptible: bool = False
    gang_size: int = 1  # every arrival is a gang of this many members of the shape
    isolation: Isolation = Isolation.ANY
    sla_online: bool = False
    start_s: float = 0.0
    stop_s: float | None = None  # None: the scenario's horizon
    count: int | None = None  # at most this many arrivals


@dataclass(frozen=True)
class Scenario:
    name: str
    horizon_s: float  # arrivals stop here; the run goes on until everything started has ended
    node_groups: tuple[NodeGroup, ...]
    tenants: tuple[TenantSpec, ...]
    streams: tuple[Stream, ...]
    cycle_s: float = 10.0
    preemption: bool = True
    online_reserve_milli: int = 0
    # The production requeue rules (WHALEGEN_REQUEUE_BACKOFF_S, …_MAX_S, WHALEGEN_MAX_ATTEMPTS).
    requeue_backoff_s: float = 5.0
    requeue_backoff_max_s: float = 300.0
    max_attempts: int = 5

    def nodes(self) -> tuple[NodeState, ...]:
        out = []
        for group in self.node_groups:
            total_mem = get_model(group.gpu_model).mem_mib or 0
            for i in range(group.count):
                gpus = tuple(
                    GpuState(d, group.gpu_model, WHOLE_GPU_MILLI, total_mem, total_mem, group.partition_mode)
                    for d in range(group.gpus_per_node)
                )
                out.append(
                    NodeState(
                        f"{group.name}-{i:02d}",
                        group.cpu_milli,
                        group.cpu_milli,
                        group.mem_mib,
                        group.mem_mib,
                        gpus,
                    )
                )
        return tuple(out)

    def quotas(self) -> tuple[Quota, ...]:
        return tuple(Quota(t.name, t.guaranteed_milli, t.borrow_limit_milli) for t in self.tenants)


class _Fields:
    """Reads one mapping of the YAML, naming the path of every field it complains about."""

    def __init__(self, data: object, path: str, allowed: Sequence[str]) -> None:
        if not isinstance(data, dict):
            raise ScenarioError(f"{path or 'scenario'}: must be a mapping, got {_kind(data)}")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            where = f"{path}." if path else ""
            raise ScenarioError(f"{where}{unknown[0]}: unknown field (known: {', '.join(allowed)})")
        self.data: dict[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> object:
        if key not in self.data:
            raise ScenarioError(f"{self.at(key)}: required")
        return self.data[key]

    def text(self, key: str, default: str | None = None) -> str:
        if key not in self.data and default is not None:
            return default
        value = self.raw(key)
        if not isinstance(value, str) or not value:
            raise ScenarioError(f"{self.at(key)}: must be a non-empty string, got {_kind(value)}")
        return value

    def integer(self, key: str, default: int | None = None, *, low: int = 0) -> int:
        if key not in self.data and default is not None:
            return default
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{self.at(key)}: must be an integer, got {_kind(value)}")
        if value < low:
            raise ScenarioError(f"{self.at(key)}: must be at least {low}, got {value}")
        return value

    def number(self, key: str, default: float | None = None, *, positive: bool = False) -> float:
        if key not in self.data and default is not None:
            return default
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScenarioError(f"{self.at(key)}: must be a number, got {_kind(value)}")
        if value < 0 or (positive and value == 0):
            raise ScenarioError(
                f"{self.at(key)}: must be {'above' if positive else 'at least'} 0, got {value}"
            )
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        if key not in self.data:
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise ScenarioError(f"{self.at(key)}: must be true or false, got {_kind(value)}")
        return value

    def items(self, key: str) -> list[object]:
        value = self.raw(key)
        if not isinstance(value, list) or not value:
            raise ScenarioError(f"{self.at(key)}: must be a non-empty list, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool | int | float):
        return repr(value)
    return type(value).__name__


def parse_scenario(text: str) -> Scenario:
    """A scenario from its YAML text; a `ScenarioError` naming the field for anything wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    top = _Fields(
        data,
        "",
        (
            "name",
            "horizon_s",
            "cycle_s",
            "preemption",
            "online_reserve_milli",
            "requeue_backoff_s",
            "requeue_backoff_max_s",
            "max_attempts",
            "pool",
            "tenants",
            "streams",
        ),
    )
    pool = _Fields(top.raw("pool"), "pool", ("node_groups",))
    groups = tuple(_node_group(g, f"pool.node_groups[{i}]") for i, g in enumerate(pool.items("node_groups")))
    _unique([g.name for g in groups], "pool.node_groups", "name")
    tenants = tuple(_tenant(t, f"tenants[{i}]") for i, t in enumerate(top.items("tenants")))
    _unique([t.name for t in tenants], "tenants", "name")
    by_tenant = {t.name: t for t in tenants}
    streams = tuple(_stream(s, f"streams[{i}]", by_tenant) for i, s in enumerate(top.items("streams")))
    _unique([s.name for s in streams], "streams", "name")
    scenario = Scenario(
        name=top.text("name"),
        horizon_s=top.number("horizon_s", positive=True),
        node_groups=groups,
        tenants=tenants,
        streams=streams,
        cycle_s=top.number("cycle_s", 10.0, positive=True),
        preemption=top.flag("preemption", True),
        online_reserve_milli=top.integer("online_reserve_milli", 0),
        requeue_backoff_s=top.number("requeue_backoff_s", 5.0),
        requeue_backoff_max_s=top.number("requeue_backoff_max_s", 300.0),
        max_attempts=top.integer("max_attempts", 5, low=1),
    )
    _check_fits(scenario)
    return scenario


def _unique(names: Sequence[str], path: str, key: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ScenarioError(f"{path}[{i}].{key}: {name!r} is used twice")
        seen.add(name)


def _node_group(data: object, path: str) -> NodeGroup:
    f = _Fields(
        data, path, ("name", "count", "gpu_model", "gpus_per_node", "cpu_milli", "mem_mib", "partition_mode")
    )
    try:
        model = canonical_model_name(f.text("gpu_model"))
    except LookupError as error:
        raise ScenarioError(f"{f.at('gpu_model')}: {error}") from None
    if get_model(model).mem_mib is None:
        raise ScenarioError(f"{f.at('gpu_model')}: {model} has no known memory size")
    mode_text = f.text("partition_mode", "whole")
    modes = [m.value for m in PartitionMode]
    if mode_text not in modes:
        raise ScenarioError(f"{f.at('partition_mode')}: must be one of {', '.join(modes)}, got {mode_text!r}")
    return NodeGroup(
        name=f.text("name"),
        count=f.integer("count", low=1),
        gpu_model=model,
        gpus_per_node=f.integer("gpus_per_node", low=1),
        cpu_milli=f.integer("cpu_milli", low=1),
        mem_mib=f.integer("mem_mib", low=1),
        partition_mode=PartitionMode(mode_text),
    )


def _tenant(data: object, path: str) -> TenantSpec:
    f = _Fields(data, path, ("name", "guaranteed_milli", "borrow_limit_milli", "queues"))
    queues: list[QueueSpec] = []
    if f.has("queues"):
        for i, q in enumerate(f.items("queues")):
            qf = _Fields(q, f"{f.at('queues')}[{i}]", ("name", "weight", "priority"))
            queues.append(
                QueueSpec(qf.text("name"), qf.integer("weight", 1, low=1), qf.integer("priority", 0))
            )
        _unique([q.name for q in queues], f.at("queues"), "name")
    else:
        queues.append(QueueSpec("default"))
    return TenantSpec(
        name=f.text("name"),
        guaranteed_milli=f.integer("guaranteed_milli"),
        borrow_limit_milli=f.integer("borrow_limit_milli", 0),
        queues=tuple(queues),
    )


def _arrival(data: object, path: str) -> Arrival:
    f = _Fields(data, path, ("process", "rate_per_h", "every_s", "at_s"))
    process = f.text("process")
    if process == "poisson":
        return Arrival(process, rate_per_h=f.number("rate_per_h", positive=True))
    if process == "every":
        return Arrival(process, every_s=f.number("every_s", positive=True))
    if process == "at":
        times = f.items("at_s")
        for i, t in enumerate(times):
            if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
                raise ScenarioError(f"{f.at('at_s')}[{i}]: must be a number of seconds ≥ 0, got {_kind(t)}")
        return Arrival(process, at_s=tuple(sorted(float(t) for t in times)))  # type: ignore[arg-type]
    raise ScenarioError(f"{f.at('process')}: must be poisson, every or at, got {process!r}")


def _runtime(data: object, path: str) -> Runtime:
    f = _Fields(data, path, ("dist", "s", "mean_s", "median_s", "sigma", "min_s", "max_s"))
    dist = f.text("dist")
    if dist == "fixed":
        return Runtime(dist, s=f.number("s", positive=True))
    if dist == "exponential":
        return Runtime(dist, mean_s=f.number("mean_s", positive=True))
    if dist == "lognormal":
        return Runtime(dist, median_s=f.number("median_s", positive=True), sigma=f.number("sigma", 0.5))
    if dist == "uniform":
        low, high = f.number("min_s", positive=True), f.number("max_s", positive=True)
        if high < low:
            raise ScenarioError(f"{f.at('max_s')}: must be at least min_s ({low}), got {high}")
        return Runtime(dist, min_s=low, max_s=high)
    raise ScenarioError(f"{f.at('dist')}: must be fixed, exponential, lognormal or uniform, got {dist!r}")


def _stream(data: object, path: str, tenants: Mapping[str, TenantSpec]) -> Stream:
    f = _Fields(
        data,
        path,
        (
            "name",
            "tenant",
            "queue",
            "arrival",
            "runtime",
            "shape",
            "priority",
            "preemptible",
            "gang_size",
            "sla_online",
            "start_s",
            "stop_s",
            "count",
        ),
    )
    tenant = f.text("tenant")
    if tenant not in tenants:
        raise ScenarioError(f"{f.at('tenant')}: no tenant {tenant!r} (tenants: {', '.join(tenants)})")
    queues = [q.name for q in tenants[tenant].queues]
    queue = f.text("queue", queues[0])
    if queue not in queues:
        raise ScenarioError(
            f"{f.at('queue')}: tenant {tenant} has no queue {queue!r} (queues: {', '.join(queues)})"
        )
    shape = _Fields(
        f.raw("shape"),
        f.at("shape"),
        ("num_gpu", "gpu_milli", "gpu_mem_mib", "cpu_milli", "mem_mib", "isolation"),
    )
    num_gpu = shape.integer("num_gpu")
    gpu_milli = shape.integer("gpu_milli", WHOLE_GPU_MILLI if num_gpu else 0)
    if gpu_milli > WHOLE_GPU_MILLI or (num_gpu > 1 and gpu_milli != WHOLE_GPU_MILLI):
        raise ScenarioError(
            f"{shape.at('gpu_milli')}: must be at most 1000, and 1000 when num_gpu > 1, got {gpu_milli}"
        )
    if num_gpu and not gpu_milli:
        raise ScenarioError(f"{shape.at('gpu_milli')}: must be above 0 when num_gpu > 0")
    isolations = [i.value for i in Isolation]
    isolation = shape.text("isolation", "any")
    if isolation not in isolations:
        raise ScenarioError(
            f"{shape.at('isolation')}: must be one of {', '.join(isolations)}, got {isolation!r}"
        )
    start_s = f.number("start_s", 0.0)
    stop_s = f.number("stop_s") if f.has("stop_s") else None
    if stop_s is not None and stop_s < start_s:
        raise ScenarioError(f"{f.at('stop_s')}: must be at least start_s ({start_s}), got {stop_s}")
    return Stream(
        name=f.text("name"),
        tenant=tenant,
        queue=queue,
        arrival=_arrival(f.raw("arrival"), f.at("arrival")),
        runtime=_runtime(f.raw("runtime"), f.at("runtime")),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_mem_mib=shape.integer("gpu_mem_mib", 0),
        cpu_milli=shape.integer("cpu_milli", 1000),
        mem_mib=shape.integer("mem_mib", 4096),
        priority=f.integer("priority", low=-(10**6)) if f.has("priority") else None,
        preemptible=f.flag("preemptible", False),
        gang_size=f.integer("gang_size", 1, low=1),
        isolation=Isolation(isolation),
        sla_online=f.flag("sla_online", False),
        start_s=start_s,
        stop_s=stop_s,
        count=f.integer("count", low=1) if f.has("count") else None,
    )


def _check_fits(scenario: Scenario) -> None:
    """A stream whose shape no node of the empty pool holds would wait forever: refuse it up front."""
    for i, s in enumerate(scenario.streams):
        fits = any(
            g.gpus_per_node >= s.num_gpu and g.cpu_milli >= s.cpu_milli and g.mem_mib >= s.mem_mib
            for g in scenario.node_groups
        )
        if not fits:
            raise ScenarioError(
                f"streams[{i}].shape: {s.num_gpu} GPU(s), {s.cpu_milli} CPU milli, {s.mem_mib} MiB "
                "fit no node group"
            )
        # A gang places all its members at once or none: more members than the empty pool can hold
        # side by side would wait forever (a bound: it counts GPUs and shares, not CPU or memory).
        per_gpu = WHOLE_GPU_MILLI // s.gpu_milli if s.num_gpu == 1 and s.gpu_milli < WHOLE_GPU_MILLI else 1
        room = (
            math.inf
            if not s.num_gpu
            else sum(
                g.count * (g.gpus_per_node // s.num_gpu) * per_gpu
                for g in scenario.node_groups
                if g.gpus_per_node >= s.num_gpu and g.cpu_milli >= s.cpu_milli and g.mem_mib >= s.mem_mib
            )
        )
        if s.gang_size > room:
            raise ScenarioError(
                f"streams[{i}].gang_size: a gang of {s.gang_size} members of {s.num_gpu} GPU(s) never fits: "
                f"the empty pool holds at most {room} such members at once"
            )
        tenant = next(t for t in scenario.tenants if t.name == s.tenant)
        need = s.num_gpu * s.gpu_milli * s.gang_size
        if need > tenant.guaranteed_milli + tenant.borrow_limit_milli:
            raise ScenarioError(
                f"streams[{i}]: one arrival asks {need} milli-GPU, above tenant {s.tenant}'s quota "
                f"({tenant.guaranteed_milli} guaranteed + {tenant.borrow_limit_milli} borrowable)"
            )


# -- arrivals ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One task of the scenario: its request, when it arrives and how long it runs once started."""

    request: TaskRequest
    stream: str
    arrival_s: float
    runtime_s: float


def arrivals(scenario: Scenario, seed: int) -> tuple[Job, ...]:
    """Every task of the scenario for `seed`, in arrival order.

    Each stream draws from its own generator (seeded by the seed and the stream's name), so adding a
    stream leaves the others' tasks as they were. A gang's members arrive together and share a run time.
    """
    tenants = {t.name: t for t in scenario.tenants}
    jobs: list[Job] = []
    for stream in scenario.streams:
        rng = random.Random(f"{seed}:{stream.name}")
        queue = next(q for q in tenants[stream.tenant].queues if q.name == stream.queue)
        priority = queue.priority if stream.priority is None else stream.priority
        stop_s = min(scenario.horizon_s, stream.stop_s if stream.stop_s is not None else scenario.horizon_s)
        for n, at_s in enumerate(_times(stream, stop_s, rng)):
            runtime_s = max(stream.runtime.draw(rng), 1.0)
            gang = f"{stream.tenant}:{stream.name}-{n}" if stream.gang_size > 1 else None
            for member in range(stream.gang_size):
                task_id = f"{stream.name}-{n}" + (f".{member}" if gang else "")
                request = TaskRequest(
                    task_id=task_id,
                    cpu_milli=stream.cpu_milli,
                    mem_mib=stream.mem_mib,
                    num_gpu=stream.num_gpu,
                    gpu_milli=stream.gpu_milli if stream.num_gpu else 0,
                    gpu_mem_mib=stream.gpu_mem_mib,
                    gang_id=gang,
                    gang_size=stream.gang_size,
                    priority=priority,
                    tenant=stream.tenant,
                    preemptible=stream.preemptible,
                    submitted_at_s=at_s,
                    prediction=TaskPrediction(runtime_p50_s=stream.runtime.expected_s),
                    isolation=stream.isolation,
                    sla_online=stream.sla_online,
                )
                jobs.append(Job(request, stream.name, at_s, runtime_s))
    return tuple(sorted(jobs, key=lambda j: (j.arrival_s, j.request.task_id)))


def _times(stream: Stream, stop_s: float, rng: random.Random) -> list[float]:
    limit = stream.count if stream.count is not None else math.inf
    out: list[float] = []
    if stream.arrival.process == "at":
        return [t for t in stream.arrival.at_s if stream.start_s <= t < stop_s][: stream.count]
    t = stream.start_s
    while len(out) < limit:
        if stream.arrival.process == "poisson":
            t += rng.expovariate(stream.arrival.rate_per_h / 3600)
        elif out:
            t += stream.arrival.every_s
        if t >= stop_s:
            break
        out.append(t)
    return out


# -- the replay ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """What a running task holds on one GPU, as the engine bound it."""

    index: int
    milli: int
    mem_mib: int
    slices: int


@dataclass
class _Running:
    job: Job
    node: str
    gpus: tuple[Held, ...]
    mig_profile: str | None
    mig_start: int | None
    borrowed: bool
    start_s: float
    end_s: float


@dataclass
class _Waiting:
    job: Job
    since_s: float  # arrival, or the requeue after a preemption
    not_before_s: float = 0.0  # the requeue back-off


@dataclass(frozen=True)
class TenantResult:
    tenant: str
    guaranteed_milli: int
    borrow_limit_milli: int
    tasks: int
    started: int
    mean_wait_s: float
    p95_wait_s: float
    mean_held_milli: float  # time-averaged milli-GPU held over the horizon (as the quota counts it)
    share_of_guarantee: float  # mean held / guaranteed (0 when nothing is guaranteed)
    borrowing_s: float  # time it held more than its guarantee (as asked, as the quota counts)
    short_s: float  # time it held (as asked) less than min(guarantee, running + waiting asked)
    preemptions: int  # times one of its tasks was preempted
    gave_up: int  # tasks that reached the attempt limit
    max_used_pct_of_limit: float  # highest use seen, % of guaranteed + borrowable


@dataclass(frozen=True)
class PriorityResult:
    priority: int
    tasks: int
    started: int
    mean_wait_s: float
    p95_wait_s: float


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    policy: str
    seed: int
    gpus: int
    tasks: int
    horizon_s: float
    cycles: int
    alloc_pct: float  # time-averaged held GPU over the horizon, % of capacity
    mean_wait_s: float  # wait = time pending before each start (requeues included), per started task
    p95_wait_s: float
    not_started: int  # tasks that never started (queue drained as far as it could)
    preemptions: int
    gangs: int
    makespan_s: float
    frag_pct_mean: float  # mean over cycles of the pool's fragmentation after the decision, % of capacity
    cpu_seconds: float
    tenants: tuple[TenantResult, ...]
    priorities: tuple[PriorityResult, ...]
    series_t_s: tuple[float, ...]
    series_tenant_milli: Mapping[str, tuple[float, ...]]  # time-averaged held milli per bin and tenant
    starts_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # task id → each start time
    nodes_of: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # task id → node of each start
    # Invariants the replay checked at every cycle (it raises on a breach; the counts prove it looked).
    checks: Mapping[str, int] = field(default_factory=dict)


class InvariantError(AssertionError):
    """The decision broke a rule the replay checks every cycle (a quota, a gang); a defect, never input."""


class _Holdings:
    """Observer: what each tenant holds, integrated over the horizon, with the time it borrows (holds more
    than its guarantee) or is short of it (both counted as the quota counts: as asked), and the bins of
    the allocation curve."""

    def __init__(
        self,
        running: Mapping[str, _Running],
        waiting: Mapping[str, _Waiting],
        guaranteed: Mapping[str, int],
        tenants: Sequence[str],
        horizon_s: float,
    ) -> None:
        self.running = running
        self.waiting = waiting
        self.guaranteed = guaranteed
        self.horizon_s = horizon_s
        self.bin_width = horizon_s / SERIES_BINS
        self.bins: dict[str, list[float]] = {t: [0.0] * SERIES_BINS for t in tenants}
        self.tenant_milli_s: dict[str, float] = defaultdict(float)
        self.borrowing_s: dict[str, float] = defaultdict(float)
        self.short_s: dict[str, float] = defaultdict(float)
        self.total_milli_s = 0.0
        self.last_s = 0.0

    def advance(self, to_s: float) -> None:
        lo, hi = self.last_s, min(to_s, self.horizon_s)
        if hi > lo:
            held: dict[str, int] = defaultdict(int)
            asked: dict[str, int] = defaultdict(int)
            for r in self.running.values():
                held[r.job.request.tenant] += sum(h.milli for h in r.gpus)
                asked[r.job.request.tenant] += r.job.request.gpu_request_milli
            wanted = dict(asked)
            for w in self.waiting.values():
                wanted[w.job.request.tenant] = (
                    wanted.get(w.job.request.tenant, 0) + w.job.request.gpu_request_milli
                )
            for tenant, bins in self.bins.items():
                milli = held.get(tenant, 0)
                self.tenant_milli_s[tenant] += milli * (hi - lo)
                self.total_milli_s += milli * (hi - lo)
                if asked[tenant] > self.guaranteed[tenant]:
                    self.borrowing_s[tenant] += hi - lo
                if asked[tenant] < min(self.guaranteed[tenant], wanted.get(tenant, 0)):
                    self.short_s[tenant] += hi - lo
                b, edge_lo = int(lo / self.bin_width), lo
                while edge_lo < hi and b < SERIES_BINS:
                    edge = min(hi, (b + 1) * self.bin_width)
                    bins[b] += milli * (edge - edge_lo)
                    edge_lo = edge
                    b += 1
        self.last_s = max(self.last_s, to_s)


class _ScenarioReplay:
    """The scenario as a configuration of the cycle loop: each cycle reads the pool as the production
    snapshot reader would, calls the production decision, and commits it (victims back to the queue
    with the production back-off and attempt limit, placements start)."""

    def __init__(self, scenario: Scenario, policy: str, departures: Departures) -> None:
        self.scenario = scenario
        self.departures = departures
        self.capacity_nodes = scenario.nodes()
        self.quotas = scenario.quotas()
        self.limit = {q.tenant: q.guaranteed_milli + q.borrow_limit_milli for q in self.quotas}
        queue_keys: dict[tuple[str, str], tuple[int, int]] = {}
        for t in scenario.tenants:
            for q in t.queues:
                queue_keys[(t.name, q.name)] = (len(queue_keys) + 1, q.weight)
        self.stream_queue = {s.name: queue_keys[(s.tenant, s.queue)] for s in scenario.streams}
        self.expected_runtime = {s.name: s.runtime.expected_s for s in scenario.streams}
        # The production cycle's configuration: the policy, preemption on (unless the scenario turns it
        # off), the pool's online reserve; the seed stays the production default (0).
        self.config = Config(
            policy=policy, preemption=scenario.preemption, online_reserve_milli=scenario.online_reserve_milli
        )
        self.waiting: dict[str, _Waiting] = {}
        self.running: dict[str, _Running] = {}
        self.waits: dict[str, list[float]] = defaultdict(list)  # task id → each wait before a start
        self.starts: dict[str, list[float]] = defaultdict(list)
        self.nodes_of: dict[str, list[str]] = defaultdict(list)
        self.preempted_of: dict[str, int] = defaultdict(int)  # tenant → its tasks' preemptions
        self.runs_of: dict[str, int] = defaultdict(int)  # task id → runs ended by a preemption
        self.gave_up: dict[str, int] = defaultdict(int)
        self.max_used: dict[str, int] = defaultdict(int)
        self.checks = {"quota": 0, "gang": 0, "capacity": 0}
        self.frag_samples: list[float] = []
        self.cycles = 0
        self.last_end_s = 0.0

    # -- the loop's configuration ------------------------------------------------------------------------

    def arrive(self, item: Job, at_s: float) -> None:
        self.waiting[item.request.task_id] = _Waiting(item, item.arrival_s)

    def depart(self, task_id: str, at_s: float) -> None:
        del self.running[task_id]
        self.last_end_s = max(self.last_end_s, at_s)

    def has_waiting(self) -> bool:
        return bool(self.waiting)

    def wake_s(self, now_s: float, arrivals_left: bool) -> list[float]:
        """The end of a requeued task's back-off."""
        return [w.not_before_s for w in self.waiting.values() if w.not_before_s > now_s]

    def cycle(self, now_s: float) -> bool:
        if not any(w.not_before_s <= now_s for w in self.waiting.values()):
            return False
        # 1. The production decision on the snapshot (this is `decide`'s body: one step of a fresh
        #    session; the session's engine then tells what each placement holds).
        snap = self.snapshot(now_s)
        decider = Decider(snap, self.config)
        decisions = decider.step(snap.cluster.pending, now_s)
        self.cycles += 1
        self.frag_samples.append(
            cluster_fragmentation(
                decisions.nodes_after, snap.cluster.shape_mix or shape_mix_from_tasks([])
            ).amount_pct
        )
        asked: dict[str, int] = defaultdict(int)
        for r in self.running.values():
            asked[r.job.request.tenant] += r.job.request.gpu_request_milli
        _check(decisions, snap, asked, self.limit, self.max_used, self.checks)
        # 2. Commit: victims stop and go back to the queue; placements start.
        victims = {p.victim_task_id for p in decisions.preemptions}
        # A gang whose member is stopped stops whole (a distributed job dies with any of its ranks).
        gangs_hit = {self.running[v].job.request.gang_id for v in victims} - {None}
        victims |= {t for t, r in self.running.items() if r.job.request.gang_id in gangs_hit}
        for victim in sorted(victims):
            self.requeue(victim, now_s)
        bindings = decider.engine.state.bindings
        for bound in decisions.placements:
            self.start(bound.placement, bindings[bound.task_id], now_s)
        _check_pool(self.running, self.checks)
        return bool(decisions.placements or victims)

    # -- its steps -----------------------------------------------------------------------------------------

    def start(self, p: Placement, b: Binding, now_s: float) -> None:
        w = self.waiting.pop(p.task_id)
        is_mig = p.unit.kind is UnitKind.MIG
        held = zip(p.gpu_indexes, b.held_milli, b.held_gpu_mem_mib, b.held_slices, strict=True)
        self.running[p.task_id] = _Running(
            w.job,
            p.node,
            tuple(Held(i, m, mem, sl) for i, m, mem, sl in held),
            p.unit.mig_profile if is_mig else None,
            p.unit.mig_start_slice if is_mig else None,
            p.borrowed,
            now_s,
            now_s + w.job.runtime_s,
        )
        self.departures.add(p.task_id, now_s + w.job.runtime_s)
        self.waits[p.task_id].append(now_s - w.since_s)
        self.starts[p.task_id].append(now_s)
        self.nodes_of[p.task_id].append(p.node)

    def requeue(self, task_id: str, now_s: float) -> None:
        r = self.running.pop(task_id)
        self.departures.cancel(task_id)
        tenant = r.job.request.tenant
        self.preempted_of[tenant] += 1
        self.runs_of[task_id] += 1  # each preemption ends one run
        runs = self.runs_of[task_id]
        scenario = self.scenario
        if runs >= scenario.max_attempts:
            self.gave_up[tenant] += 1
            return
        delay = min(scenario.requeue_backoff_max_s, scenario.requeue_backoff_s * 2 ** max(runs - 1, 0))
        self.waiting[task_id] = _Waiting(r.job, now_s, now_s + delay)

    def snapshot(self, now_s: float) -> Snapshot:
        """The pool as the production snapshot reader would hand it to `decide` now."""
        used_cpu: dict[str, int] = defaultdict(int)
        used_mem: dict[str, int] = defaultdict(int)
        held: dict[tuple[str, int], list[Held]] = defaultdict(list)
        run_tasks: list[RunningTask] = []
        queues: dict[str, tuple[int, int]] = {}
        ends: dict[str, float | None] = {}
        for task_id, r in sorted(self.running.items()):
            req = r.job.request
            used_cpu[r.node] += req.cpu_milli
            used_mem[r.node] += req.mem_mib
            for h in r.gpus:
                held[(r.node, h.index)].append(h)
            run_tasks.append(_running_task(task_id, r))
            queues[task_id] = self.stream_queue[r.job.stream]
            ends[task_id] = r.start_s + self.expected_runtime[r.job.stream]
        nodes = tuple(_node_now(node, held, used_cpu, used_mem) for node in self.capacity_nodes)
        pending = tuple(w.job.request for _, w in sorted(self.waiting.items()) if w.not_before_s <= now_s)
        runtimes: dict[str, float | None] = {}
        for w in self.waiting.values():
            queues[w.job.request.task_id] = self.stream_queue[w.job.stream]
            runtimes[w.job.request.task_id] = self.expected_runtime[w.job.stream]
        # The production cycle's fallback shape mix: the tasks the snapshot knows (pending and running).
        mix = shape_mix_from_tasks(
            list(pending)
            + [
                TaskRequest(t.task_id, t.cpu_milli, t.mem_mib, len(t.gpu_indexes), t.gpu_milli)
                for t in run_tasks
            ]
        )
        cluster = ClusterSnapshot(nodes, pending, tuple(run_tasks), self.quotas, mix)
        # No carved-unit inventory: a GPU's capacity is what the engine models (whole cards, shares, MIG
        # instances created where the engine puts them), so every placement is its own unit.
        return Snapshot(
            cluster, queues=queues, expected_end_s=ends, expected_runtime_s=runtimes, unit_exact=False
        )


def _running_task(task_id: str, r: _Running) -> RunningTask:
    req = r.job.request
    return RunningTask(
        task_id=task_id,
        node=r.node,
        gpu_indexes=tuple(h.index for h in r.gpus),
        gpu_milli=max((h.milli for h in r.gpus), default=0),
        cpu_milli=req.cpu_milli,
        mem_mib=req.mem_mib,
        gpu_mem_mib=req.gpu_mem_mib,
        priority=req.priority,
        tenant=req.tenant,
        preemptible=req.preemptible,
        started_at_s=r.start_s,
        borrowed=r.borrowed,
        mig_profile=r.mig_profile,
        mig_start_slice=r.mig_start,
        charge_milli=req.num_gpu * req.gpu_milli,
        sla_online=req.sla_online,
    )


def _node_now(
    node: NodeState,
    held: Mapping[tuple[str, int], list[Held]],
    used_cpu: Mapping[str, int],
    used_mem: Mapping[str, int],
) -> NodeState:
    """A capacity node with what the running tasks hold taken off."""
    gpus = []
    for g in node.gpus:
        on = held.get((node.name, g.index), [])
        free = g.free_milli - sum(h.milli for h in on)
        if g.mode is PartitionMode.MIG and not any(h.slices for h in on):
            free = WHOLE_GPU_MILLI  # every slice free: the whole GPU's compute (as production reads it)
        gpus.append(
            replace(
                g,
                free_milli=max(free, 0),
                free_mem_mib=g.total_mem_mib - sum(h.mem_mib for h in on),
                mig_used_slices=_or(h.slices for h in on),
            )
        )
    return replace(
        node,
        cpu_free_milli=node.cpu_total_milli - used_cpu.get(node.name, 0),
        mem_free_mib=node.mem_total_mib - used_mem.get(node.name, 0),
        gpus=tuple(gpus),
    )


def run_scenario(scenario: Scenario, policy: str, seed: int) -> ScenarioResult:
    """Replay `scenario` under `policy` for `seed` (see the module); deterministic for the pair."""
    started_cpu = time.process_time()
    make_policy(policy)  # an unknown name fails before the run
    jobs = arrivals(scenario, seed)
    departures = Departures()
    replay = _ScenarioReplay(scenario, policy, departures)
    guaranteed = {q.tenant: q.guaranteed_milli for q in replay.quotas}
    tenants = [t.name for t in scenario.tenants]
    holdings = _Holdings(replay.running, replay.waiting, guaranteed, tenants, scenario.horizon_s)
    # Cycles every `cycle_s` while anything changes (production runs one every `cycle_s` anyway), else
    # at the tick of the next event (nothing else can change).
    clock = CycleClock(scenario.cycle_s, rerun_after_change=True, tolerance=1e-9)
    run_cycles([(j.arrival_s, j) for j in jobs], replay, departures, clock, (holdings,))
    holdings.advance(scenario.horizon_s)
    return _figures(scenario, policy, seed, jobs, replay, holdings, time.process_time() - started_cpu)


def _figures(
    scenario: Scenario,
    policy: str,
    seed: int,
    jobs: Sequence[Job],
    replay: _ScenarioReplay,
    holdings: _Holdings,
    cpu_seconds: float,
) -> ScenarioResult:
    capacity = WHOLE_GPU_MILLI * sum(len(n.gpus) for n in replay.capacity_nodes)
    horizon_s = scenario.horizon_s
    total_wait = {t: sum(v) for t, v in replay.waits.items()}
    by_tenant: dict[str, list[str]] = defaultdict(list)
    by_priority: dict[int, list[str]] = defaultdict(list)
    for job in jobs:
        by_tenant[job.request.tenant].append(job.request.task_id)
        by_priority[job.request.priority].append(job.request.task_id)
    tenants = []
    for t in scenario.tenants:
        ids = by_tenant.get(t.name, [])
        got = [total_wait[i] for i in ids if i in total_wait]
        mean_held = holdings.tenant_milli_s[t.name] / horizon_s
        limit = replay.limit[t.name]
        tenants.append(
            TenantResult(
                tenant=t.name,
                guaranteed_milli=t.guaranteed_milli,
                borrow_limit_milli=t.borrow_limit_milli,
                tasks=len(ids),
                started=len(got),
                mean_wait_s=mean(got),
                p95_wait_s=percentile(got, 95),
                mean_held_milli=mean_held,
                share_of_guarantee=mean_held / t.guaranteed_milli if t.guaranteed_milli else 0.0,
                borrowing_s=holdings.borrowing_s[t.name],
                short_s=holdings.short_s[t.name],
                preemptions=replay.preempted_of[t.name],
                gave_up=replay.gave_up[t.name],
                max_used_pct_of_limit=100 * replay.max_used[t.name] / limit if limit else 0.0,
            )
        )
    priorities = []
    for prio in sorted(by_priority):
        ids = by_priority[prio]
        got = [total_wait[i] for i in ids if i in total_wait]
        priorities.append(PriorityResult(prio, len(ids), len(got), mean(got), percentile(got, 95)))
    all_waits = list(total_wait.values())
    bin_width = holdings.bin_width
    return ScenarioResult(
        scenario=scenario.name,
        policy=policy,
        seed=seed,
        gpus=capacity // WHOLE_GPU_MILLI,
        tasks=len(jobs),
        horizon_s=horizon_s,
        cycles=replay.cycles,
        alloc_pct=100 * holdings.total_milli_s / (capacity * horizon_s) if capacity else 0.0,
        mean_wait_s=mean(all_waits),
        p95_wait_s=percentile(all_waits, 95),
        not_started=len(jobs) - len(total_wait),
        preemptions=sum(replay.preempted_of.values()),
        gangs=len({j.request.gang_id for j in jobs if j.request.gang_id}),
        makespan_s=replay.last_end_s,
        frag_pct_mean=mean(replay.frag_samples),
        cpu_seconds=cpu_seconds,
        tenants=tuple(tenants),
        priorities=tuple(priorities),
        series_t_s=tuple(b * bin_width for b in range(SERIES_BINS)),
        series_tenant_milli={k: tuple(v / bin_width for v in vals) for k, vals in holdings.bins.items()},
        starts_s={t: tuple(v) for t, v in sorted(replay.starts.items())},
        nodes_of={t: tuple(v) for t, v in sorted(replay.nodes_of.items())},
        checks=dict(replay.checks),
    )


def _or(values: Any) -> int:
    out = 0
    for v in values:
        out |= v
    return out


def _check(
    decisions: Decisions,
    snap: Snapshot,
    running_asked: Mapping[str, int],
    limit: Mapping[str, int],
    max_used: dict[str, int],
    checks: dict[str, int],
) -> None:
    """Quota: no tenant ever holds more than its guarantee + borrow limit, counted as the quota counts
    (`gpu_count × gpu_milli` as asked, running and newly placed). Gangs: a gang's members are placed all
    together or not at all."""
    used: dict[str, int] = defaultdict(int)
    requests = {t.task_id: t for t in snap.cluster.pending}
    for tenant, asked in running_asked.items():
        used[tenant] += asked
    for b in decisions.placements:
        req = requests[b.task_id]
        used[req.tenant] += req.gpu_request_milli
    for tenant, milli in used.items():
        max_used[tenant] = max(max_used[tenant], milli)
        if milli > limit.get(tenant, milli):
            raise InvariantError(
                f"tenant {tenant} holds {milli} milli-GPU after the cycle; its limit is {limit[tenant]}"
            )
        checks["quota"] += 1
    placed = {b.task_id for b in decisions.placements}
    gangs: dict[str, list[str]] = defaultdict(list)
    for task in snap.cluster.pending:
        if task.gang_id is not None:
            gangs[task.gang_id].append(task.task_id)
    for gang, members in gangs.items():
        hits = sum(m in placed for m in members)
        if hits not in (0, len(members)):
            raise InvariantError(f"gang {gang}: {hits} of {len(members)} members placed")
        checks["gang"] += 1


def _check_pool(running: Mapping[str, _Running], checks: dict[str, int]) -> None:
    """No GPU holds more than a whole card; a gang runs whole or not at all."""
    per_gpu: dict[tuple[str, int], int] = defaultdict(int)
    gangs: dict[str, int] = defaultdict(int)
    for r in running.values():
        for h in r.gpus:
            per_gpu[(r.node, h.index)] += h.milli
        if r.job.request.gang_id is not None:
            gangs[r.job.request.gang_id] += 1
    for key, milli in per_gpu.items():
        if milli > WHOLE_GPU_MILLI:
            raise InvariantError(f"GPU {key[1]} on {key[0]} holds {milli} milli")
        checks["capacity"] += 1
    size = {r.job.request.gang_id: r.job.request.gang_size for r in running.values() if r.job.request.gang_id}
    for gang, count in gangs.items():
        if count != size[gang]:
            raise InvariantError(f"gang {gang}: {count} of {size[gang]} members running")
        checks["gang"] += 1
