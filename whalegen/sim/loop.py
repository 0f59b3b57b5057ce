"""One replay loop: arrivals, departures and cycle ticks feed the production decision. Pure.

A replay is this loop with a configuration: what arriving, departing and one cycle mean for it (every
decision through `whalegen.scheduling`), and one of two clocks:

- `run_events`: every arrival and every departure is its own decision point, in time order, departures
  first at equal times (the static and dynamic replays: no cycle period, a task is tried the moment it
  arrives or something leaves).
- `run_cycles`: cycles run at whole multiples of `cycle_s`. At each, what ended and what arrived since the
  last is applied, then one cycle. A cycle that changed something may be followed by the very next tick
  (`CycleClock.rerun_after_change`); otherwise the clock jumps to the tick of the next event, since a
  cycle with nothing new decides nothing new (the scenario and MIG-wait replays).
- `run_steps`: fixed steps of `step_s`. At each, what arrived and what left by then is applied; a
  decision runs if anything arrived, left or ended since the last; then the running work moves on over
  the step (the goodput replay: its jobs end inside a step at rates that change with their neighbours,
  not at times known when they start, so their ends cannot be departures queued in advance).

Metrics are observers. With the event and cycle clocks each is told time advances (`advance(to_s)`)
before the state changes at that time, and integrates what it integrates up to then. With the step clock
the state changes only between steps, so each is told at a step's start that the state it sees holds over
the step (`step(now_s, step_s)`). The replays' end-of-run figures read them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Observer(Protocol):
    def advance(self, to_s: float) -> None:
        """Time moves on to `to_s`; nothing has changed since the last call."""


class EventReplay(Protocol[T_contra]):
    def arrive(self, item: T_contra, at_s: float) -> None:
        """`item` arrives (and is tried, or queued)."""

    def depart(self, task_id: str, at_s: float) -> None:
        """A running task ends (its resources are released; queued work may be tried)."""


class CycleReplay(Protocol[T_contra]):
    def arrive(self, item: T_contra, at_s: float) -> None:
        """`item` joins the queue; the next cycle sees it."""

    def depart(self, task_id: str, at_s: float) -> None:
        """A running task ended at `at_s` (applied at the first cycle at or after it)."""

    def cycle(self, now_s: float) -> bool:
        """One scheduling cycle now; whether it changed anything (a start, a stop, a new layout)."""

    def has_waiting(self) -> bool:
        """Whether anything is still queued or held for a later cycle."""

    def wake_s(self, now_s: float, arrivals_left: bool) -> Iterable[float]:
        """Times besides arrivals and departures at which a cycle could decide something new."""


class Departures:
    """The running tasks' end times, earliest first (ties by task id); a stopped task's end is cancelled."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._end: dict[str, float] = {}

    def add(self, task_id: str, end_s: float) -> None:
        self._end[task_id] = end_s
        heapq.heappush(self._heap, (end_s, task_id))

    def cancel(self, task_id: str) -> None:
        """The task stopped before its end (preempted): its departure never happens."""
        self._end.pop(task_id, None)

    def __len__(self) -> int:
        return len(self._end)

    def ends_s(self) -> Iterator[float]:
        return iter(self._end.values())

    def next_s(self) -> float:
        self._drop_cancelled()
        return self._heap[0][0] if self._heap else math.inf

    def pop_until(self, to_s: float) -> Iterator[tuple[float, str]]:
        """Every departure at or before `to_s`, in order; a departure the caller's handling adds at or
        before `to_s` comes out too."""
        while self._end and self.next_s() <= to_s:
            end_s, task_id = heapq.heappop(self._heap)
            del self._end[task_id]
            yield end_s, task_id

    def _drop_cancelled(self) -> None:
        while self._heap and self._end.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)


def _advance(observers: Sequence[Observer], to_s: float) -> None:
    for observer in observers:
        observer.advance(to_s)


def run_events(
    arrivals: Sequence[tuple[float, T]],
    replay: EventReplay[T],
    departures: Departures,
    observers: Sequence[Observer] = (),
) -> None:
    """Arrivals (in the order given, which must be by time) and departures, one event at a time; the
    departures due at or before an arrival come first; then the rest drain."""
    for at_s, item in arrivals:
        for end_s, task_id in departures.pop_until(at_s):
            _advance(observers, end_s)
            replay.depart(task_id, end_s)
        _advance(observers, at_s)
        replay.arrive(item, at_s)
    for end_s, task_id in departures.pop_until(math.inf):
        _advance(observers, end_s)
        replay.depart(task_id, end_s)


