"""The beat lease: which of several `celery beat` processes sends periodic work, decided in PostgreSQL.

Election is a session-level advisory lock (`pg_try_advisory_lock`) held on a connection of the beat's
own, outside Django's connection handling. Why this shape:
- a leader that dies (SIGKILL, OOM, a crash) closes its socket; its backend exits and the lock is free at
  once, so a standby's next try (every `renew_s`) takes over;
- a leader that hangs or whose host vanishes without closing the socket stops talking: the session has
  `idle_session_timeout` = `lease_s`, so PostgreSQL ends it after `lease_s` without a query and the lock
  is free. The leader renews by asking, every `renew_s` (a quarter of the lease), whether it still holds
  the lock. That is the lease's TTL, enforced by the database, not by a clock on the beat's host;
- every send is fenced: the entry's run record is claimed (compare-and-set on its version) on this same
  session, and only while the session holds the lock. A deposed leader's session is gone, so its claim
  fails and it sends nothing. The claim comes before the send: a leader that dies in between loses that
  one send (the next interval sends again), never doubles it.
- PgBouncer in transaction mode would hand the session lock to other clients: point beat at PostgreSQL
  directly or through session pooling.
"""

from __future__ import annotations

import logging
import os
import socket
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

logger = logging.getLogger(__name__)

# The lock's two keys: a fixed tag (distinct from the cycles' `whalegen.cycle`) and the one beat lease.
LOCK_CLASS = zlib.crc32(b"whalegen.beat") & 0x7FFFFFFF
LOCK_OBJECT = 1
# How long a connection attempt may take before this tick counts as "not leading".
CONNECT_TIMEOUT_S = 5
# Connection parameters Django adds for its own cursors; the lease's session uses plain psycopg.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")

_HOLDS = """
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
      AND classid = %(lock_class)s::oid AND objid = %(lock_object)s::oid AND objsubid = 2
)"""
_ENSURE_RUNS = """
INSERT INTO periodic_periodicrun (name, last_run_at, version, sent_by)
SELECT name, now(), 0, '' FROM unnest(%(names)s::text[]) AS name
ON CONFLICT (name) DO NOTHING"""
_READ_RUNS = """
SELECT name, EXTRACT(EPOCH FROM now() - last_run_at)::float8, version
FROM periodic_periodicrun WHERE name = ANY(%(names)s::text[])"""
_CLAIM = f"""
UPDATE periodic_periodicrun SET last_run_at = now(), version = version + 1, sent_by = %(holder)s
WHERE name = %(name)s AND version = %(version)s AND ({_HOLDS})"""


def beat_identity() -> str:
    """`<host>:<pid>`: who holds the lease, as the run records and PostgreSQL's `application_name` say."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class RunRecord:
    """An entry's last send as the database saw it: how long ago, and its compare-and-set version."""

    age_s: float
    version: int


