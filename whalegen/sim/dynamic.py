"""Dynamic trace replay: tasks arrive at their creation time, run for their recorded lifetime and leave.

The static replay (`replay.py`) follows the FGD paper: nothing departs. Here time moves
(docs/dynamic-replay.md):

* A task arrives at `creation_s`; its run time is `lifetime_s` (openb: deletion − creation, which also
  holds the time the task spent pending in the real cluster). It departs `lifetime_s` after it *starts*.
* A task that fits nowhere waits in a FIFO queue (one that would not fit even the empty cluster is
  rejected on arrival and counted as never started). After every departure, and on every arrival, the first
  `queue_window` queued tasks are tried in order (a later one may start before an earlier one that still
  does not fit: backfill inside the window, no reservations). The window bounds the work per event.
* Every try goes through the production decision (`whalegen.scheduling.Decider.step`; `Engine.choose`
  only tests whether a task could fit before it is offered). One code path.
* Metrics over the fixed trace horizon (first arrival → last trace deletion, the same for every policy):
  time-averaged GPU allocation, queueing delay of started tasks, tasks not started by the horizon's end;
  the simulation then drains the queue to report the makespan.

`whalegen+forecast` (`ForecastAligned`) keeps the wrapped policy's scores and changes only *which* of the
equally good places a task takes: the one whose other tasks are predicted to end nearest this task's
predicted end, so nodes and GPUs free up together. With no prediction it decides exactly as the wrapped
policy.

`POLICY+reserve` turns on the decision's reservations for large and gang tasks (`Config.reserve`,
`whalegen.scheduling.reserve`): one decision per event over the queue window, the predicted ends of what
runs in the snapshot it reads (docs/dynamic-replay.md §6). Every run also records the start each queued
task was shown on arrival and, for reserved tasks, the predicted start they were given.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from whalegen.placement.engine import Engine, EngineConfig
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.policies import NEG_INF, Policy, ScoreCache
from whalegen.placement.state import Request
from whalegen.placement.types import WHOLE_GPU_MILLI, ClusterSnapshot, NodeState, ShapeMix, TaskRequest
from whalegen.scheduling import Config, Decider, Snapshot
from whalegen.scheduling.estimate import queue_starts
from whalegen.scheduling.reserve import ReserveConfig, is_large, plan, pool_view
from whalegen.sim.loop import Departures, run_events
from whalegen.sim.replay import shuffled_nodes
from whalegen.sim.stats import mean, median, percentile
from whalegen.sim.trace import load_tasks

FORECAST_SUFFIX = "+forecast"
RESERVE_SUFFIX = "+reserve"  # reservations for large and gang tasks (whalegen.scheduling.reserve)
REMAINING_FLOOR_S = 60.0  # remaining times are compared as ratios; a floor keeps "ends now" finite
SERIES_BINS = 400  # points of the allocation-over-time curve kept per run


@dataclass(frozen=True)
class TimedTask:
    """A trace task with its times (seconds since trace start)."""

    request: TaskRequest
    creation_s: float
    lifetime_s: float  # run time once started; openb: deletion − creation


@dataclass(frozen=True)
class DynamicResult:
    policy: str
    forecast: str  # none | oracle | model
    seed: int
    nodes: int
    gpus: int
    tasks: int
    horizon_s: float
    alloc_pct: float  # time-averaged allocated GPU milli / capacity over the horizon
    offered_pct: float  # the same for the trace's own run intervals (what an unbounded cluster would hold)
    mean_delay_s: float  # queueing delay (start − arrival) of the tasks started within the horizon
    p95_delay_s: float
    not_started: int  # tasks not started by the end of the horizon
    never_started: int  # tasks that never started, even after the queue drained (fit on no node)
    not_started_gpu_h: float  # GPU-hours the tasks not started by the end asked for (request × lifetime)
    makespan_s: float  # first arrival → last departure, queue drained
    cpu_seconds: float
    series_t_s: tuple[float, ...]  # bin starts, seconds since the first arrival
    series_alloc_pct: tuple[float, ...]  # time-averaged allocation in each bin
    start_s: Mapping[str, float]  # task id → start time (tasks that started), for per-task analysis
    large_p95_delay_s: float = 0.0  # P95 wait of large tasks (ReserveConfig.min_gpus GPUs or more)
    small_mean_delay_s: float = 0.0  # mean wait of the others
    large_started: int = 0  # large tasks started within the horizon (the P95's sample)
    # Start estimates a queued task was shown on arrival (the production estimator's walk of the queue
    # ahead, `whalegen.scheduling.estimate.queue_starts`), against its real start; over the tasks that
    # queued and started.
    queued: int = 0
    estimated: int = 0  # of those, how many got an estimate (none without a forecast)
    estimate_mae_s: float = 0.0
    estimate_median_abs_s: float = 0.0
    # The same tasks' estimates without the queue ahead, in the same run: node-level earliest start from
    # the predicted ends of what runs (`reserve.plan` for the task alone, the replay's former estimate),
    # and the capacity view alone (the production estimator before it walked the queue).
    estimate_alone_mae_s: float = 0.0
    estimate_capacity_alone_mae_s: float = 0.0
    # The reserved start a large task was given when it first became the reserved one (+reserve only).
    reserved: int = 0
    reserved_with_start: int = 0
    reserve_mae_s: float = 0.0


class ForecastAligned(Policy):
    """Wraps a policy; among its best choices, prefers the place whose tasks end nearest this one's end.

    The engine's `Request` carries no task identity or prediction, so the harness announces the task
    about to be placed (`expect`) and every start and departure (`started`, `departed`).
    """

    def __init__(self, inner: Policy, slack: float = 0.0) -> None:
        self.inner = inner
        # Score points below the best that still count as "equally good" (0: exact ties only). The
        # engine's scores are integers 0…100 (FGD's sigmoid), so 1 admits the next score down.
        self.slack = slack
        self.name = f"{inner.name}{FORECAST_SUFFIX}"
        self.whole_gpus_only = inner.whole_gpus_only
        self.node_pure = inner.node_pure
        self.end_s: float | None = None
        self.now_s = 0.0
        self.node_ends: dict[int, dict[str, float]] = {}
        self.gpu_ends: dict[tuple[int, int], dict[str, float]] = {}
        self.where: dict[str, tuple[int, tuple[int, ...]]] = {}

    def adopt(self, engine: Engine) -> None:
        """Take the place of the engine's (already attached) policy."""
        self.state = self.inner.state
        self.mix = self.inner.mix
        self.rng = self.inner.rng
        engine.policy = self

    # -- what the harness tells it -------------------------------------------------------------------

    def expect(self, end_s: float | None, now_s: float) -> None:
        self.end_s = end_s
        self.now_s = now_s

    def started(self, task_id: str, node: int, devices: tuple[int, ...], end_s: float | None) -> None:
        if end_s is None:
            return
        self.where[task_id] = (node, devices)
        self.node_ends.setdefault(node, {})[task_id] = end_s
        for d in devices:
            self.gpu_ends.setdefault((node, d), {})[task_id] = end_s

    def departed(self, task_id: str) -> None:
        place = self.where.pop(task_id, None)
        if place is None:
            return
        node, devices = place
        self.node_ends[node].pop(task_id, None)
        for d in devices:
            self.gpu_ends[(node, d)].pop(task_id, None)

    # -- policy API ----------------------------------------------------------------------------------

    def score(self, n: int, req: Request, devices: list[int]) -> tuple[float, tuple[int, ...]]:
        return self.inner.score(n, req, devices)

    def device_threshold(self, req: Request) -> int:
        return self.inner.device_threshold(req)

    def _cost(self, ends: Mapping[str, float] | None) -> float:
        """|log(remaining of the place / remaining of the task)|; an idle place (nothing predicted) last."""
        if not ends or self.end_s is None:
            return math.inf
        mine = max(self.end_s - self.now_s, 0.0) + REMAINING_FLOOR_S
        theirs = max(max(ends.values()) - self.now_s, 0.0) + REMAINING_FLOOR_S
        return abs(math.log(theirs / mine))

    def select(self, req: Request, scores: Callable[[], ScoreCache]) -> tuple[int, tuple[int, ...]] | None:
        # 1. The wrapped policy decides what "best" is.
        pick = self.inner.select(req, scores)
        if pick is None or self.end_s is None:
            return pick
        s = self.state
        n, devices = pick
        # 2. A share going into a partly used GPU (whalegen's sum-of-squares path): every GPU with the
        #    same gap is an equally good bin; take the one whose tasks end nearest.
        if (
            req.is_share
            and getattr(self.inner, "sumsq", False)
            and s.gpu_free[n][devices[0]] < WHOLE_GPU_MILLI
        ):
            gap = s.gpu_free[n][devices[0]]
            rows, cols = np.nonzero(s.np_gpu_free == gap)
            ok = (
                s.allowed_mask(req)[rows]
                & (s.np_cpu_free[rows] >= req.cpu_milli)
                & (s.np_mem_free[rows] >= req.mem_mib)
            )
            best = (self._cost(self.gpu_ends.get((n, devices[0]))), n, devices[0])
            for r, c in zip(rows[ok].tolist(), cols[ok].tolist(), strict=True):
                if s.gpu_mem_free[r][c] < req.gpu_mem_mib:
                    continue
                best = min(best, (self._cost(self.gpu_ends.get((r, c))), r, c))
            return best[1], (best[2],)
        # 3. Otherwise every node within `slack` of the pick's score is equally good; ties go by
        #    alignment, then node order.
        cache = scores()
        top = cache.scores[n]
        if top == NEG_INF:
            return pick
        ties = np.flatnonzero(cache.scores >= top - self.slack)
        if len(ties) == 1:
            return pick
        cost, chosen = min((self._cost(self.node_ends.get(t)), t) for t in ties.tolist())
        if cost == math.inf:
            return pick
        return chosen, cache.devices_of(chosen)


