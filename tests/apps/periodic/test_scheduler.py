"""`LeaderScheduler`, Celery beat's scheduler behind the lease, on real PostgreSQL and Celery's real send
path (an in-memory broker): two schedulers tick side by side, only the leader sends, and the standby that
takes over continues the schedule where the leader left it instead of sending everything again."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from apps.periodic.leader import lease_from_settings
from apps.periodic.models import PeriodicRun
from apps.periodic.scheduler import LeaderScheduler

pytestmark = pytest.mark.django_db(transaction=True)
INTERVAL_S = 0.5
LEASE_S = 2.0  # a standby tries every 0.5 s
# Two sends of one entry at once would be ~0 s apart; publish times jitter (the first one connects to the
# broker), so "not doubled" is read as "at least 40 % of an interval apart".
SPACING_S = 0.4 * INTERVAL_S


@pytest.fixture
def app() -> Celery:
    made = Celery("periodic-test", broker="memory://", set_as_current=False)
    made.conf.beat_schedule = {
        "fast": {"task": "periodic-test.fast", "schedule": INTERVAL_S, "options": {"expires": INTERVAL_S}},
        "slow": {"task": "periodic-test.slow", "schedule": 3600.0},
    }
    return made


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    """Every message Celery publishes, as it publishes it: task name, time, expiry."""
    found: list[dict[str, Any]] = []

    def record(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
        found.append({"task": sender, "at": time.monotonic(), "expires": (headers or {}).get("expires")})

    before_task_publish.connect(record, weak=False)
    yield found
    before_task_publish.disconnect(record)


def _run(schedulers: list[LeaderScheduler], seconds: float) -> None:
    """Tick each scheduler in turn, each at its own pace, as separate beat processes would."""
    wake = [0.0] * len(schedulers)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for index, scheduler in enumerate(schedulers):
            if time.monotonic() >= wake[index]:
                wake[index] = time.monotonic() + scheduler.tick()
        time.sleep(0.01)


def test_only_the_leader_sends_and_the_standby_continues_its_schedule(
    app: Celery, sent: list[dict[str, Any]]
) -> None:
    first = LeaderScheduler(app=app, lease=lease_from_settings("beat-a", LEASE_S))
    second = LeaderScheduler(app=app, lease=lease_from_settings("beat-b", LEASE_S))
    try:
        # 1. Both tick; one leads. Sends every interval, never two in one interval.
        _run([first, second], 3.0)
        leader, standby = (first, second) if first.lease.leading else (second, first)
        assert not standby.lease.leading
        fast = [s["at"] for s in sent if s["task"] == "periodic-test.fast"]
        assert 3 <= len(fast) <= 3.0 / INTERVAL_S + 1, fast
        assert all(b - a >= SPACING_S for a, b in itertools.pairwise(fast)), fast
        assert all(s["expires"] for s in sent), sent  # the entry's expiry travels with the message
        assert PeriodicRun.objects.get(name="fast").sent_by == leader.lease.holder
        assert PeriodicRun.objects.get(name="fast").version == len(fast)
        assert [s for s in sent if s["task"] == "periodic-test.slow"] == []  # not due for an hour

        # 2. The leader stops (beat's shutdown closes its scheduler); the standby takes over and goes on
        # one interval after the last send: no burst, no gap.
        last = fast[-1]
        leader.close()
        _run([standby], 2.0)
        assert standby.lease.leading
        after = [s["at"] for s in sent if s["task"] == "periodic-test.fast" and s["at"] > last]
        assert after and after[0] - last >= SPACING_S, (last, after)
        assert after[0] - last <= 5.0, (last, after)  # resumed: not waiting for anything else
        assert all(b - a >= SPACING_S for a, b in itertools.pairwise(after)), after
        assert PeriodicRun.objects.get(name="fast").sent_by == standby.lease.holder
        assert [s for s in sent if s["task"] == "periodic-test.slow"] == []
    finally:
        first.close()
        second.close()


def test_a_scheduler_that_lost_its_lease_sends_nothing(app: Celery, sent: list[dict[str, Any]]) -> None:
    lonely = LeaderScheduler(app=app, lease=lease_from_settings("beat-a", LEASE_S))
    rival = lease_from_settings("beat-b", LEASE_S)
    try:
        assert rival.hold() is True  # another beat leads
        _run([lonely], 2.0)
        assert sent == [] and not lonely.lease.leading
        rival.release()
        _run([lonely], 2.0)
        assert lonely.lease.leading and sent, sent
    finally:
        lonely.close()
        rival.release()
