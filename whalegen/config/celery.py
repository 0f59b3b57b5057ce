"""The Celery app. Workers: `celery -A whalegen.config worker`; beat: `celery -A whalegen.config beat`.

A worker must outlive its broker: a Redis restart (SIGTERM or SIGKILL, a failover, a network cut) is
an outage to wait out, never a reason to exit, because nothing else runs the cycles and health checks.
What that takes here (docs/faults.md tells the story):
- retry the broker connection forever, at start-up too (Celery's default gives up after 100 tries);
- no gossip, mingle or worker heartbeats: WhaleGen never asks workers about each other (cycles take a
  PostgreSQL advisory lock), and these steps are the ones that touched a connection already gone while
  the consumer restarted (`Error on restarting Gossip: AttributeError(... 'connection_errors')`, the
  stale-connection family of celery/kombu#582 behind the fatal `'NoneType' object has no attribute
  'hostname'`). `PlaneConsumer` turns them off for every command line, not only the ones that pass
  `--without-gossip --without-mingle --without-heartbeat`;
- a running task whose message cannot be acknowledged (the connection is gone) is cancelled: with
  late acks the message comes back and runs again, and it must not run twice at once;
- TCP keepalive and a periodic health check on broker and result connections, so a Redis that vanished
  without closing its sockets (SIGKILL of a host, a dropped network) is noticed, not waited on.
A supervisor restarts a worker that dies anyway: `restart: unless-stopped` in docker/compose.yaml.

Queues: `celery` (everything) and `cycles` (the scheduling cycles, `task_routes` below). A worker started
without -Q consumes both; production adds workers with `-Q cycles` so cycles never wait behind other work.
Late acks and the visibility timeout go together: Redis hands an unacknowledged message to another worker
after `visibility_timeout`, so it is the longest task's hard time limit (WHALEGEN_TASK_TIME_LIMIT_S) plus a
margin, and no message is delivered again while its task may still run.
Beat: apps.periodic.scheduler.LeaderScheduler (CELERY_BEAT_SCHEDULER), any number of beats, one sending.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer
from kombu import Exchange, Queue

from whalegen.config import celerylog
from whalegen.config.env import envint

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")

# Seconds between PING health checks on an idle Redis connection; below Redis' own idle timeout.
REDIS_HEALTH_CHECK_S = 10
# Seconds the visibility timeout exceeds the longest task's hard time limit: room for the worker to kill
# an overrunning task and acknowledge its message before Redis would hand it out again.
VISIBILITY_MARGIN_S = 600
# Every task's hard time limit (the worker kills an overrunning one); the longest, a forecast retraining,
# takes minutes on a large history.
TASK_TIME_LIMIT_S = envint("WHALEGEN_TASK_TIME_LIMIT_S", 3_600)
CYCLES_QUEUE = "cycles"


class PlaneConsumer(Consumer):
    """The worker's consumer without the worker-to-worker steps (gossip, mingle, event heartbeats)."""

    def __init__(self, *args: Any, worker_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        options = dict(worker_options or {}, without_gossip=True, without_mingle=True, without_heartbeat=True)
        super().__init__(*args, worker_options=options, **kwargs)


app = Celery("whalegen")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue="celery",
    # Celery's own default queue (exchange and routing key `celery`) and the cycles' beside it.
    task_queues=[Queue(name, Exchange(name), routing_key=name) for name in ("celery", CYCLES_QUEUE)],
    task_routes={
        "apps.scheduling.tasks.cycles_all_pools": {"queue": CYCLES_QUEUE},
        "apps.scheduling.tasks.cycle_pool": {"queue": CYCLES_QUEUE},
    },
    task_time_limit=TASK_TIME_LIMIT_S,
    worker_consumer="whalegen.config.celery:PlaneConsumer",
    broker_connection_retry=True,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_cancel_long_running_tasks_on_connection_loss=True,
    broker_transport_options={
        "socket_keepalive": True,
        "health_check_interval": REDIS_HEALTH_CHECK_S,
        "retry_on_timeout": True,
        "visibility_timeout": TASK_TIME_LIMIT_S + VISIBILITY_MARGIN_S,
    },
    redis_socket_keepalive=True,
    redis_backend_health_check_interval=REDIS_HEALTH_CHECK_S,
    redis_retry_on_timeout=True,
    # A result write that meets a restarting Redis is retried instead of failing the task.
    result_backend_always_retry=True,
    result_backend_max_retries=20,
)
# Every line a worker or beat writes in the plane's log format (whalegen/config/celerylog.py).
celerylog.install(app)
app.autodiscover_tasks()
