"""`LeaderScheduler`: Celery beat's scheduler, sending only while its beat holds the lease.

Run `celery -A whalegen.config beat` on two (or more) hosts; the settings name this class
(CELERY_BEAT_SCHEDULER), so every beat uses it. Each tick:
1. hold the lease (apps/periodic/leader.py): a standby tries for it, a leader confirms it; a beat that
   does not lead sends nothing and tries again in `renew_s`;
2. on taking over, read when each entry was last sent (by whichever beat led) from `PeriodicRun`, so the
   new leader's first send of an entry comes one interval after the old leader's last, not at once;
3. Celery's own tick, whose send of a due entry goes through `apply_entry`: the entry's run record is
   claimed (compare-and-set, on the lease's session) before the message is sent, and a failed claim
   sends nothing.
The schedule's state lives in PostgreSQL: no shelve file (Celery's PersistentScheduler, whose file
could be closed under a tick at shutdown: "invalid operation on closed shelf").
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
from celery.beat import ScheduleEntry, Scheduler

from apps.periodic.leader import BeatLease, lease_from_settings

logger = logging.getLogger(__name__)


class LeaderScheduler(Scheduler):
    def __init__(self, *args: Any, lease: BeatLease | None = None, **kwargs: Any) -> None:
        self.lease = lease if lease is not None else lease_from_settings()
        self._versions: dict[str, int] = {}  # entry → the run record's version this beat saw last
        super().__init__(*args, **kwargs)
        logger.info("beat %s started; it sends periodic work while it holds the lease", self.lease.holder)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # 1. Lead, or stand by.
        was_leading = self.lease.leading
        if not self.lease.hold():
            return self.lease.renew_s
        # 2. Just took over: the schedule as the last leader left it.
        if not was_leading and not self._take_over():
            return self.lease.renew_s
        # 3. Celery's tick (sends at most one due entry), waking in time to renew the lease.
        return float(min(super().tick(*args, **kwargs), self.lease.renew_s))

    def _take_over(self) -> bool:
        try:
            records = self.lease.runs(list(self.schedule))
        except psycopg.Error:
            logger.warning(
                "beat %s could not read the run records; standing by", self.lease.holder, exc_info=True
            )
            self.lease.release()
            return False
        now = self.app.now()
        for name, entry in self.schedule.items():
            record = records[name]
            # Ages are the database's (now() - last send): the hosts' clocks never meet.
            entry.last_run_at = now - timedelta(seconds=record.age_s)
            self._versions[name] = record.version
        self._heap = None  # rebuilt from the entries above on Celery's tick
        logger.info("beat %s leads periodic work (%d entries)", self.lease.holder, len(records))
        return True

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        version = self._versions.get(entry.name)
        if version is None or not self.lease.claim(entry.name, version):
            if self.lease.leading:
                # Another sender moved the record (it cannot while we hold the lock, but the record is
                # the authority): take its times again rather than guess.
                logger.warning(
                    "beat %s: run record of %r moved under it; rereading", self.lease.holder, entry.name
                )
                self._take_over()
            else:
                logger.warning("beat %s lost the lease; %r not sent", self.lease.holder, entry.name)
            return
        self._versions[entry.name] = version + 1
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        self.lease.release()
        super().close()
