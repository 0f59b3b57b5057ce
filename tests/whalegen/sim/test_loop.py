"""The one replay loop: event order, cancelled departures, the cycle clock's jumps and the step clock."""

from __future__ import annotations

import math

from whalegen.sim.loop import CycleClock, Departures, StepClock, run_cycles, run_events, run_steps


class _Log:
    def __init__(self, departures: Departures, runtime_s: float) -> None:
        self.departures = departures
        self.runtime_s = runtime_s
        self.seen: list[tuple[str, str, float]] = []
        self.queue: list[str] = []
        self.cycles: list[float] = []

    def advance(self, to_s: float) -> None:
        self.seen.append(("advance", "", to_s))

    def arrive(self, item: str, at_s: float) -> None:
        self.seen.append(("arrive", item, at_s))
        self.queue.append(item)

    def depart(self, task_id: str, at_s: float) -> None:
        self.seen.append(("depart", task_id, at_s))

    def cycle(self, now_s: float) -> bool:
        self.cycles.append(now_s)
        for item in self.queue:
            self.departures.add(item, now_s + self.runtime_s)
        changed = bool(self.queue)
        self.queue.clear()
        return changed

    def has_waiting(self) -> bool:
        return bool(self.queue)

    def wake_s(self, now_s: float, arrivals_left: bool) -> list[float]:
        return []


def test_departures_come_out_in_time_order_and_a_cancelled_one_never() -> None:
    departures = Departures()
    for task_id, end_s in (("b", 5.0), ("a", 5.0), ("c", 1.0), ("d", 3.0)):
        departures.add(task_id, end_s)
    departures.cancel("d")
    assert len(departures) == 3
    assert list(departures.pop_until(math.inf)) == [(1.0, "c"), (5.0, "a"), (5.0, "b")]
    assert len(departures) == 0


def test_events_run_departures_due_before_an_arrival_first() -> None:
    departures = Departures()
    departures.add("early", 2.0)
    log = _Log(departures, 0.0)
    run_events([(2.0, "x"), (7.0, "y")], log, departures, (log,))
    assert log.seen == [
        ("advance", "", 2.0),
        ("depart", "early", 2.0),
        ("advance", "", 2.0),
        ("arrive", "x", 2.0),
        ("advance", "", 7.0),
        ("arrive", "y", 7.0),
    ]


def test_cycles_jump_to_the_tick_of_the_next_event_and_stop_when_nothing_is_left() -> None:
    departures = Departures()
    log = _Log(departures, 12.0)
    last = run_cycles([(1.0, "x"), (31.0, "y")], log, departures, CycleClock(5.0, start_s=0.0))
    # Arrivals are seen at the tick at or after them; departures (start + 12 s) at the tick after theirs.
    assert log.cycles == [0.0, 5.0, 20.0, 35.0, 50.0]
    assert ("depart", "x", 17.0) in log.seen and ("depart", "y", 47.0) in log.seen
    assert last == 50.0


def test_a_cycle_that_changed_something_is_followed_by_the_next_tick_when_asked() -> None:
    departures = Departures()
    log = _Log(departures, 12.0)
    run_cycles([(1.0, "x")], log, departures, CycleClock(5.0, rerun_after_change=True))
    assert log.cycles == [0.0, 5.0, 10.0, 20.0]


class _Stepped:
    """Work of `work` units per item, done at one unit a second by whatever runs; a decision starts all."""

    def __init__(self, work: float) -> None:
        self.work = work
        self.queue: list[str] = []
        self.left: dict[str, float] = {}
        self.seen: list[tuple[str, str, float]] = []

    def arrive(self, item: str, at_s: float) -> None:
        self.seen.append(("arrive", item, at_s))
        self.queue.append(item)

    def depart(self, task_id: str, at_s: float) -> None:
        self.seen.append(("depart", task_id, at_s))
        self.left.pop(task_id, None)
        if task_id in self.queue:
            self.queue.remove(task_id)

    def decide(self, now_s: float) -> None:
        self.seen.append(("decide", "", now_s))
        self.left.update(dict.fromkeys(self.queue, self.work))
        self.queue.clear()

    def settle(self, now_s: float) -> None:
        pass

    def progress(self, now_s: float, step_s: float) -> bool:
        ended = [item for item, left in self.left.items() if left <= step_s]
        for item in self.left:
            self.left[item] -= step_s
        for item in ended:
            self.seen.append(("end", item, now_s + self.left.pop(item) + step_s))
        return bool(ended)

    def has_work(self) -> bool:
        return bool(self.queue or self.left)

    def step(self, now_s: float, step_s: float) -> None:
        self.seen.append(("step", ",".join(sorted(self.left)), now_s))


def test_steps_decide_only_after_a_change_and_work_ends_inside_a_step() -> None:
    stepped = _Stepped(work=25.0)
    last = run_steps(
        [(0.0, "x"), (15.0, "y")], stepped, Departures(), StepClock(10.0, end_s=100.0), (stepped,)
    )
    decided = [at_s for what, _, at_s in stepped.seen if what == "decide"]
    # Decisions at 0 (x arrived), 20 (y arrived at 15, seen at the next step) and 30 (x ended at 25).
    assert decided == [0.0, 20.0, 30.0]
    assert ("end", "x", 25.0) in stepped.seen and ("end", "y", 45.0) in stepped.seen
    # Observers see each step's state before its work; the loop stops once nothing is left.
    assert [at_s for what, _, at_s in stepped.seen if what == "step"] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert last == 50.0


def test_steps_stop_at_the_clock_end_and_apply_arrivals_before_departures() -> None:
    stepped = _Stepped(work=1000.0)
    departures = Departures()
    departures.add("y", 12.0)
    last = run_steps([(0.0, "x"), (11.0, "y")], stepped, departures, StepClock(10.0, end_s=30.0), (stepped,))
    # y arrives and leaves within one step: queued at 20, then dropped before the decision sees it.
    assert stepped.seen == [
        ("arrive", "x", 0.0),
        ("decide", "", 0.0),
        ("step", "x", 0.0),
        ("step", "x", 10.0),
        ("arrive", "y", 20.0),
        ("depart", "y", 12.0),
        ("decide", "", 20.0),
        ("step", "x", 20.0),
    ]
    assert "y" not in stepped.left and stepped.left["x"] == 970.0
    assert last == 30.0