class BeatLease:
    """One beat's view of the lease. Not thread-safe: beat ticks in one thread.

    `hold()` each tick: True while this beat leads (it seeks the lock when standing by and confirms it
    when leading). A database error never escapes `hold` or `claim`: a session in doubt is a lease lost.
    """

    def __init__(self, *, conninfo: dict[str, Any], lease_s: float, holder: str | None = None) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, not {lease_s}")
        self.conninfo = {k: v for k, v in conninfo.items() if k not in _DJANGO_ONLY}
        self.lease_s = lease_s
        self.holder = holder or beat_identity()
        self._conn: psycopg.Connection[Any] | None = None
        self._leading = False

    @property
    def renew_s(self) -> float:
        """How often a leader confirms its lock and a standby tries for it: four times per lease."""
        return self.lease_s / 4

    @property
    def leading(self) -> bool:
        return self._leading

    def hold(self) -> bool:
        try:
            conn = self._session()
            if self._leading:
                self._leading = bool(self._one(conn, _HOLDS))
            else:
                self._leading = bool(
                    self._one(conn, "SELECT pg_try_advisory_lock(%(lock_class)s, %(lock_object)s)")
                )
        except psycopg.Error as exc:
            self._drop(f"session lost: {exc.__class__.__name__}: {str(exc).strip()[:200]}")
        return self._leading

    def runs(self, names: Sequence[str]) -> dict[str, RunRecord]:
        """Every named entry's run record, made (sent "now", version 0) where it has none yet, so a fresh
        entry first runs one interval after the first leader took over, as Celery's own scheduler does."""
        conn = self._session()
        params = {"names": list(names)}
        conn.execute(_ENSURE_RUNS, params)
        rows = conn.execute(_READ_RUNS, params).fetchall()
        return {
            name: RunRecord(age_s=max(float(age_s), 0.0), version=int(version))
            for name, age_s, version in rows
        }

    def claim(self, name: str, version: int) -> bool:
        """Claim the entry's next send: True when this beat leads and the record is still at `version`
        (one row moved, on the session that holds the lock). False: do not send."""
        if not self._leading or self._conn is None:
            return False
        params = {"name": name, "version": version, "holder": self.holder, **self._keys()}
        try:
            claimed = self._conn.execute(_CLAIM, params).rowcount == 1
        except psycopg.Error as exc:
            self._drop(f"claim of {name!r} failed: {exc.__class__.__name__}")
            return False
        return claimed

    def release(self) -> None:
        """Give the lease up now; a standby takes it at its next try. The lock is let go by a statement
        before the session closes: a closed socket frees it only once the server's backend has exited."""
        if self._leading and self._conn is not None:
            try:
                self._one(self._conn, "SELECT pg_advisory_unlock(%(lock_class)s, %(lock_object)s)")
            except psycopg.Error:
                logger.debug("unlocking the beat lease failed; closing its session frees it", exc_info=True)
        self._drop("")

    # -- the session -----------------------------------------------------------------------------------

    def _session(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._leading = False  # a new session holds no lock
        lease_ms = max(int(self.lease_s * 1000), 1)
        keepalive_s = max(int(self.lease_s / 3), 1)
        conn = psycopg.connect(
            **self.conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=f"whalegen-beat {self.holder}"[:63],
            # The client side notices a silent server within about a lease as well.
            keepalives=1,
            keepalives_idle=keepalive_s,
            keepalives_interval=1,
            keepalives_count=3,
        )
        # The lease's TTL: PostgreSQL ends this session after `lease_s` without a query, freeing the lock;
        # a statement stuck longer than that is ended too. TCP keepalives let the server notice a host
        # that vanished without closing its socket.
        for setting, value in (
            ("idle_session_timeout", lease_ms),
            ("statement_timeout", lease_ms),
            ("tcp_keepalives_idle", keepalive_s),
            ("tcp_keepalives_interval", 1),
            ("tcp_keepalives_count", 3),
        ):
            conn.execute(f"SET {setting} = {int(value)}")
        self._conn = conn
        return conn

    def _one(self, conn: psycopg.Connection[Any], query: str) -> Any:
        row = conn.execute(query, self._keys()).fetchone()
        return row[0] if row else None

    @staticmethod
    def _keys() -> dict[str, int]:
        return {"lock_class": LOCK_CLASS, "lock_object": LOCK_OBJECT}

    def _drop(self, why: str) -> None:
        if self._leading and why:
            logger.warning("beat %s no longer leads periodic work: %s", self.holder, why)
        self._leading = False
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                logger.debug("closing the beat lease's session failed", exc_info=True)


def lease_from_settings(holder: str | None = None, lease_s: float | None = None) -> BeatLease:
    """The lease on Django's default database, `lease_s` long (default WHALEGEN_BEAT_LEASE_S)."""
    from django.conf import settings
    from django.db import connections

    wrapper = connections["default"]
    if wrapper.vendor != "postgresql":
        raise RuntimeError(
            "celery beat with a leader needs PostgreSQL (DATABASE_URL); the embedded default runs its "
            "periodic work in-process (`whalegen demo`)"
        )
    return BeatLease(
        conninfo=wrapper.get_connection_params(),
        lease_s=settings.WHALEGEN_BEAT_LEASE_S if lease_s is None else lease_s,
        holder=holder,
    )
