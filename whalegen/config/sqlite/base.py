"""The embedded default's SQLite backend: Django's, with one queue for writers in the process.

SQLite lets one writer in at a time, and a writer that finds the file locked polls it (the busy
timeout), sleeping longer between tries the longer it has waited. The embedded default is one process —
the web server's threads, beat and the eager worker — and under a busy demo (ten agents, a cycle per
pool, a dashboard open) that polling is a convoy: a writer that happens to sleep through each release
waits seconds, and past the timeout answers "database is locked" (heartbeats waited up to 8 s in a
traced demo, and the slowest failed). Here writers of this process queue first-come first-served on a
lock before they ask SQLite (`BEGIN IMMEDIATE` for a transaction, or a single write statement in
autocommit), so SQLite's own wait is only ever for another process (a `manage.py` command).
Reads never queue: WAL lets them run beside the writer.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db.backends.sqlite3 import base

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class FifoLock:
    """A lock granted in the order it was asked for (a ticket lock), so no writer waits behind late
    arrivals that keep winning the race for a plain lock."""

    def __init__(self) -> None:
        self._turns = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def acquire(self) -> None:
        with self._turns:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._turns.wait()

    def release(self) -> None:
        with self._turns:
            self._serving += 1
            self._turns.notify_all()


WRITERS = FifoLock()


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writers = False

    def _take_writers(self) -> None:
        WRITERS.acquire()
        self._holds_writers = True

    def _give_writers(self) -> None:
        if self._holds_writers:
            self._holds_writers = False
            WRITERS.release()

    def _start_transaction_under_autocommit(self) -> None:
        self._take_writers()
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._give_writers()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            self._give_writers()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._give_writers()

    def _close(self) -> None:
        try:
            super()._close()
        finally:
            self._give_writers()

    def create_cursor(self, name: Any = None) -> Any:
        return _QueuedCursor(self, self.connection.cursor(factory=base.SQLiteCursorWrapper))


class _QueuedCursor:
    """A single write statement outside a transaction takes its turn like a transaction does."""

    def __init__(self, wrapper: DatabaseWrapper, cursor: base.SQLiteCursorWrapper) -> None:
        self._wrapper = wrapper
        self._cursor = cursor

    def _queued(self, sql: str | None) -> bool:
        head = (sql or "").lstrip()[:7].upper()
        return (
            not self._wrapper.in_atomic_block
            and not self._wrapper._holds_writers
            and head.startswith(_WRITES)
        )

    def execute(self, sql: str, params: Any = None) -> Any:
        if not self._queued(sql):
            return self._cursor.execute(sql, params)
        WRITERS.acquire()
        try:
            return self._cursor.execute(sql, params)
        finally:
            WRITERS.release()

    def executemany(self, sql: str, param_list: Any) -> Any:
        if not self._queued(sql):
            return self._cursor.executemany(sql, param_list)
        WRITERS.acquire()
        try:
            return self._cursor.executemany(sql, param_list)
        finally:
            WRITERS.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Any:
        return iter(self._cursor)
