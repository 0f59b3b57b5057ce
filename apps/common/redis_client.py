"""The plane's Redis client, shared by the heartbeats (`apps.fleet.liveness`) and the desired-state change
marks (`apps.fleet.changes`): one per process, made on first use."""

from __future__ import annotations

import threading

import redis
from django.conf import settings

# Short timeouts: a Redis that hangs sends a heartbeat the full way and delays a poll; it stalls neither.
TIMEOUT_S = 0.5

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


def plane_redis() -> redis.Redis | None:
    """The client for `REDIS_URL`, or None when the plane has no Redis (the embedded default). Kept per
    URL, so a plane pointed at another Redis (a test's own instance) gets a client for that one."""
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        return None
    client = _clients.get(url)
    if client is None:
        with _lock:
            client = _clients.get(url)
            if client is None:
                client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
                _clients[url] = client
    return client
