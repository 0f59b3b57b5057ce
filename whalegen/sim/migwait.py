"""MIG layout replay: what re-carving ahead of the forecast saves the tasks that need a layout.

The goodput and dynamic replays carve MIG instances on demand, instantly, so no task ever waits for a
layout and pre-carving cannot show (docs/notes/goodput-design.md §9). This replay keeps what they leave out:

- **Layouts.** Every GPU is in MIG mode with a carved layout (`initial`); a task binds only to a free
  carved instance, exactly as production: each cycle builds the unit-exact snapshot production's reader
  builds (`whalegen.scheduling.snapshot.gpu_picture`) and calls the production `decide`.
- **Reconfiguration delay.** A GPU re-carved (for a task, or ahead of the forecast) is out of use for
  `apply_s` (the agent destroying and creating instances); a task re-carved for binds in the first cycle
  after that, as a production claim does once the agent reports the layout applied.
- **Cycles** every `cycle_s` (production's `WHALEGEN_CYCLE_INTERVAL_S`, 5 s) while anything can change:
  a cycle runs at the first tick after each arrival, departure, applied layout and 10-minute forecast bin.
- **Tasks**: the one-GPU tasks of an openb pod list (fractional and whole), each needing the MIG profile
  `mig_profile_for` gives its share; a task runs its trace lifetime once started.
- **Forecast** (`oracle`: the window's real arrivals in the next hour; `last-hour`: those of the hour
  before, a persistence forecast; `none`). Pre-carving is `decide`'s step 5b with `PrecarveConfig`.

Pure: no I/O beyond what the caller passes in.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from whalegen.gpus.mig import profile_by_name
from whalegen.placement.repartition import ClaimAction, MigSlot
from whalegen.placement.types import ClusterSnapshot, GpuState, NodeState, PartitionMode, TaskRequest
from whalegen.scheduling import Claim, Config, FreeUnit, Snapshot, decide
from whalegen.scheduling.precarve import PrecarveConfig, ShapeForecast
from whalegen.scheduling.snapshot import GpuFacts, UnitFact, gpu_picture
from whalegen.sim.loop import CycleClock, Departures, run_cycles
from whalegen.sim.stats import mean, percentile

GpuKey = tuple[str, int]
BIN_S = 600.0  # the arrivals model's bin: production caches the forecast per bin
HOUR_S = 3600.0
# Operator starting layouts (mig-parted's named configs for an 80 GB H100).
INITIAL = {
    "all-balanced": (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)),
    "all-7g": (("7g.80gb", 0),),
    "all-1g": tuple(("1g.10gb", s) for s in range(7)),
}


@dataclass(frozen=True)
class MigTask:
    task_id: str
    arrival_s: float
    runtime_s: float
    gpu_milli: int  # per the trace; the profile is the smallest MIG instance with this share


@dataclass
class _Unit:
    unit_id: int
    profile: str
    start: int
    milli: int
    mem_mib: int
    holder: str | None = None


@dataclass
class _Gpu:
    units: list[_Unit]
    ready_s: float = 0.0  # the agent has applied the present layout from then on


@dataclass(frozen=True)
class MigWaitResult:
    label: str
    tasks: int
    started: int
    mean_wait_s: float
    p95_wait_s: float
    mean_wait_frac_s: float  # fractional-GPU tasks only
    p95_wait_frac_s: float
    waited_for_layout: int  # tasks a last-resort re-carve was made for
    recarves_last_resort: int
    recarves_ahead: int
    allocated_pct: float  # held instances' compute share over capacity, arrival window
    used_pct: float  # the tasks' own share over capacity (what a smaller instance would not waste)
    cycles: int
    cpu_s: float

    def to_json(self) -> dict[str, float | int | str]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class _Run:
    model: str
    gpu_mem_mib: int
    gpus: dict[GpuKey, _Gpu]
    ids: int = 0
    claims: dict[str, tuple[GpuKey, MigSlot]] = field(default_factory=dict)

    def carve(self, key: GpuKey, layout: Sequence[tuple[str, int]], ready_s: float) -> None:
        """The GPU's units become `layout` (all free), in use from `ready_s` (the agent's apply time)."""
        units = []
        for name, start in layout:
            profile = profile_by_name(self.model, name)
            self.ids += 1
            units.append(_Unit(self.ids, name, start, profile.gpu_milli, profile.mem_mib))
        self.gpus[key] = _Gpu(units, ready_s)


def _snapshot(
    run: _Run,
    pending: Sequence[TaskRequest],
    requests: Mapping[str, TaskRequest],
    now_s: float,
    forecast: ShapeForecast | None,
) -> Snapshot:
    """The unit-exact snapshot production's reader would build of this pool now."""
    claimed_on: dict[GpuKey, list[str]] = {}
    for task_id, (key, _) in run.claims.items():
        claimed_on.setdefault(key, []).append(task_id)
    nodes: dict[str, list[GpuState]] = {}
    free_units: dict[GpuKey, tuple[FreeUnit, ...]] = {}
    views = {}
    idle = {}
    for key, gpu in sorted(run.gpus.items()):
        picture = gpu_picture(
            GpuFacts(
                node=key[0],
                index=key[1],
                model=run.model,
                mem_mib=run.gpu_mem_mib,
                mode=PartitionMode.MIG,
                units=tuple(
                    UnitFact(u.unit_id, "mig", u.milli, u.mem_mib, u.holder is not None, u.profile, u.start)
                    for u in gpu.units
                ),
                claimed_by=tuple(claimed_on.get(key, ())),
                layout_ok=now_s >= gpu.ready_s,
            )
        )
        nodes.setdefault(key[0], []).append(picture.state)
        if picture.free_units:
            free_units[key] = picture.free_units
        views[key] = picture.view
        if picture.idle_mig is not None:
            idle[key] = picture.idle_mig
    big = 10**9  # CPU and host memory never bind here: the question is the GPU layout
    cluster = ClusterSnapshot(
        tuple(NodeState(name, big, big, big, big, tuple(states)) for name, states in nodes.items()),
        tuple(pending),
    )
    claims = {}
    for task_id, (key, slot) in run.claims.items():
        gpu = run.gpus[key]
        unit = next(u for u in gpu.units if (u.profile, u.start) == (slot.mig_profile, slot.mig_start))
        applied = now_s >= gpu.ready_s
        claims[task_id] = (  # one GPU per task here: one claim each
            Claim(
                task_id,
                key[0],
                key[1],
                unit.unit_id,
                slot,
                unit.milli,
                ClaimAction.BIND if applied else ClaimAction.WAIT,
                "applied" if applied else "the agent is applying the layout",
            ),
        )
    return Snapshot(
        cluster=cluster,
        free_units=free_units,
        gpu_views=views,
        idle_mig=idle,
        claims=claims,
        claimed_requests={t: requests[t] for t in run.claims},
        forecast=forecast,
    )


