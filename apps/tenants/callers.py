"""A short-lived, per-process memory of who a bearer token is: its token row, its user and the access it
grants, so a pipeline's tenth submission in a second does not look all three up again.

Why: token lookup and access resolution were three queries and about a third of a single submission's
CPU (docs/api.md, "Speed"). Why it is safe:
- An entry lives at most `WHALEGEN_AUTH_CACHE_S` seconds (5 by default; 0 turns the memory off). A
  token revoked, a membership changed or removed, a user deactivated or a tenant moved in *another*
  process is seen here within that time; in the process that made the change, at once (every write to
  tokens, memberships, tenants or users clears this process's memory, see `apps.tenants.apps`).
- Expiry is checked on every use, cached or not: an expired token is refused the second it expires.
- Only tokens that worked are remembered; an unknown token is looked up every time.
- The memory is bounded (`MAX_ENTRIES` tokens); when full it starts again empty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from apps.tenants.models import ApiToken
from apps.tenants.selectors import Access

# A web process serves a few pipelines' tokens; far more than that in a few seconds is a scan, and
# starting again empty is the cheap, safe answer.
MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Caller:
    """A live token, its user (`token.user`, loaded) and what it may do. Shared between requests of one
    process: read it, never change it."""

    token: ApiToken
    access: Access
    fresh_until_s: float  # on the cache's monotonic clock


class CallerCache:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, Caller] = {}
        self._clock = clock
        # A writer in one thread clears while a reader in another puts what it read before the write:
        # the generation makes that put a no-op, so a stale entry never outlives the clear.
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        return self._generation

    def get(self, digest: str, *, now: datetime) -> Caller | None:
        """The remembered caller for a token hash, or None when unknown, stale or expired."""
        caller = self._entries.get(digest)
        if caller is None:
            return None
        expires_at = caller.token.expires_at
        if self._clock() >= caller.fresh_until_s or (expires_at is not None and expires_at <= now):
            self._entries.pop(digest, None)
            return None
        return caller

    def put(self, digest: str, *, token: ApiToken, access: Access, ttl_s: float, generation: int) -> Caller:
        """Remember a caller read at `generation` (read `generation` before the lookup); returns it."""
        caller = Caller(token=token, access=access, fresh_until_s=self._clock() + ttl_s)
        if ttl_s <= 0:
            return caller
        with self._lock:
            if generation != self._generation:
                return caller  # a write happened since the lookup: what was read may be stale
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = caller
        return caller

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


callers = CallerCache()


def forget_callers() -> None:
    """Forget every remembered caller of this process, now and again when the writing transaction
    commits: a request of another thread that read the old rows before the commit cannot leave them
    remembered."""
    callers.clear()
    transaction.on_commit(callers.clear)