def sample_cluster(nodes: Sequence[NodeState], frac: float, seed: int) -> tuple[NodeState, ...]:
    """`frac` of the nodes drawn without replacement with `seed`, then in the seed's shuffled order."""
    if not 0 < frac <= 1:
        raise ValueError(f"cluster fraction must be in (0, 1], got {frac}")
    count = max(1, round(frac * len(nodes)))
    picked = random.Random(seed).sample(list(nodes), count) if count < len(nodes) else list(nodes)
    return shuffled_nodes(picked, seed)


class _Allocation:
    """Observer: allocated GPU milli × elapsed time, over the horizon only, and in the curve's bins."""

    def __init__(self, first_s: float, horizon_end_s: float, bin_width: float) -> None:
        self.first_s = first_s
        self.horizon_end_s = horizon_end_s
        self.bin_width = bin_width
        self.allocated = 0
        self.integral = 0.0  # milli · s
        self.bins = [0.0] * SERIES_BINS
        self.last_s = first_s

    def advance(self, to_s: float) -> None:
        lo, hi = self.last_s, min(to_s, self.horizon_end_s)
        if hi > lo:
            self.integral += self.allocated * (hi - lo)
            b = int((lo - self.first_s) / self.bin_width)
            while lo < hi and b < SERIES_BINS:
                edge = min(hi, self.first_s + (b + 1) * self.bin_width)
                self.bins[b] += self.allocated * (edge - lo)
                lo = edge
                b += 1
        self.last_s = max(self.last_s, to_s)