def forecaster(tasks: Sequence[MigTask], kind: str) -> Callable[[float], ShapeForecast | None]:
    """Expected arrivals by shape over the next hour, as of the start of the 10-minute bin of `now_s`."""
    times = [t.arrival_s for t in tasks]
    milli = [t.gpu_milli for t in tasks]

    def between(lo: float, hi: float) -> ShapeForecast:
        i, j = bisect.bisect_left(times, lo), bisect.bisect_left(times, hi)
        counts = Counter(milli[i:j])
        return ShapeForecast(
            expected=tuple((1, m, float(n)) for m, n in sorted(counts.items())),
            horizon_s=HOUR_S,
            confidence=1.0,
            source=f"{kind} forecast",
        )

    def forecast(now_s: float) -> ShapeForecast | None:
        edge = math.floor(now_s / BIN_S) * BIN_S
        if kind == "oracle":
            return between(edge, edge + HOUR_S)
        if kind == "last-hour":
            return between(edge - HOUR_S, edge)
        return None

    return forecast


class _Held:
    """Observer: held instance milli and the tasks' own milli, integrated over the arrival window."""

    def __init__(self, t0: float, end_window: float) -> None:
        self.end_window = end_window
        self.last_t = t0
        self.held_milli = self.used_milli = 0
        self.held_ms = self.used_ms = 0.0

    def advance(self, to_s: float) -> None:
        hi = min(to_s, self.end_window)
        if hi > self.last_t:
            self.held_ms += self.held_milli * (hi - self.last_t)
            self.used_ms += self.used_milli * (hi - self.last_t)
        self.last_t = max(self.last_t, hi)


