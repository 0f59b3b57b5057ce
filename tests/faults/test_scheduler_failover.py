"""Issue #42 item 1: periodic work survives the loss of the leading scheduler process.

The fault suite's production-shaped stack (PostgreSQL and Redis of its own, gunicorn, real Celery workers,
three `whalegen agent --backend sim`) with two `celery beat` processes and a worker of its own on the
`cycles` queue, cycles and the other short entries every 2 s. Under load (recording tasks submitted over
the API and run by the agents), the beat that holds the lease is killed with SIGKILL, restarted (as a
supervisor would) and the new leader killed in turn. After each kill:
- the other beat takes over and sends `schedule-pools` within two intervals of the last send before the
  kill (the beats' logs);
- no periodic entry is sent twice: consecutive sends of one entry, from either beat, are at least half an
  interval apart, and the entry's send count (its run record's version) moves by one per send;
- no Celery task of a periodic entry ran twice (each message id once in the workers' logs), and no two
  cycles of the pool held it at once (their locked spans, from the cycle records, never overlap);
- the tasks submitted under load all end, with the fault checker's counts clean.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.faults.conftest import Worker, started_stack
from tests.faults.harness import Stack

pytestmark = pytest.mark.faults

INTERVAL_S = 2.0
LEASE_S = 4.0  # a standby tries every second; a silent leader's session ends after 4 s
SHORT_ENTRIES = {
    "schedule-pools": "apps.scheduling.tasks.cycles_all_pools",
    "fleet-node-health": "apps.fleet.tasks.nodes_check_health",
    "plane-tick": "apps.metrics.tasks.plane_tick",
}
SENT = re.compile(r"Sending due task ([\w-]+) \(")
EXECUTED = re.compile(r"Task ([\w.]+)\[([0-9a-f-]{36})\] (?:succeeded|raised|failed)")


class FailoverStack(Stack):
    """The fault suite's stack, its intervals at 2 s, with a second beat and a `cycles` worker."""

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.env.update(
            WHALEGEN_CYCLE_INTERVAL_S=str(INTERVAL_S),
            WHALEGEN_NODE_HEALTH_INTERVAL_S=str(INTERVAL_S),
            WHALEGEN_PLANE_TICK_INTERVAL_S=str(INTERVAL_S),
            WHALEGEN_BEAT_LEASE_S=str(LEASE_S),
            WHALEGEN_LOG_FORMAT="json",
            WHALEGEN_ACCESS_LOG_LEVEL="INFO",  # the workers' per-task lines: executions are counted from them
            # Sends are counted from the beats' logs: a SIGKILL must not take the last lines with it.
            PYTHONUNBUFFERED="1",
        )
        self.beats: dict[str, subprocess.Popen[bytes]] = {}
        self.cycles_worker: Worker | None = None

    def start(self) -> None:
        super().start()  # its beat is "beat"
        assert self.beat is not None
        self.beats["beat"] = self.beat
        self.start_named_beat("beat-2")
        self.cycles_worker = Worker(self.work / "workers", name="faults-cycles", env=self.env,
                                    extra=("-Q", "cycles", "--concurrency", "2"))  # fmt: skip
        self.cycles_worker.start()
        self.cycles_worker.wait_ready(timeout_s=240)

    def stop(self) -> None:
        for proc in self.beats.values():
            self._end(proc)
        if self.cycles_worker is not None:
            self.cycles_worker.stop()
        super().stop()

    def start_named_beat(self, name: str) -> None:
        self.beats[name] = self._spawn(
            name, ["-m", "celery", "-A", "whalegen.config", "beat", "--loglevel", "INFO"]
        )

    def leader(self) -> str | None:
        """Which beat holds the lease, from PostgreSQL's side: the session holding the lock names its pid."""
        from apps.periodic.leader import LOCK_CLASS, LOCK_OBJECT

        rows = self.sql(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::oid AND l.objid = %s::oid",
            LOCK_CLASS,
            LOCK_OBJECT,
        )
        pids = {int(name.rsplit(":", 1)[1]) for (name,) in rows}
        names = [name for name, proc in self.beats.items() if proc.pid in pids and proc.poll() is None]
        assert len(names) <= 1, names
        return names[0] if names else None

    def all_connected(self) -> bool:
        """Every live beat is up and has its lease session (a standby that is still importing Django is
        no standby yet: killing the leader then would be losing two processes, not one)."""
        rows = self.sql(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'whalegen-beat %%'"
        )
        pids = {int(name.rsplit(":", 1)[1]) for (name,) in rows}
        return all(proc.pid in pids for proc in self.beats.values() if proc.poll() is None)

    def run_record(self, entry: str) -> tuple[int, datetime, str]:
        rows = self.sql(
            "SELECT version, last_run_at, sent_by FROM periodic_periodicrun WHERE name = %s", entry
        )
        return rows[0] if rows else (0, datetime.min, "")

    def sends(self) -> dict[str, list[tuple[datetime, str]]]:
        """Every send of every entry by either beat, from their logs: entry → [(when, beat)] in time order."""
        found: dict[str, list[tuple[datetime, str]]] = {}
        for name in self.beats:
            for line in (self.work / f"{name}.log").read_text(errors="replace").splitlines():
                match = SENT.search(line)
                if match and line.startswith("{"):
                    record = json.loads(line)
                    when = datetime.fromisoformat(record.get("time") or record["ts"])
                    found.setdefault(match.group(1), []).append((when, name))
        return {entry: sorted(times) for entry, times in found.items()}

    def executions(self) -> Counter[tuple[str, str]]:
        """(task name, message id) → how many times a worker ran it to an end, from every worker's log."""
        seen: Counter[tuple[str, str]] = Counter()
        for path in (self.work / "workers").glob("*.log"):
            for match in EXECUTED.finditer(path.read_text(errors="replace")):
                seen[(match.group(1), match.group(2))] += 1
        return seen

    def overlapping_cycles(self) -> list[str]:
        """Cycles of one pool that held it at once. A cycle holds its pool from taking the lock (its
        phases' wall time before `finished_at`) until its transaction commits (after `finished_at`)."""
        rows = self.sql(
            "SELECT id, pool_id, finished_at, (snapshot_ms + solve_ms + commit_ms) / 1000.0 "
            "FROM scheduling_cycle WHERE finished_at IS NOT NULL ORDER BY pool_id, finished_at"
        )
        found, last = [], {}
        for pk, pool_id, finished_at, held_s in rows:
            held_from = finished_at.timestamp() - float(held_s)
            previous = last.get(pool_id)
            if previous is not None and held_from < previous[1] - 0.005:
                found.append(f"pool {pool_id}: cycle {pk} began before cycle {previous[0]} ended")
            last[pool_id] = (pk, finished_at.timestamp())
        return found


