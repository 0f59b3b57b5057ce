"""gunicorn settings of the plane image (`gunicorn -c docker/gunicorn.conf.py whalegen.config.wsgi`), each
overridable from the environment. Why these (docs/fleet.md, "Heartbeat load"; figures there):

- **Threads, not sync workers.** Each process serves `WHALEGEN_WEB_THREADS` requests at once: 4 × 8 = 32 a
  host. With the plane's default `WHALEGEN_AGENT_POLL_WAIT_S=0` an agent holds a thread only while one of
  its requests is served, and these 32 serve a fleet's heartbeats and fetches with the API beside them
  (docs/notes/agent-fleet.md). A long poll (a wait above 0) holds its thread for the whole wait: 100
  agents polling 20 s held all 32 and heartbeats and API calls timed out behind them; size workers ×
  threads above the agents before setting one. Each thread keeps its own PostgreSQL connection
  (`CONN_MAX_AGE`): workers × threads connections a host (docs/operations.md, "Scaling workers").
- **Keep-alive above the heartbeat interval.** The agent's client (`requests.Session`) reuses its
  connection when the server kept it open, so a heartbeat costs no TCP connect, accept and close.
  gunicorn's own default (2 s) closes it long before the next beat (10 s), and a keep-alive *equal* to
  the interval races the agent's next send: the server closes the connection as the request arrives and
  the heartbeat fails (measured: 1.2 % of heartbeats at 2 s beats with a 2 s keep-alive). The default is
  three intervals (`WHALEGEN_NODE_LOST_HEARTBEATS`' default): an agent silent that long is being declared
  lost anyway, and a late beat still finds its connection.
- **Connections per worker.** Every agent may hold two open connections (heartbeats and reports, and its
  long poll); a worker that holds `worker_connections` stops accepting (the others take the next ones),
  and once its kept-alive connections reach that number less its threads it answers with
  `Connection: close`. Each idle connection costs the worker a socket and a few KiB of memory.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import NoReturn

from whalegen.logformat import formatter_for, set_component


def refuse(message: str) -> NoReturn:
    """Stop the start with `message` as a log line like every other of the web's: gunicorn reads this file
    before it sets its logger up (`whalegen.gunicornlog`), so the line is formatted here."""
    set_component("web")
    record = logging.LogRecord("gunicorn.error", logging.ERROR, __file__, 0, message, None, None)
    sys.stderr.write(formatter_for(os.environ.get("WHALEGEN_LOG_FORMAT", "json")).format(record) + "\n")
    raise SystemExit(1)


def envfloat(name: str, default: float) -> float:
    """`whalegen.config.env`'s rule (a value that is not a number stops the start), written out: importing
    the package would load the Celery app into gunicorn's master."""
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        return float(value)
    except ValueError:
        refuse(f"{name}={value!r} is not a number")


def envint(name: str, default: int) -> int:
    value = envfloat(name, default)
    if value != int(value):
        refuse(f"{name}={os.environ[name]!r} is not an integer")
    return int(value)


bind = os.environ.get("WHALEGEN_WEB_BIND", "0.0.0.0:8000")
# `WEB_CONCURRENCY` (gunicorn's own variable) as the image has always read it: 4 on 2 cores (docs/api.md,
# "Submission speed": a submission waits on PostgreSQL and Redis for ~40 % of its time).
workers = envint("WEB_CONCURRENCY", 4)
worker_class = "gthread"
threads = envint("WHALEGEN_WEB_THREADS", 8)
keepalive = envint("WHALEGEN_WEB_KEEPALIVE_S", math.ceil(3 * envfloat("WHALEGEN_AGENT_HEARTBEAT_S", 10.0)))
worker_connections = envint("WHALEGEN_WEB_CONNECTIONS", 2_000)
graceful_timeout = 20
accesslog = "-"
# gunicorn's error and access lines in the plane's format (JSON unless WHALEGEN_LOG_FORMAT=plain), with the
# request's fields and credentials redacted (whalegen/gunicornlog.py; docs/logs-and-metrics.md, "Logs").
# `access_log_format` is not read: each access line is a record with its fields instead.
logger_class = "whalegen.gunicornlog.PlaneLogger"