class _DynamicReplay:
    """The dynamic replay as a configuration of the event loop: an arrival is tried at once (or queued);
    a departure releases its task and retries the queue window."""

    def __init__(
        self,
        decider: Decider,
        wrapper: ForecastAligned | None,
        empty: Engine,
        tasks: Sequence[TimedTask],
        predictions: Mapping[str, float],
        ends: dict[str, float],
        reserve: ReserveConfig | None,
        queue_window: int,
        departures: Departures,
        allocation: _Allocation,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        self.decider = decider
        self.engine = decider.engine
        self.wrapper = wrapper
        self.empty = empty
        self.predictions = predictions
        self.ends = ends
        self.reserve = reserve
        self.reserve_config = reserve or ReserveConfig()
        self.queue_window = queue_window
        self.departures = departures
        self.allocation = allocation
        self.on_progress = on_progress
        self.total = len(tasks)
        self.arrived = 0
        self.by_id = {t.request.task_id: t for t in tasks}
        # Submission times order a multi-task step (the engine's age order) the way the FIFO queue is.
        self.request_of = {t.request.task_id: t.request for t in tasks}
        if reserve is not None:
            self.request_of = {
                t.request.task_id: replace(t.request, submitted_at_s=t.creation_s) for t in tasks
            }
        self.fits_empty: dict[Request, bool] = {}
        self.queue: deque[TimedTask] = deque()
        self.start_of: dict[str, float] = {}
        self.last_departure_s = tasks[0].creation_s if tasks else 0.0
        self.estimate_of: dict[str, float | None] = {}  # queued on arrival → the start it was shown
        # The same tasks' estimates without the queue ahead: node-level, and capacity view.
        self.alone_of: dict[str, tuple[float | None, float | None]] = {}
        self.reserved_at: dict[str, float | None] = {}  # large task → its predicted start when first reserved

    # -- the loop's configuration ------------------------------------------------------------------------

    def arrive(self, task: TimedTask, at_s: float) -> None:
        req = Request.of(task.request)
        if req not in self.fits_empty:
            # A task that fits no node even of the empty cluster is rejected on arrival (counted as never
            # started) instead of queueing forever: with a narrow window it would block the queue for good.
            self.fits_empty[req] = self.empty.choose(req) is not None
        fits = self.fits_empty[req]
        if fits and self.reserve is not None:
            # The new task may backfill only around the reservation: the pass decides with the head.
            self.queue.append(task)
            if len(self.queue) <= self.queue_window:
                self.retry_reserved(at_s)
        elif fits and (len(self.queue) >= self.queue_window or not self.try_start(task, at_s)):
            # Inside the window only the new task can have changed since the last pass, so only it is
            # tried; behind a full window it waits its turn.
            self.queue.append(task)
        if fits and task.request.task_id not in self.start_of:
            self.estimate(task, at_s)
        self.arrived += 1
        i = self.arrived - 1
        if self.on_progress is not None and (i % 500 == 0 or i == self.total - 1):
            self.on_progress(i + 1, self.total)

    def depart(self, task_id: str, at_s: float) -> None:
        self.decider.release(task_id)
        self.ends.pop(task_id, None)
        if self.wrapper is not None:
            self.wrapper.departed(task_id)
        self.allocation.allocated -= self.by_id[task_id].request.gpu_request_milli
        self.last_departure_s = at_s
        if self.queue and self.reserve is not None:
            self.retry_reserved(at_s)
        elif self.queue:
            self.retry(at_s, self.queue_window)

    # -- its steps -----------------------------------------------------------------------------------------

    def try_start(self, task: TimedTask, now_s: float) -> bool:
        req = task.request
        predicted = self.predictions.get(req.task_id)
        end_s = now_s + predicted if predicted is not None else None
        if self.wrapper is not None:
            self.wrapper.expect(end_s, now_s)
        if self.engine.choose(Request.of(req)) is None:
            return False
        result = self.decider.step((req,), now_s, estimates=False, nodes_after=False)
        if not result.placements:
            return False
        self.book(task, now_s)
        return True

    def book(self, task: TimedTask, now_s: float) -> None:
        """A task the decision placed starts now: allocation, its departure, its predicted end."""
        req = task.request
        predicted = self.predictions.get(req.task_id)
        end_s = now_s + predicted if predicted is not None else None
        binding = self.engine.state.bindings[req.task_id]
        if len(binding.gpu_indexes) != req.num_gpu:
            # Allocation is counted from the request, so a binding short of devices would inflate it.
            raise RuntimeError(f"{req.task_id} bound to {len(binding.gpu_indexes)} of {req.num_gpu} GPUs")
        if self.wrapper is not None:
            self.wrapper.started(req.task_id, binding.node, binding.gpu_indexes, end_s)
        if end_s is not None:
            self.ends[req.task_id] = end_s
        self.allocation.allocated += req.gpu_request_milli
        self.start_of[req.task_id] = now_s
        self.departures.add(req.task_id, now_s + max(task.lifetime_s, 1.0))

    def retry_reserved(self, now_s: float) -> None:
        """+reserve: one decision over the first `queue_window` queued tasks that could fit now, plus
        the first large one that cannot (the decision reserves for it and holds backfill that would
        delay it). A request that does not fit now is not offered again in the pass."""
        offered: list[TimedTask] = []
        failed: set[Request] = set()
        head = False
        for task in itertools.islice(self.queue, self.queue_window):
            req = Request.of(task.request)
            if req not in failed and self.engine.choose(req) is not None:
                offered.append(task)
                continue
            failed.add(req)
            if not head and is_large(task.request, self.reserve_config):
                offered.append(task)
                head = True
        if not offered:
            return
        result = self.decider.step(
            tuple(self.request_of[t.request.task_id] for t in offered),
            now_s,
            estimates=False,
            nodes_after=False,
        )
        if result.reservation is not None:
            self.reserved_at.setdefault(result.reservation.task_ids[0], result.reservation.start_s)
        placed = {b.task_id for b in result.placements}
        if not placed:
            return
        for task in offered:
            if task.request.task_id in placed:
                self.book(task, now_s)
        kept = [t for t in self.queue if t.request.task_id not in placed]
        self.queue.clear()
        self.queue.extend(kept)

    def estimate(self, task: TimedTask, now_s: float) -> None:
        """The start a queued task is shown on arrival: the production estimator's walk of the queue
        (FIFO, the task last) over the predicted ends of what runs; none when nothing running has a
        predicted end. Beside it, the estimates without the queue ahead (node-level and capacity)."""
        ends = self.ends
        if not ends:
            self.estimate_of[task.request.task_id] = None
            return
        state = self.engine.state
        idle: dict[str | None, int] = defaultdict(int)
        for n in range(len(state)):
            if state.schedulable[n]:
                idle[state.models[n]] += sum(state.gpu_free[n])
        frees: dict[str | None, list[tuple[float, int]]] = defaultdict(list)
        held: dict[str | None, int] = defaultdict(int)
        for b in state.bindings.values():
            end_s = ends.get(b.task_id)
            if end_s is None:
                held[state.models[b.node]] += sum(b.held_milli)
            else:
                frees[state.models[b.node]].append((end_s, sum(b.held_milli)))
        task_id = task.request.task_id
        predicted = self.predictions.get
        walked = queue_starts([t.request for t in self.queue], idle, frees, held, predicted, now_s)
        self.estimate_of[task_id] = walked[task_id].start_s
        capacity_alone = queue_starts([task.request], idle, frees, held, predicted, now_s)
        rooms, holders = pool_view(state, task.request, ends.get)
        node_alone = plan((task.request,), rooms, tuple(holders.values()), now_s, self.reserve_config).start_s
        self.alone_of[task_id] = (node_alone, capacity_alone[task_id].start_s)

    def retry(self, now_s: float, window: int) -> None:
        """Try the first `window` queued tasks in order; a request that failed in this pass is skipped
        (placements since only took resources away, so it would fail again)."""
        failed: set[Request] = set()
        kept: list[TimedTask] = []
        tried = 0
        while self.queue and tried < window:
            task = self.queue.popleft()
            tried += 1
            req = Request.of(task.request)
            if req in failed or not self.try_start(task, now_s):
                failed.add(req)
                kept.append(task)
        self.queue.extendleft(reversed(kept))


def run_dynamic(
    nodes: Sequence[NodeState],
    tasks: Sequence[TimedTask],
    policy: str,
    seed: int,
    *,
    mix: ShapeMix | None = None,
    predicted_s: Mapping[str, float] | None = None,
    forecast: str = "none",
    queue_window: int = 32,
    align_slack: float = 0.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> DynamicResult:
    """Replay `tasks` over time on `nodes` (in the order given: it breaks ties).

    `policy` is an engine policy name, optionally with `+forecast`; `predicted_s` maps task ids to the
    predicted run time the forecast variant aligns on (missing ids: no prediction).
    """
    started_cpu = time.process_time()
    # 1. The engine, with the wrapper policy in place of the engine's own when asked for.
    reserved = policy.endswith(RESERVE_SUFFIX)
    base = policy.removesuffix(RESERVE_SUFFIX)
    aligned = base.endswith(FORECAST_SUFFIX)
    base = base.removesuffix(FORECAST_SUFFIX)
    requests = [t.request for t in tasks]
    if mix is None:
        mix = shape_mix_from_tasks(requests, with_memory=base.startswith("whalegen"))
    # Every placement goes through the production decision (`Decider.step`); the trace has no tenants or
    # units, so one tenant without a quota and nothing to map.
    # The decision reads the predicted ends of what runs (`ends`, kept by the replay: start + predicted
    # run time) and the predicted run time of what it places (`predictions`); only +reserve acts on them.
    predictions = predicted_s or {}
    ends: dict[str, float] = {}
    reserve_config = ReserveConfig() if reserved else None
    decider = Decider(
        Snapshot(
            ClusterSnapshot(tuple(nodes), shape_mix=mix),
            expected_end_s=ends,
            expected_runtime_s=predictions,
            unit_exact=False,
        ),
        Config(policy=base, seed=seed, preemption=False, reserve=reserve_config),
    )
    wrapper: ForecastAligned | None = None
    if aligned:
        wrapper = ForecastAligned(decider.engine.policy, align_slack)
        wrapper.adopt(decider.engine)
    empty = Engine(ClusterSnapshot(tuple(nodes), shape_mix=mix), EngineConfig(policy="bestfit"))
    # 2. The clock: arrivals in time order, departures due before each arrival first, then the drain.
    ordered = sorted(tasks, key=lambda t: (t.creation_s, t.request.task_id))
    first_s = ordered[0].creation_s if ordered else 0.0
    horizon_end_s = max((t.creation_s + t.lifetime_s for t in ordered), default=0.0)
    horizon_s = max(horizon_end_s - first_s, 1e-9)
    allocation = _Allocation(first_s, horizon_end_s, horizon_s / SERIES_BINS)
    departures = Departures()
    replay = _DynamicReplay(
        decider,
        wrapper,
        empty,
        ordered,
        predictions,
        ends,
        reserve_config,
        queue_window,
        departures,
        allocation,
        on_progress,
    )
    run_events([(t.creation_s, t) for t in ordered], replay, departures, (allocation,))
    allocation.advance(horizon_end_s)
    # 3. Figures.
    label = forecast if aligned or reserved else "none"
    cpu_seconds = time.process_time() - started_cpu
    return _figures(nodes, ordered, policy, label, seed, replay, allocation, cpu_seconds)


def _figures(
    nodes: Sequence[NodeState],
    ordered: Sequence[TimedTask],
    policy: str,
    forecast: str,
    seed: int,
    replay: _DynamicReplay,
    allocation: _Allocation,
    cpu_seconds: float,
) -> DynamicResult:
    start_of = replay.start_of
    capacity = WHOLE_GPU_MILLI * sum(len(node.gpus) for node in nodes)
    first_s = allocation.first_s
    horizon_end_s = allocation.horizon_end_s
    horizon_s = max(horizon_end_s - first_s, 1e-9)
    bin_width = allocation.bin_width
    delays = [start_of[t.request.task_id] - t.creation_s for t in ordered if t.request.task_id in start_of]
    in_horizon = [
        start_of[t.request.task_id] - t.creation_s
        for t in ordered
        if start_of.get(t.request.task_id, math.inf) <= horizon_end_s
    ]
    late = [t for t in ordered if start_of.get(t.request.task_id, math.inf) > horizon_end_s]
    offered = sum(
        t.request.gpu_request_milli * (min(t.creation_s + t.lifetime_s, horizon_end_s) - t.creation_s)
        for t in ordered
    )
    large_waits: list[float] = []
    small_waits: list[float] = []
    for t in ordered:
        if start_of.get(t.request.task_id, math.inf) <= horizon_end_s:
            wait_s = start_of[t.request.task_id] - t.creation_s
            (large_waits if is_large(t.request, replay.reserve_config) else small_waits).append(wait_s)
    # Tasks shown an estimate that started; the estimators without the queue over the same tasks.
    shown = {i: e for i, e in replay.estimate_of.items() if e is not None and i in start_of}
    shown_err = [abs(e - start_of[i]) for i, e in shown.items()]
    alone_of = replay.alone_of
    alone_err = [[abs(e - start_of[i]) for i in shown if (e := alone_of[i][k]) is not None] for k in (0, 1)]
    promised = [(start_of[i], e) for i, e in replay.reserved_at.items() if e is not None and i in start_of]
    return DynamicResult(
        policy=policy,
        forecast=forecast,
        seed=seed,
        nodes=len(nodes),
        gpus=capacity // WHOLE_GPU_MILLI,
        tasks=len(ordered),
        horizon_s=horizon_s,
        alloc_pct=100 * allocation.integral / (capacity * horizon_s) if capacity else 0.0,
        offered_pct=100 * offered / (capacity * horizon_s) if capacity else 0.0,
        mean_delay_s=mean(in_horizon),
        p95_delay_s=percentile(in_horizon, 95),
        not_started=len(ordered) - len(in_horizon),
        never_started=len(ordered) - len(delays),
        not_started_gpu_h=sum(t.request.gpu_request_milli * t.lifetime_s for t in late)
        / WHOLE_GPU_MILLI
        / 3600,
        makespan_s=replay.last_departure_s - first_s,
        cpu_seconds=cpu_seconds,
        series_t_s=tuple(b * bin_width for b in range(SERIES_BINS)),
        series_alloc_pct=tuple(
            100 * v / (capacity * bin_width) if capacity else 0.0 for v in allocation.bins
        ),
        start_s=start_of,
        large_p95_delay_s=percentile(large_waits, 95),
        small_mean_delay_s=mean(small_waits),
        large_started=len(large_waits),
        queued=len(replay.estimate_of),
        estimated=len(shown),
        estimate_mae_s=mean(shown_err),
        estimate_median_abs_s=median(shown_err),
        estimate_alone_mae_s=mean(alone_err[0]),
        estimate_capacity_alone_mae_s=mean(alone_err[1]),
        reserved=len(replay.reserved_at),
        reserved_with_start=len(promised),
        reserve_mae_s=mean([abs(e - real) for real, e in promised]),
    )


# -- trace windows and forecasts ---------------------------------------------------------------------


def load_timed_tasks(path: Path) -> tuple[TimedTask, ...]:
    """An openb pod list with `creation_time` and `deletion_time` (traces/README.md §1.2)."""
    requests = {t.task_id: t for t in load_tasks(path)}
    out = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if not row.get("creation_time") or not row.get("deletion_time"):
                raise ValueError(f"{path}: task {row['name']} has no creation/deletion time")
            created = float(row["creation_time"])
            out.append(TimedTask(requests[row["name"]], created, float(row["deletion_time"]) - created))
    return tuple(out)


def split_time(tasks: Sequence[TimedTask], split_frac: float) -> float:
    """The creation time below which `split_frac` of the tasks were submitted (0 → the first arrival)."""
    created = sorted(t.creation_s for t in tasks)
    if split_frac <= 0 or not created:
        return created[0] if created else 0.0
    return created[min(int(len(created) * split_frac), len(created) - 1)]


def trace_window(tasks: Sequence[TimedTask], split_s: float) -> tuple[TimedTask, ...]:
    """Tasks submitted at or after `split_s`, plus the ones still alive then (they arrive at `split_s`
    with what is left of their lifetime, so the window does not start on an artificially empty cluster)."""
    out = []
    for t in tasks:
        end_s = t.creation_s + t.lifetime_s
        if t.creation_s >= split_s:
            out.append(t)
        elif end_s > split_s:
            out.append(TimedTask(t.request, split_s, end_s - split_s))
    return tuple(out)


def oracle_predictions(window: Sequence[TimedTask]) -> dict[str, float]:
    return {t.request.task_id: t.lifetime_s for t in window}


def model_predictions(
    pod_path: Path, split_s: float, window: Sequence[TimedTask], quantile: int = 0
) -> dict[str, float]:
    """P50 (`quantile` 0; 1: P90) run time from `whalegen.forecast.durations`, trained on the tasks
    finished before `split_s`.

    Same key and features as docs/forecasting.md §4.2. A task alive at the split is predicted from its
    submission; it arrives in the window with the prediction minus the time it had already lived.
    """
    import pandas as pd

    from whalegen.forecast.durations import DurationConfig, predict_quantiles_s, train_durations

    frame = pd.read_csv(pod_path)
    key = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos")
    features = tuple(c for c in (*key, "gpu_spec") if c in frame.columns)
    cfg = DurationConfig(key_cols=tuple(c for c in key if c in frame.columns), feature_cols=features)
    start = frame["creation_time"].to_numpy(dtype=float)
    end = frame["deletion_time"].to_numpy(dtype=float)
    model, feats = train_durations(frame, start, end, cfg, split_s)
    pred = predict_quantiles_s(model, feats.reset_index(drop=True))[:, quantile]
    by_name = dict(zip(frame["name"].tolist(), zip(pred.tolist(), start.tolist(), strict=True), strict=True))
    out = {}
    for t in window:
        predicted, created = by_name[t.request.task_id]
        out[t.request.task_id] = max(predicted - (t.creation_s - created), 0.0)
    return out