@pytest.fixture
def failover_stack() -> Iterator[FailoverStack]:
    with started_stack(FailoverStack, prefix="whalegen-faults-failover-") as made:
        yield made


def _kill_leader(stack: FailoverStack) -> tuple[str, str, datetime]:
    """SIGKILL the leading beat right after it sent `schedule-pools` (the hardest case for "not twice": a
    new leader that forgot the send would send again at once); wait for the other beat to send it.
    Returns (killed, new leader, when the kill happened)."""
    stack.wait(stack.all_connected, 180, "both beats to be up")
    killed = stack.wait(stack.leader, 60, "a beat to hold the lease")
    version = stack.run_record("schedule-pools")[0]
    stack.wait(lambda: stack.run_record("schedule-pools")[0] > version, 30, "a send of schedule-pools")
    stack.beats[killed].send_signal(signal.SIGKILL)
    stack.beats[killed].wait()
    killed_at = datetime.now(UTC)
    version = stack.run_record("schedule-pools")[0]
    stack.wait(
        lambda: stack.run_record("schedule-pools")[0] > version, 30, "the standby to send schedule-pools"
    )
    new_leader = stack.leader()
    assert new_leader is not None and new_leader != killed
    return killed, new_leader, killed_at


def _takeover_gaps_s(sends: list[tuple[datetime, str]], kills: list[tuple[str, datetime]]) -> list[float]:
    """Per kill: seconds from the last send before it to the first send by another beat after it."""
    gaps = []
    for killed, at in kills:
        before = [when for when, _ in sends if when <= at]
        after = [when for when, name in sends if when > at and name != killed]
        assert before and after, (killed, at, sends)
        gaps.append((after[0] - before[-1]).total_seconds())
    return gaps


def test_killing_the_leading_beat_under_load_loses_no_cycle_and_doubles_nothing(
    failover_stack: FailoverStack,
) -> None:
    stack = failover_stack
    ids = stack.submit(12, sleep_s=4.0)
    stack.wait_running(ids, at_least=3, timeout_s=90)

    # Two failovers: kill the leader, bring it back (the supervisor's restart), kill the new leader.
    kills = []
    for _ in range(2):
        killed, _, killed_at = _kill_leader(stack)
        kills.append((killed, killed_at))
        stack.start_named_beat(killed)
        time.sleep(3 * INTERVAL_S)  # cycles go on under the new leader while the old one comes back
        stack.wait(stack.leader, 30, "a beat to lead after the restart")
    more = stack.submit(6, sleep_s=2.0)  # placed by cycles the second new leader sends
    counts = stack.check(ids + more, timeout_s=240)
    assert counts.clean(), counts

    # Beats stopped, their logs and the run records are final.
    for proc in stack.beats.values():
        stack._end(proc)
    # Cycles resumed within two intervals of the last send before each kill.
    sends = stack.sends()
    gaps = _takeover_gaps_s(sends["schedule-pools"], kills)
    assert all(gap <= 2 * INTERVAL_S for gap in gaps), gaps
    # No periodic entry sent twice: one beat at a time, each send at least half an interval after the last.
    for entry in SHORT_ENTRIES:
        times = sends.get(entry, [])
        assert len(times) >= 10, (entry, times)
        close = [
            (a, b) for a, b in itertools.pairwise(times) if (b[0] - a[0]).total_seconds() < 0.5 * INTERVAL_S
        ]
        assert close == [], (entry, close)
        # A send is claimed in its run record first: a leader killed between its claim and its send
        # loses that send (at most one per kill), it never makes two.
        claimed = stack.run_record(entry)[0]
        assert len(times) <= claimed <= len(times) + len(kills), (entry, claimed, len(times))
    # No periodic task ran twice: each message once, and no more runs than sends (expired ones are dropped).
    runs = stack.executions()
    assert [key for key, times in runs.items() if times > 1] == []
    for entry, task in SHORT_ENTRIES.items():
        ran = sum(1 for name, _ in runs if name == task)
        assert 0 < ran <= len(sends[entry]), (entry, ran, len(sends[entry]))
    # And never two cycles of the pool at once.
    assert stack.overlapping_cycles() == []
