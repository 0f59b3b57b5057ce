"""Issue #11 item 3: the Celery worker survives Redis restarts (SIGTERM and SIGKILL) by itself.

A real worker (prefork pool, no extra flags: the app itself turns the worker-to-worker steps off), on
a Redis of the suite's own. Redis is restarted under it again and again; after each restart a task sent
through the broker must be executed by that same worker process, and its log must show no error of the
stale-connection family (`AttributeError` on a connection already gone) that ended workers with
`Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")`.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from tests.faults.conftest import Worker
from tests.faults.services import RedisServer

pytestmark = pytest.mark.faults


def _client(url: str) -> Celery:
    """A sender of our own on the suite's Redis with the plane's broker options. No result backend: the
    result is read straight from Redis (`_executed`), so no result listener runs through the restarts."""
    from whalegen.config.celery import app

    client = Celery("faults-client", broker=url, set_as_current=False)
    # Keys first, values only for the broker's: Celery's view of Django's settings lists a key for every
    # settings attribute, and some (an override's bookkeeping, say) have no value it can read.
    broker = {key: app.conf[key] for key in list(app.conf.keys()) if key.startswith("broker_")}
    client.conf.update(broker, broker_url=url)
    return client


def _executed(client: Celery, url: str, token: int, timeout_s: float) -> bool:
    """Send the built-in `celery.accumulate` (it returns its argument, touches no database) through the
    broker and wait for the worker's result record in Redis."""
    deadline = time.monotonic() + timeout_s
    store = redis.Redis.from_url(url, socket_timeout=2)
    try:
        while time.monotonic() < deadline:
            try:
                task_id = client.send_task("celery.accumulate", args=(token,)).id
            except Exception:  # the broker is still coming back: send again
                time.sleep(0.5)
                continue
            while time.monotonic() < deadline:
                try:
                    raw = store.get(f"celery-task-meta-{task_id}")
                except redis.RedisError:
                    raw = None
                if raw is not None:
                    meta = json.loads(raw)
                    return bool(meta["status"] == "SUCCESS" and meta["result"] == [token])
                time.sleep(0.2)
        return False
    finally:
        store.close()


def test_a_worker_survives_redis_restarts_with_sigterm_and_sigkill_and_keeps_executing_tasks(
    redis_server: RedisServer, fault_dir: Path
) -> None:
    worker = Worker(fault_dir / "worker", name="faults-broker", env={"REDIS_URL": redis_server.url},
                    extra=("--concurrency", "2"))  # fmt: skip
    client = _client(redis_server.url)
    worker.start()
    try:
        worker.wait_ready()
        assert _executed(client, redis_server.url, 0, 30)
        pid = worker.proc.pid if worker.proc else None
        restarts = [
            signal.SIGTERM,
            signal.SIGKILL,
            signal.SIGTERM,
            signal.SIGKILL,
            signal.SIGKILL,
            signal.SIGTERM,
        ]
        for n, signum in enumerate(restarts, start=1):
            redis_server.restart(signum, down_s=0.5 + (n % 3))
            assert worker.alive(), f"worker exited after restart {n} ({signum.name}):\n{worker.log()[-3000:]}"
            assert _executed(client, redis_server.url, n, 60), (
                f"no task executed after restart {n} ({signum.name}):\n{worker.log()[-3000:]}"
            )
        assert worker.proc is not None and worker.proc.pid == pid and worker.alive()
        log = worker.log()
        assert log.count("Connection to broker lost") >= len(restarts)
        assert "Unrecoverable" not in log and "AttributeError" not in log, log[-5000:]
    finally:
        worker.stop()
        client.close()