@dataclass(frozen=True)
class CycleClock:
    cycle_s: float
    start_s: float = 0.0
    rerun_after_change: bool = False
    # Tick rounding: a time within this many cycles above a tick counts as that tick (float noise).
    tolerance: float = 0.0

    def tick(self, t_s: float) -> float:
        """The first cycle time at or after `t_s`."""
        return math.ceil(t_s / self.cycle_s - self.tolerance) * self.cycle_s


def run_cycles(
    arrivals: Sequence[tuple[float, T]],
    replay: CycleReplay[T],
    departures: Departures,
    clock: CycleClock,
    observers: Sequence[Observer] = (),
) -> float:
    """Cycles until nothing is left that a cycle could start; returns the time of the last one."""
    now_s = clock.start_s
    nxt = 0
    while nxt < len(arrivals) or replay.has_waiting() or departures:
        # 1. What ended and what arrived since the last cycle.
        for end_s, task_id in departures.pop_until(now_s):
            _advance(observers, end_s)
            replay.depart(task_id, end_s)
        _advance(observers, now_s)
        while nxt < len(arrivals) and arrivals[nxt][0] <= now_s:
            replay.arrive(arrivals[nxt][1], now_s)
            nxt += 1
        # 2. One cycle.
        changed = replay.cycle(now_s)
        # 3. The next tick at which anything can change.
        if changed and clock.rerun_after_change:
            now_s = clock.tick(now_s + clock.cycle_s)
            continue
        events = [arrivals[nxt][0]] if nxt < len(arrivals) else []
        events += departures.ends_s()
        events += replay.wake_s(now_s, nxt < len(arrivals))
        if not events:
            break  # what is left waiting can never start
        now_s = max(now_s + clock.cycle_s, clock.tick(min(events)))
    return now_s


class StepObserver(Protocol):
    def step(self, now_s: float, step_s: float) -> None:
        """The state seen now holds over [now_s, now_s + step_s); what ends in it is applied after it."""


class StepReplay(Protocol[T_contra]):
    def arrive(self, item: T_contra, at_s: float) -> None:
        """`item` joins the queue; the next decision sees it."""

    def depart(self, task_id: str, at_s: float) -> None:
        """A task leaves at a time known in advance (applied at the first step at or after it)."""

    def decide(self, now_s: float) -> None:
        """One decision over what waits (called when something arrived, left or ended since the last)."""

    def settle(self, now_s: float) -> None:
        """The running work's rates over the step that starts now."""

    def progress(self, now_s: float, step_s: float) -> bool:
        """The running work moves on over the step; whether any of it ended."""

    def has_work(self) -> bool:
        """Whether anything is still queued or running."""


@dataclass(frozen=True)
class StepClock:
    step_s: float
    end_s: float  # no step starts at or after this (the replay's drain limit)
    start_s: float = 0.0


def run_steps(
    arrivals: Sequence[tuple[float, T]],
    replay: StepReplay[T],
    departures: Departures,
    clock: StepClock,
    observers: Sequence[StepObserver] = (),
) -> float:
    """Steps until the clock's end or until nothing is left to arrive, wait or run; returns the time after
    the last step."""
    now_s = clock.start_s
    nxt = 0
    changed = True
    while now_s < clock.end_s and (nxt < len(arrivals) or replay.has_work()):
        # 1. What arrived and what left by now. Arrivals first: a task that arrives and leaves within one
        # step is dropped from the queue, not queued after it left.
        while nxt < len(arrivals) and arrivals[nxt][0] <= now_s:
            replay.arrive(arrivals[nxt][1], now_s)
            nxt += 1
            changed = True
        for end_s, task_id in departures.pop_until(now_s):
            replay.depart(task_id, end_s)
            changed = True
        # 2. One decision, if anything changed since the last.
        if changed:
            replay.decide(now_s)
        # 3. The step: the rates now, the observers, then the work done in it.
        replay.settle(now_s)
        for observer in observers:
            observer.step(now_s, clock.step_s)
        changed = replay.progress(now_s, clock.step_s)
        now_s += clock.step_s
    return now_s
