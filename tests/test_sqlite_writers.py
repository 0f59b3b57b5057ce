"""The embedded default's SQLite backend queues the process's writers (whalegen/config/sqlite/base.py):
many threads writing at once — transactions and single autocommit statements — all get through, even
with a busy timeout far shorter than their wait, where SQLite's own polling answers "database is
locked"."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

ENGINE = "whalegen.config.sqlite"


def _alias(tmp_path: Path, engine: str) -> str:
    alias = f"writers_{engine.rsplit('.', 1)[-1]}"
    options = {"transaction_mode": "IMMEDIATE", "timeout": 0.05}  # 50 ms: SQLite gives up quickly
    config = {"ENGINE": engine, "NAME": str(tmp_path / f"{alias}.sqlite3"), "OPTIONS": options}
    connections.settings[alias] = connections.configure_settings({"default": {}, alias: config})[alias]
    return alias


def _hammer(alias: str, *, threads: int = 8, rounds: int = 20) -> tuple[list[BaseException], int]:
    with connections[alias].cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("CREATE TABLE IF NOT EXISTS beat (id INTEGER PRIMARY KEY, who INTEGER, n INTEGER)")
    errors: list[BaseException] = []

    def writer(who: int) -> None:
        try:
            for n in range(rounds):
                if who % 2:  # a transaction that holds the write lock a little while (a cycle, a report)
                    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                        cursor.execute("INSERT INTO beat (who, n) VALUES (%s, %s)", [who, n])
                        time.sleep(0.005)
                        cursor.execute("UPDATE beat SET n = n WHERE who = %s", [who])
                else:  # a single statement in autocommit (a session save, a generation bump)
                    with connections[alias].cursor() as cursor:
                        cursor.execute("INSERT INTO beat (who, n) VALUES (%s, %s)", [who, n])
        except BaseException as error:  # reported to the test, which fails on it
            errors.append(error)
        finally:
            connections[alias].close()

    workers = [threading.Thread(target=writer, args=(who,)) for who in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM beat")
        (rows,) = cursor.fetchone()
    connections[alias].close()
    return errors, rows


def test_concurrent_writers_of_one_process_all_get_through(tmp_path: Path, django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():
        errors, rows = _hammer(_alias(tmp_path, ENGINE))
    assert errors == []
    assert rows == 8 * 20


def test_the_queue_is_first_come_first_served() -> None:
    from whalegen.config.sqlite.base import FifoLock

    lock = FifoLock()
    lock.acquire()
    order: list[int] = []

    def waiter(who: int) -> None:
        lock.acquire()
        order.append(who)
        lock.release()

    threads = []
    for who in range(5):
        thread = threading.Thread(target=waiter, args=(who,))
        thread.start()
        threads.append(thread)
        time.sleep(0.05)  # each asks after the previous one is queued
    lock.release()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]


@pytest.fixture(autouse=True)
def _forget_aliases() -> Any:
    yield
    for alias in [a for a in connections.settings if a.startswith("writers_")]:
        del connections.settings[alias]
