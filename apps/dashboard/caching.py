"""Figures that change only when a scheduling cycle runs, kept in the web process and keyed by the id of
the cycle they were computed after: a new cycle means a new key, so nothing is ever served stale past
the next cycle, and no invalidation is needed. Per process (each gunicorn worker keeps its own few
entries): the figures are cheap to keep and a shared cache would only add a round trip and pickling."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

MAX_ENTRIES = 32  # a few pools × a few policies; the oldest is dropped first
_entries: OrderedDict[Hashable, object] = OrderedDict()
_lock = threading.Lock()


def per_cycle(key: Hashable, compute: Callable[[], T]) -> T:
    """The value cached under `key` (which must hold the cycle id), else `compute()` stored under it.
    Two requests racing on a new key may both compute; both results are the same figures."""
    with _lock:
        if key in _entries:
            _entries.move_to_end(key)
            return _entries[key]  # type: ignore[return-value]
    value = compute()
    with _lock:
        _entries[key] = value
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
    return value


def clear() -> None:
    with _lock:
        _entries.clear()
