"""A short-lived, per-process memory of which node a heartbeat's credential is, so 200 heartbeats a
second do not hash-and-look-up the same 2,000 tokens again and again (docs/fleet.md, "Heartbeat load").

Why it is safe:
- An entry lives at most `WHALEGEN_AUTH_CACHE_S` seconds (5 by default; 0 turns the memory off), the
  same bound as user tokens (`apps.tenants.callers`). A credential replaced in *another* process
  (`node_token_issue`) still works here for at most that long; in the process that replaced it, at once
  (`node_token_issue` clears this memory, now and on commit).
- Only the node's id and name are kept, never a `Node` row: every heartbeat builds its own row object
  and reads the node's state from its own `UPDATE … RETURNING`, so nothing shared is written to.
- A node deleted meanwhile is found by that `UPDATE` (no row): the entry is dropped and the heartbeat
  refused as an unknown credential.
- Only credentials that worked are remembered; an unknown one is looked up every time.
- Bounded (`MAX_ENTRIES`); when full it starts again empty.

The heartbeat shortcut (`apps.fleet.liveness`) also reads an entry past `WHALEGEN_AUTH_CACHE_S`
(`known`, up to `liveness.FINGERPRINT_TTL_S`): it is safe there because the shortcut is only taken when
Redis holds the node's fingerprint made with this very credential, which `node_token_issue` drops for
every process at once; otherwise the heartbeat takes the full way and `node_for` checks it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from apps.fleet.selectors import credential_hash
from apps.inventory.models import Node

# Far above one plane's fleet: a process answers heartbeats of every node.
MAX_ENTRIES = 65_536

# The lookup as fixed SQL: the ORM compiled this one-table read afresh on every call, and it runs for
# every request with an unknown credential (never remembered), which made refusing a heartbeat cost more
# than answering one (docs/fleet.md, "Heartbeat load"). Lowest id first, as `.first()` read it.
_LOOKUP_SQL = (
    f"SELECT id, name FROM {Node._meta.db_table} WHERE agent_credential_hash = %s ORDER BY id LIMIT 1"
)


@dataclass(frozen=True)
class KnownNode:
    node_id: int
    name: str
    digest: str  # the credential's hash
    checked_at_s: float  # on the memory's monotonic clock

    def row(self) -> Node:
        """A `Node` of this id and name for this request only (the heartbeat's services read `pk` and
        `name` and set `state` and `last_heartbeat_at` from the row they update)."""
        node = Node(pk=self.node_id, name=self.name)
        node._state.adding = False
        return node


class NodeCredentials:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, KnownNode] = {}
        self._clock = clock
        self._generation = 0  # a clear between a lookup and its put makes the put a no-op
        self._lock = threading.Lock()

    def node_for(self, raw: str) -> Node | None:
        """The node whose credential `raw` is, from memory when fresh, else looked up (one indexed
        query); None when no node holds it."""
        if not raw:
            return None
        digest = credential_hash(raw)
        known = self._entries.get(digest)
        if known is not None and self._clock() < known.checked_at_s + self.ttl_s:
            return known.row()
        generation = self._generation
        with connection.cursor() as cursor:
            cursor.execute(_LOOKUP_SQL, [digest])
            found = cursor.fetchone()
        if found is None:
            return None
        known = KnownNode(node_id=found[0], name=found[1], digest=digest, checked_at_s=self._clock())
        # Kept even with the memory off (ttl 0): only `known` reads it then, bound to a fingerprint.
        with self._lock:
            if generation == self._generation:
                if len(self._entries) >= MAX_ENTRIES:
                    self._entries.clear()
                self._entries[digest] = known
        return known.row()

    def known(self, raw: str, *, within_s: float) -> KnownNode | None:
        """The node this credential was last found to be, checked at most `within_s` ago, with no query:
        only for a caller that verifies it otherwise (the heartbeat shortcut's fingerprint)."""
        if not raw:
            return None
        known = self._entries.get(credential_hash(raw))
        if known is None or self._clock() >= known.checked_at_s + within_s:
            return None
        return known

    @property
    def ttl_s(self) -> float:
        return float(settings.WHALEGEN_AUTH_CACHE_S)

    def forget(self, node_id: int) -> None:
        with self._lock:
            self._generation += 1
            for digest in [d for d, known in self._entries.items() if known.node_id == node_id]:
                self._entries.pop(digest, None)

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()


credentials = NodeCredentials()


def credentials_changed() -> None:
    """A node credential was replaced: forget every remembered one, now and once the change commits
    (a lookup in another thread between the two would otherwise remember the old row)."""
    credentials.clear()
    transaction.on_commit(credentials.clear)
