"""The change mark of a node's desired state (docs/fleet.md, "Change marks").

Rebuilding a node's desired state costs about six queries (~7 ms of web CPU); a waiting long poll that
rebuilt it every 0.25 s cost 0.03 of a core per idle agent. Instead, every writer that changes what a
node's agents must run — the scheduling cycle's commit (new assignments, re-carved layouts), a task
leaving its units (finish, cancel, preemption, requeue after loss or drain), a report that changes the
runs the plane believes alive — calls `node_changed` inside its transaction, and the node's mark moves
after the commit (`transaction.on_commit`: a rolled-back change marks nothing, and a reader never sees
the mark before the rows). A waiting poll compares the mark (one Redis HGET, or an in-process counter)
and rebuilds only when it moved; the heartbeat's shortcut compares it too and sends a node whose mark
moved the full way, whose answer carries the fresh generation (the agent's hint to fetch).

The mark is a counter per node: in Redis when the plane has one (field `mark` of the node's heartbeat
hash, `liveness.node_key`, HINCRBY: the heartbeat's script reads it with the fields it reads anyway, no
extra command; the writers are the Celery worker and the web processes, the readers the web processes),
and always in this process too (a dict and a condition), which is all the embedded default (SQLite, one
process, no Redis) needs, and lets a poll waiting in the writer's own process wake at once. A missed
writer or a lost mark (Redis restarted) only delays a change: every poll starts with a rebuild, and a
heartbeat takes the full way at least every `liveness.FINGERPRINT_TTL_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import redis
from django.db import transaction

from apps.common.redis_client import plane_redis
from apps.fleet import liveness

log = logging.getLogger("whalegen.fleet")

# The field of the node's heartbeat hash that holds its mark. The hash's expiry (the fingerprint's) may
# take the mark back to 0: a reader sees a change (one rebuild), and the fingerprint went with it.
MARK_FIELD = "mark"


class _Local:
    """The in-process marks: a counter per node and a condition that wakes the polls waiting here."""

    def __init__(self) -> None:
        self.marks: dict[int, int] = {}
        self.changed = threading.Condition()

    def bump(self, node_ids: Iterable[int]) -> None:
        with self.changed:
            for node_id in node_ids:
                self.marks[node_id] = self.marks.get(node_id, 0) + 1
            self.changed.notify_all()

    def read(self, node_id: int) -> int:
        with self.changed:
            return self.marks.get(node_id, 0)

    def wait(self, node_id: int, seen: int, timeout_s: float) -> int:
        with self.changed:
            self.changed.wait_for(lambda: self.marks.get(node_id, 0) != seen, timeout=timeout_s)
            return self.marks.get(node_id, 0)


_local = _Local()


def node_changed(node_ids: Iterable[int]) -> None:
    """Mark these nodes' desired states changed once the current transaction commits (at once outside
    one). Call it from the writer, in the transaction that changes the rows."""
    ids = sorted({int(node_id) for node_id in node_ids})
    if ids:
        transaction.on_commit(lambda: _bump(ids))


def _bump(node_ids: list[int]) -> None:
    _local.bump(node_ids)
    client = plane_redis()
    if client is None:
        return
    try:
        with client.pipeline(transaction=False) as pipe:
            for node_id in node_ids:
                pipe.hincrby(liveness.node_key(node_id), MARK_FIELD, 1)
            pipe.execute()
    except redis.RedisError as error:
        # The change still arrives: the next poll's first rebuild, or the heartbeat's periodic full way.
        log.warning("could not mark %d nodes changed (%s)", len(node_ids), error.__class__.__name__)


def read(node_id: int) -> str | None:
    """The node's mark as an opaque token (compare for equality only), or None when it cannot be read
    (Redis failing): the caller then treats the node as changed."""
    client = plane_redis()
    if client is None:
        return f"local:{_local.read(node_id)}"
    try:
        raw = client.hget(liveness.node_key(node_id), MARK_FIELD)
    except redis.RedisError as error:
        log.warning("could not read a desired-state mark (%s)", error.__class__.__name__)
        return None
    return (raw or b"0").decode()


def wait(node_id: int, seen: str | None, timeout_s: float, step_s: float) -> str | None:
    """Block until the node's mark differs from `seen` or `timeout_s` passed; the mark then. In-process
    marks wake the waiter at once; with Redis the mark is read every `step_s` (one HGET, tens of µs),
    since the writer is usually another process (the Celery worker)."""
    if timeout_s <= 0:
        return read(node_id)
    if plane_redis() is None:
        local_seen = int(seen.split(":", 1)[1]) if seen and seen.startswith("local:") else -1
        return f"local:{_local.wait(node_id, local_seen, timeout_s)}"
    deadline = time.monotonic() + timeout_s
    while True:
        mark = read(node_id)
        remaining_s = deadline - time.monotonic()
        if mark is None:
            # Redis fails: the caller rebuilds, at most once a step (the pace of the re-check before marks).
            time.sleep(max(0.0, min(step_s, remaining_s)))
            return None
        if mark != seen or remaining_s <= 0:
            return mark
        time.sleep(min(step_s, remaining_s))
