"""Figures that change only when a scheduling cycle runs, keyed by the id of the cycle they were computed
after: a new cycle means a new key, so nothing is ever served stale past the next cycle, and no
invalidation is needed.

Where they live: in Redis when the plane has one (`REDIS_URL`), because a figure may be computed by a
Celery worker and read by every web process; in this process otherwise (the embedded default, where the
computation runs on a thread of the web process itself). Values are JSON: plain figures, never objects.
Entries expire (`TTL_S`), so keys of old cycles do not pile up.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

PREFIX = "whalegen:dashboard:"
TTL_S = 3_600  # an hour: a pool whose cycles stopped still answers from its last decision
MAX_ENTRIES = 64  # in-process: a few pools × a few policies, their "latest" pointers and claims


class StoreUnavailable(RuntimeError):
    """Redis did not answer (restarting, unreachable): the caller says so instead of failing."""


_entries: OrderedDict[str, tuple[float, str]] = OrderedDict()  # key → (expires at, JSON)
_lock = threading.Lock()
_client: Any = None


def _redis() -> Any:
    """The Redis client when the plane has Redis, else None (kept per process; redis-py pools sockets)."""
    global _client
    url = settings.REDIS_URL
    if not url:
        return None
    if _client is None:
        import redis

        _client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    return _client


def _call(method: str, *args: Any, **kwargs: Any) -> Any:
    """One Redis command; its errors become `StoreUnavailable`."""
    import redis

    try:
        return getattr(_redis(), method)(*args, **kwargs)
    except redis.RedisError as exc:
        raise StoreUnavailable(str(exc)) from exc


def get(key: str) -> Any:
    """The value stored under `key`, or None."""
    if _redis() is not None:
        raw = _call("get", PREFIX + key)
        return None if raw is None else json.loads(raw)
    with _lock:
        entry = _entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        _entries.move_to_end(key)
        return json.loads(entry[1])


def put(key: str, value: Any, ttl_s: float = TTL_S) -> None:
    text = json.dumps(value)
    if _redis() is not None:
        _call("set", PREFIX + key, text, ex=max(1, int(ttl_s)))
        return
    with _lock:
        _entries[key] = (time.monotonic() + ttl_s, text)
        _entries.move_to_end(key)
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)


def claim(key: str, ttl_s: float) -> bool:
    """True for the one caller that set `key` first (until it expires): who starts a computation. The
    expiry is the computation's deadline, so a worker that died leaves it to be claimed again."""
    if _redis() is not None:
        return bool(_call("set", PREFIX + key, "1", nx=True, ex=max(1, int(ttl_s))))
    with _lock:
        entry = _entries.get(key)
        if entry is not None and entry[0] >= time.monotonic():
            return False
        _entries[key] = (time.monotonic() + ttl_s, "1")
        return True


def release(key: str) -> None:
    if _redis() is not None:
        _call("delete", PREFIX + key)
        return
    with _lock:
        _entries.pop(key, None)


def clear() -> None:
    """Forget every dashboard figure (tests and benchmarks: the next request finds nothing computed)."""
    client = _redis()
    if client is not None:
        keys = list(client.scan_iter(match=PREFIX + "*", count=500))
        if keys:
            client.delete(*keys)
    with _lock:
        _entries.clear()