class _MigWaitReplay:
    """The MIG-wait replay as a configuration of the cycle loop: each cycle builds the unit-exact
    snapshot and calls the production `decide`; placements bind, layouts and pre-carves re-carve."""

    def __init__(
        self,
        run: _Run,
        tasks: Sequence[MigTask],
        config: Config,
        apply_s: float,
        forecast: Callable[[float], ShapeForecast | None] | None,
        departures: Departures,
        held: _Held,
    ) -> None:
        self.run = run
        self.config = config
        self.apply_s = apply_s
        self.forecast = forecast
        self.departures = departures
        self.held = held
        self.requests = {
            t.task_id: TaskRequest(t.task_id, 1000, 1024, 1, t.gpu_milli, gpu_mem_mib=0) for t in tasks
        }
        self.by_id = {t.task_id: t for t in tasks}
        self.started: dict[str, float] = {}
        self.pending: list[str] = []
        self.cycles = self.last_resort = self.ahead = self.waited = 0

    def arrive(self, item: MigTask, at_s: float) -> None:
        self.pending.append(item.task_id)

    def depart(self, task_id: str, at_s: float) -> None:
        unit = next(u for gpu in self.run.gpus.values() for u in gpu.units if u.holder == task_id)
        unit.holder = None
        self.held.held_milli -= unit.milli
        self.held.used_milli -= self.by_id[task_id].gpu_milli

    def has_waiting(self) -> bool:
        return bool(self.pending or self.run.claims)

    def wake_s(self, now_s: float, arrivals_left: bool) -> list[float]:
        """Layouts the agent finishes applying, and (pre-carving) the next forecast bin."""
        times = [g.ready_s for g in self.run.gpus.values() if g.ready_s > now_s]
        if self.config.precarve is not None and arrivals_left:
            times.append((math.floor(now_s / BIN_S) + 1) * BIN_S)
        return times

    def cycle(self, now_s: float) -> bool:
        run = self.run
        self.cycles += 1
        forecast = None
        if self.forecast is not None and self.config.precarve is not None:
            forecast = self.forecast(now_s)
        snap = _snapshot(run, [self.requests[t] for t in self.pending], self.requests, now_s, forecast)
        decisions = decide(snap, self.config, now_s, estimates=False)
        for bound in decisions.placements:
            task_id = bound.task_id
            key = (bound.placement.node, bound.placement.gpu_indexes[0])
            unit = next(u for u in run.gpus[key].units if u.unit_id == bound.unit_ids[0])
            assert unit.holder is None
            unit.holder = task_id
            self.held.held_milli += unit.milli
            self.held.used_milli += self.by_id[task_id].gpu_milli
            self.started[task_id] = now_s
            self.departures.add(task_id, now_s + self.by_id[task_id].runtime_s)
            run.claims.pop(task_id, None)
            if task_id in self.pending:
                self.pending.remove(task_id)
        ready_s = now_s + self.apply_s
        for plan in decisions.layouts:
            run.carve(plan.gpu, [(s.mig_profile, s.mig_start) for s in plan.plan.layout], ready_s)
            self.last_resort += 1
            for task_id, slot in plan.plan.for_tasks:
                run.claims[task_id] = (plan.gpu, slot)
                if task_id in self.pending:
                    self.pending.remove(task_id)
                self.waited += 1
        for pre in decisions.precarves:
            run.carve(pre.gpu, [(s.mig_profile, s.mig_start) for s in pre.plan.layout], ready_s)
            self.ahead += 1
        return bool(decisions.placements or decisions.layouts or decisions.precarves)


def run_migwait(
    tasks: Sequence[MigTask],
    *,
    gpus: int,
    model: str = "H100-80GB",
    gpu_mem_mib: int = 81_559,
    gpus_per_node: int = 8,
    initial: str = "all-balanced",
    apply_s: float = 30.0,
    cycle_s: float = 5.0,
    precarve: PrecarveConfig | None = None,
    forecast: Callable[[float], ShapeForecast | None] | None = None,
    policy: str = "whalegen",
    label: str = "",
) -> MigWaitResult:
    """Replay `tasks` (sorted by arrival) on `gpus` MIG GPUs through the production `decide`."""
    cpu0 = time.process_time()
    run = _Run(model, gpu_mem_mib, {})
    for g in range(gpus):
        run.carve((f"n{g // gpus_per_node:02d}", g % gpus_per_node), INITIAL[initial], 0.0)
    arrivals = sorted(tasks, key=lambda t: (t.arrival_s, t.task_id))
    t0 = arrivals[0].arrival_s if arrivals else 0.0
    end_window = arrivals[-1].arrival_s if arrivals else 0.0
    held = _Held(t0, end_window)
    departures = Departures()
    config = Config(policy=policy, preemption=False, precarve=precarve)
    replay = _MigWaitReplay(run, tasks, config, apply_s, forecast, departures, held)
    clock = CycleClock(cycle_s, start_s=math.ceil(t0 / cycle_s) * cycle_s)
    run_cycles([(t.arrival_s, t) for t in arrivals], replay, departures, clock, (held,))
    held.advance(end_window)
    started = replay.started
    waits = [started[t.task_id] - t.arrival_s for t in tasks if t.task_id in started]
    frac = [started[t.task_id] - t.arrival_s for t in tasks if t.task_id in started and t.gpu_milli < 1000]
    capacity = gpus * 1000 * max(end_window - t0, 1.0)
    return MigWaitResult(
        label=label,
        tasks=len(tasks),
        started=len(started),
        mean_wait_s=mean(waits),
        p95_wait_s=percentile(waits, 95),
        mean_wait_frac_s=mean(frac),
        p95_wait_frac_s=percentile(frac, 95),
        waited_for_layout=replay.waited,
        recarves_last_resort=replay.last_resort,
        recarves_ahead=replay.ahead,
        allocated_pct=100 * held.held_ms / capacity,
        used_pct=100 * held.used_ms / capacity,
        cycles=replay.cycles,
        cpu_s=time.process_time() - cpu0,
    )


def window_tasks(
    rows: Sequence[tuple[str, float, float, int, int]], split_frac: float, days: float | None
) -> list[MigTask]:
    """One-GPU tasks (name, creation, lifetime, GPUs, milli) submitted from the `split_frac` quantile of
    creation times on, `days` long (None: to the end), the clock starting at the first."""
    ones = sorted((r for r in rows if r[3] == 1), key=lambda r: (r[1], r[0]))
    if not ones:
        return []
    split = ones[min(int(len(ones) * split_frac), len(ones) - 1)][1]
    out = [
        MigTask(name, created - split, max(life, 1.0), milli)
        for name, created, life, _, milli in ones
        if created >= split and (days is None or created < split + days * 86_400)
    ]
    return out


__all__ = ["INITIAL", "MigTask", "MigWaitResult", "forecaster", "run_migwait", "window_tasks"]
