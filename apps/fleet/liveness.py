"""Heartbeat liveness in Redis, moved to PostgreSQL in batches (docs/fleet.md, "Heartbeat load").

A node whose heartbeat says nothing new — the same inventory, agent and protocol version and list of
runs as the last heartbeat the plane took the full way, no GPU event — needs nothing of PostgreSQL:
the plane only has to note *that* it beat, when, and the agent's pace. Such a beat is one Lua script
on Redis (`beat`): it checks the node's fingerprint, stores the beat in the node's hash, marks the
node dirty and, when the node's telemetry sample is due, queues the telemetry. `flush`, called by the
node-health check before it looks at silence, moves the dirty nodes' beats to PostgreSQL in one
batched `UPDATE … FROM unnest(…)` per table and the queued telemetry in one multi-row INSERT, so loss
detection reads liveness as fresh as Redis holds it.

The fingerprint (`wg:hb:<node id>` field `digest`) is written only after a heartbeat the full way found
the node not lost and every run it believes alive listed by the agent (`remember`); it is dropped
(`forget`) whenever the plane changes what that check relied on: the node marked lost, a report
applied, a credential replaced. It also expires (`FINGERPRINT_TTL_S`), so every node takes the full
way now and then whatever happens. Without Redis (the embedded SQLite default, or Redis down) every
heartbeat takes the full way: this module is an accelerator, never the only path.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import blake2b
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, connection

from apps.common.redis_client import plane_redis
from apps.fleet.models import NodeAgent
from apps.fleet.telemetry import samples_store_batch
from apps.inventory.models import Gpu, Node
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")

# A backstop, not the mechanism: every node takes the full way at least this often even if nothing
# dropped its fingerprint (10 min: at 10 s beats one in 60 is a full one, ~0.2 ms a beat amortised).
FINGERPRINT_TTL_S = 600
# How many dirty nodes or telemetry entries one flush statement carries.
FLUSH_BATCH = 5_000
# How fast the recorded clock offset follows a receive-minus-send difference above it: slow enough that
# a minute of plane congestion still shows as lag, fast enough to follow an agent clock that drifts or
# steps (2 % a heartbeat: half of a step is absorbed after ~35 heartbeats). The full way's agent-row
# UPDATE (`apps.fleet.heartbeat`) and the flush below apply the same rule.
OFFSET_CREEP = 0.02


def _prefix() -> str:
    """Keys are named after the plane's database: two planes (or a plane and its test run) sharing one
    Redis database never read each other's beats."""
    return f"wg:hb:{settings.DATABASES['default']['NAME']}:"


def node_key(node_id: int) -> str:
    return f"{_prefix()}{node_id}"


def dirty_key() -> str:
    return f"{_prefix()}dirty"


def telemetry_key() -> str:
    return f"{_prefix()}telemetry"


def clear() -> int:
    """Drop every key of this plane's (tests start from nothing); returns how many."""
    client = _redis.client()
    if client is None:
        return 0
    keys = list(client.scan_iter(match=f"{_prefix()}*", count=1_000))
    return int(client.delete(*keys)) if keys else 0


# KEYS: node hash, dirty set, telemetry list. ARGV: 1 digest, 2 now (epoch s), 3 sent (agent clock),
# 4 raw (now - sent, computed in Python at full precision), 5 generation applied, 6 telemetry period (s),
# 7 telemetry entry (JSON, '' when none), 8 node id. Returns the generation last served, or -1: take the
# full way (no fingerprint, or another one, or the node's desired-state mark (`mark`, written by
# `apps.fleet.changes`) moved past the one the full way that stored the fingerprint had read (`seen`):
# the full way rebuilds the desired state, and its answer's generation tells the agent to fetch).
# `tel_at` is compared in Lua's doubles (enough: seconds). The node's fields go in one HSET (each
# `redis.call` costs Redis a command's dispatch).
_BEAT_LUA = """
local k = redis.call('HMGET', KEYS[1], 'digest', 'gen', 'sent', 'tel_at', 'mark', 'seen')
if not k[1] or k[1] ~= ARGV[1] then return -1 end
if k[6] ~= (k[5] or '0') then return -1 end
local now = tonumber(ARGV[2])
local sent = tonumber(ARGV[3])
local prev = tonumber(k[3])
local fields = {'at', ARGV[2], 'raw', ARGV[4], 'applied', ARGV[5]}
if prev == nil or prev < sent then
  fields[#fields + 1] = 'sent'
  fields[#fields + 1] = ARGV[3]
  if prev ~= nil then
    fields[#fields + 1] = 'gap'
    fields[#fields + 1] = tostring(sent - prev)
  end
end
local tel_at = tonumber(k[4])
local due = ARGV[7] ~= '' and (tel_at == nil or now - tel_at >= tonumber(ARGV[6]))
if due then
  fields[#fields + 1] = 'tel_at'
  fields[#fields + 1] = ARGV[2]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('SADD', KEYS[2], ARGV[8])
if due then redis.call('RPUSH', KEYS[3], ARGV[7]) end
return tonumber(k[2])
"""


def _command(*parts: bytes) -> bytes:
    """One Redis command as the wire carries it (RESP: an array of bulk strings). The beat's arguments
    are bytes already, so redis-py's generic packer (a type check and an encode per argument; with its
    retry wrapper, 73–80 µs of CPU a call here against 39–46 µs packed this way) has nothing to add."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out += (b"$%d\r\n" % len(part), part, b"\r\n")
    return b"".join(out)


class _Redis:
    """The plane's client with the beat script registered on it; None when the plane has no Redis or
    `WHALEGEN_HEARTBEAT_REDIS` is off."""

    def __init__(self) -> None:
        self._client: redis.Redis | None = None
        self._script: Any = None
        self._lock = threading.Lock()

    def client(self) -> redis.Redis | None:
        if not settings.WHALEGEN_HEARTBEAT_REDIS:
            return None
        client = plane_redis()
        if client is not None and self._client is not client:
            with self._lock:
                if self._client is not client:
                    self._script = client.register_script(_BEAT_LUA)
                    self._client = client
        return client

    def script(self) -> Any:
        return self._script

    def run_beat(self, client: redis.Redis, keys: list[str], args: list[str | bytes]) -> Any:
        """The beat script on one of the client's pooled connections, packed here (`_command`). The
        first call after Redis lost its scripts (a restart, SCRIPT FLUSH) goes through redis-py's
        `Script`, which loads it again. A connection that failed is dropped, as redis-py drops it;
        there is no retry: a beat that fails takes the full way at once."""
        script = self._script
        raw = [part if isinstance(part, bytes) else part.encode() for part in (*keys, *args)]
        packed = _command(b"EVALSHA", script.sha.encode(), b"%d" % len(keys), *raw)
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([packed], check_health=False)
            answered = conn.read_response()
        except redis.exceptions.NoScriptError:
            answered = None
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return script(keys=keys, args=args) if answered is None else answered

    def reset(self) -> None:
        with self._lock:
            self._client = None
            self._script = None


_redis = _Redis()


# The heartbeat fields a fingerprint covers, and their defaults (`p.Heartbeat`'s) when absent.
_FINGERPRINTED = (("agent_version", None), ("protocol_version", p.PROTOCOL_VERSION), ("inventory", []),
                  ("lost_gpus", []), ("running", None))  # fmt: skip


def fingerprint(node_id: int, data: dict[str, Any], credential: str) -> str:
    """What must be unchanged for a heartbeat to skip PostgreSQL, from the message as received (JSON):
    the node and the credential it used, the agent's and protocol's versions, the GPUs it reports (and
    lost ones) and the runs it lists (absent, a 1.0 agent, is kept apart from an empty list). The full
    way decoded and accepted exactly these values when it left the fingerprint, so a heartbeat that
    repeats them needs no decoding of them again."""
    basis = [node_id, credential, *(data.get(name, default) for name, default in _FINGERPRINTED)]
    return blake2b(json.dumps(basis, sort_keys=True).encode(), digest_size=16).hexdigest()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _telemetry_entry(node_id: int, now_s: float, data: dict[str, Any], body: bytes) -> bytes | None:
    """The queued telemetry: the request body as received, which the flush decodes (dropping a malformed
    sample), with the node and the receive time around it; b'' when the message has no samples, None
    when they are not lists (the full way answers that). The body goes in as it came: re-encoding the
    samples cost more than the rest of the shortcut's own Python. Only a body of plain UTF-8 JSON text is
    embedded (`json.loads` also reads UTF-16 and UTF-32, which would not nest); any other is re-encoded."""
    telemetry, processes = data.get("telemetry", []), data.get("processes", [])
    if not isinstance(telemetry, list) or not isinstance(processes, list):
        return None
    if not telemetry and not processes:
        return b""
    head = b'{"node":%d,"at":%s,"body":' % (node_id, repr(now_s).encode())
    if body[:1] != b"{" or b"\x00" in body:
        body = json.dumps({"telemetry": telemetry, "processes": processes}, separators=(",", ":")).encode()
    return head + body + b"}"


def beat(*, node_id: int, data: Any, body: bytes, now: datetime, credential: str) -> int | None:
    """Record a heartbeat that changes nothing, in Redis: the generation last served to the node, or None
    when it must take the full way (it changes something, it is not the shape the shortcut reads,
    Redis has no fingerprint, or there is no Redis). `data`: the message as received (`body`, decoded),
    checked here for what the shortcut stores; a message with anything unusual goes the full way, which
    decodes all of it and answers as it always did."""
    if not isinstance(data, dict) or data.get("node_id") != str(node_id) or data.get("events"):
        return None
    sent, applied = data.get("sent_at_s"), data.get("generation_applied", 0)
    if not _number(sent) or not isinstance(applied, int) or isinstance(applied, bool):
        return None
    if not 0 <= applied <= p.INT64_MAX:
        return None
    now_s = now.timestamp()
    entry = _telemetry_entry(node_id, now_s, data, body)
    client = _redis.client()
    if entry is None or client is None:
        return None
    keys = [node_key(node_id), dirty_key(), telemetry_key()]
    args = [
        fingerprint(node_id, data, credential),
        repr(now_s),
        repr(float(sent)),
        repr(now_s - sent),
        str(applied),
        repr(float(settings.WHALEGEN_TELEMETRY_SAMPLE_S)),
        entry,
        str(node_id),
    ]
    try:
        answered = _redis.run_beat(client, keys, args)
    except redis.RedisError as error:
        log.warning("heartbeat liveness in Redis failed (%s): the full way", error.__class__.__name__)
        return None
    generation = int(answered)
    return None if generation < 0 else generation


def remember(
    *,
    node_id: int,
    data: dict[str, Any],
    message: p.Heartbeat,
    credential: str,
    generation: int,
    telemetry_at: datetime | None,
    mark: str | None,
) -> None:
    """After a heartbeat the full way that left nothing pending (the caller decides): the node's
    fingerprint, so that its next heartbeats that change nothing skip PostgreSQL. `mark`: the node's
    desired-state mark read before the full way built the generation answered (`changes.read`); a beat
    that finds another mark takes the full way again. None (unreadable): nothing is remembered."""
    client = _redis.client()
    if client is None or mark is None:
        return
    mapping = {
        "digest": fingerprint(node_id, data, credential),
        "gen": str(generation),
        "sent": repr(message.sent_at_s),
        "tel_at": repr(telemetry_at.timestamp()) if telemetry_at else "0",
        "seen": mark,  # never `mark` itself: the writers own that field
    }
    key = node_key(node_id)
    try:
        with client.pipeline(transaction=True) as pipe:
            # The pace fields of a beat the full way are in PostgreSQL already: only the fingerprint here.
            pipe.hdel(key, "at", "raw", "applied", "gap")
            pipe.hset(key, mapping=mapping)
            pipe.expire(key, FINGERPRINT_TTL_S)
            pipe.execute()
    except redis.RedisError as error:
        log.warning("could not remember a heartbeat fingerprint (%s)", error.__class__.__name__)


def forget(node_ids: Iterable[int]) -> None:
    """Drop these nodes' fingerprints: their next heartbeat takes the full way. A beat already stored
    stays (and is flushed): only the shortcut goes."""
    keys = [node_key(node_id) for node_id in node_ids]
    client = _redis.client()
    if client is None or not keys:
        return
    try:
        client.hdel(keys[0], "digest") if len(keys) == 1 else _forget_many(client, keys)
    except redis.RedisError as error:
        # The fingerprint expires by itself; until then the node's beats still land (in Redis).
        log.warning("could not drop heartbeat fingerprints (%s)", error.__class__.__name__)


def _forget_many(client: redis.Redis, keys: list[str]) -> None:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hdel(key, "digest")
        pipe.execute()


# ------------------------------------------------------------------------------------------- flush


@dataclass(frozen=True)
class FlushResult:
    nodes: int  # nodes whose beats were moved to PostgreSQL
    telemetry: int  # telemetry entries stored
    lost_forgotten: int  # lost (or deleted) nodes heard in Redis: fingerprint dropped, next beat the full way
    # False when PostgreSQL refused a batch: beats held in Redis did not all arrive, so silence must not
    # be judged this time (the batch's nodes are marked dirty again for the next flush).
    complete: bool = True
    # Nodes whose row another transaction held (a report, a full-way heartbeat): their beat stays in
    # Redis, dirty for the next flush. They were heard since the last flush, so the node-health check
    # must not judge their silence on the row this time.
    held: frozenset[int] = frozenset()


def _flush_sql() -> tuple[str, str]:
    node, agent = Node._meta.db_table, NodeAgent._meta.db_table
    # SKIP LOCKED: a row another transaction holds (a report, a full-way heartbeat, a node being lost)
    # is left out, never waited on. NO KEY UPDATE, the lock the UPDATE takes anyway: a transaction that
    # only inserts rows naming the node (its key share lock) does not hold the beat back. `moved` says
    # which beats landed and `present` which nodes exist (read from the statement's snapshot, without a
    # lock), so a held node is told from a deleted one.
    nodes_sql = f"""
WITH beat AS (SELECT * FROM unnest(%(ids)s::bigint[], %(at)s::timestamptz[]) AS b(id, at)),
locked AS (SELECT n.id FROM {node} n JOIN beat ON beat.id = n.id
           ORDER BY n.id FOR NO KEY UPDATE OF n SKIP LOCKED),
moved AS (UPDATE {node} AS n SET last_heartbeat_at = GREATEST(n.last_heartbeat_at, beat.at)
          FROM beat, locked WHERE n.id = beat.id AND locked.id = n.id
          RETURNING n.id, n.state)
SELECT beat.id, moved.state, moved.id IS NOT NULL, EXISTS (SELECT 1 FROM {node} x WHERE x.id = beat.id)
FROM beat LEFT JOIN moved ON moved.id = beat.id
"""
    agents_sql = f"""
WITH beat AS (SELECT * FROM unnest(%(ids)s::bigint[], %(sent)s::float8[], %(gap)s::float8[],
                                   %(raw)s::float8[], %(applied)s::bigint[])
              AS b(id, sent, gap, raw, applied)),
locked AS (SELECT a.node_id FROM {agent} a JOIN beat ON beat.id = a.node_id
           ORDER BY a.node_id FOR NO KEY UPDATE OF a SKIP LOCKED),
moved AS (UPDATE {agent} AS a SET
    generation_applied = beat.applied,
    last_sent_s = CASE WHEN a.last_sent_s IS NULL OR a.last_sent_s < beat.sent THEN beat.sent
                       ELSE a.last_sent_s END,
    heartbeat_gap_s = CASE WHEN beat.gap IS NOT NULL THEN beat.gap
                           WHEN a.last_sent_s IS NULL THEN NULL
                           WHEN a.last_sent_s < beat.sent THEN beat.sent - a.last_sent_s
                           ELSE a.heartbeat_gap_s END,
    clock_offset_s = CASE WHEN a.clock_offset_s IS NULL OR a.clock_offset_s >= beat.raw THEN beat.raw
                          ELSE a.clock_offset_s + %(creep)s * (beat.raw - a.clock_offset_s) END,
    heartbeat_lag_s = CASE WHEN a.clock_offset_s IS NULL OR a.clock_offset_s >= beat.raw THEN 0.0
                           ELSE (1 - %(creep)s) * (beat.raw - a.clock_offset_s) END
          FROM beat, locked WHERE a.node_id = beat.id AND locked.node_id = a.node_id
          RETURNING a.node_id)
SELECT beat.id, moved.node_id IS NOT NULL, EXISTS (SELECT 1 FROM {agent} x WHERE x.node_id = beat.id)
FROM beat LEFT JOIN moved ON moved.node_id = beat.id
"""
    return nodes_sql, agents_sql


def _num(value: bytes | None) -> float | None:
    return None if value is None or value == b"" else float(value)


def flush() -> FlushResult:
    """Move every beat stored in Redis to PostgreSQL; none when the plane has no Redis. Each batch is
    two statements (node rows, agent rows, each locking its rows in id order: the order every other
    writer takes them in) and one telemetry INSERT.

    No statement waits on a row lock: a node whose row a request holds (a report's transaction, whose
    web thread may be starved of CPU for seconds) is skipped, and its beat stays in Redis, dirty, for
    the next flush (`FlushResult.held`). Waiting there held every lower-id node's row already locked,
    so every report on those nodes queued behind the flush, each holding a web thread (the convoy of
    docs/notes/agent-fleet.md, run 3)."""
    client = _redis.client()
    if client is None:
        return FlushResult(0, 0, 0)
    nodes = telemetry = forgotten = 0
    held: set[int] = set()
    try:
        while True:
            ids = [int(raw) for raw in client.spop(dirty_key(), FLUSH_BATCH) or []]
            if not ids:
                break
            try:
                moved, lost, skipped = _flush_beats(client, ids)
            except DatabaseError:
                log.exception("heartbeat flush to PostgreSQL failed; %d nodes kept for the next", len(ids))
                client.sadd(dirty_key(), *ids, *held)
                return FlushResult(nodes, telemetry, forgotten, complete=False, held=frozenset(held))
            nodes += moved
            held.update(skipped)
            forget(lost)
            forgotten += len(lost)
            if len(ids) < FLUSH_BATCH:
                break
        if held:  # after the loop, so that this flush does not pop them again
            client.sadd(dirty_key(), *held)
        while True:
            entries = client.lpop(telemetry_key(), FLUSH_BATCH) or []
            if not entries:
                break
            try:
                telemetry += _store_telemetry([json.loads(entry) for entry in entries])
            except DatabaseError:
                log.exception("telemetry flush to PostgreSQL failed; kept %d entries", len(entries))
                client.lpush(telemetry_key(), *reversed(entries))
                break
            if len(entries) < FLUSH_BATCH:
                break
    except redis.RedisError as error:
        # Complete enough: while Redis fails, every heartbeat takes the full way (PostgreSQL), so what
        # PostgreSQL lacks is at most the beats since the last flush, each node's next beat making up.
        log.warning("heartbeat flush from Redis failed (%s); next check retries", error.__class__.__name__)
    return FlushResult(nodes, telemetry, forgotten, held=frozenset(held))


def _flush_beats(client: redis.Redis, ids: list[int]) -> tuple[int, list[int], list[int]]:
    """One batch: (nodes whose beat landed, lost or deleted nodes to forget, nodes held by another
    transaction and left dirty). The agent rows are written only for the nodes whose row landed, so a
    held node's beat is written whole by a later flush and none of it twice (the offset's creep is not
    idempotent; the node's GREATEST is)."""
    with client.pipeline(transaction=False) as pipe:
        for node_id in ids:
            pipe.hmget(node_key(node_id), "at", "sent", "gap", "raw", "applied")
        rows = pipe.execute()
    beats = [(node_id, row) for node_id, row in zip(ids, rows, strict=True) if row[0] is not None]
    if not beats:
        return 0, [], []
    node_sql, agent_sql = _flush_sql()
    with connection.cursor() as cursor:  # autocommit: each statement its own short transaction
        cursor.execute(node_sql, _beat_params(beats))
        nodes = cursor.fetchall()
        landed = {node_id for node_id, _, moved, _ in nodes if moved}
        agents: list[tuple[int, bool, bool]] = []
        if landed:
            cursor.execute(agent_sql, _beat_params([beat for beat in beats if beat[0] in landed]))
            agents = cursor.fetchall()
    lost = [node_id for node_id, state, moved, _ in nodes if moved and state == Node.State.LOST]
    # A node deleted since its fingerprint was made (the delete forgets it too): no shortcut for it.
    gone = [node_id for node_id, _, _, present in nodes if not present]
    held = [node_id for node_id, _, moved, present in nodes if present and not moved]
    held += [node_id for node_id, moved, present in agents if present and not moved]
    return len(landed), lost + gone, held


def _beat_params(beats: list[tuple[int, list[bytes | None]]]) -> dict[str, Any]:
    return {
        "ids": [node_id for node_id, _ in beats],
        "at": [datetime.fromtimestamp(float(row[0] or 0), tz=UTC) for _, row in beats],
        "sent": [_num(row[1]) for _, row in beats],
        "gap": [_num(row[2]) for _, row in beats],
        "raw": [_num(row[3]) for _, row in beats],
        "applied": [int(row[4] or 0) for _, row in beats],
        "creep": OFFSET_CREEP,
    }


def _store_telemetry(entries: list[dict[str, Any]]) -> int:
    """The queued telemetry of many nodes: one multi-row INSERT of GPU samples (the GPUs matched by the
    node's own UUIDs, as the full way does) and the task-process samples of tasks each node was given."""
    by_node: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for entry in entries:
        by_node[int(entry["node"])].append(entry)
    gpus: dict[int, dict[str, Gpu]] = defaultdict(dict)
    for gpu in Gpu.objects.filter(node_id__in=list(by_node)).only("pk", "uuid", "node_id"):
        gpus[gpu.node_id][gpu.uuid] = gpu
    batch = []
    for node_id, node_entries in by_node.items():
        for entry in node_entries:
            decoded = _decoded(entry)
            if decoded is None:
                log.warning("node %s: malformed telemetry from the heartbeat shortcut dropped", node_id)
                continue
            telemetry, processes = decoded
            at = datetime.fromtimestamp(float(entry["at"]), tz=UTC)
            batch.append((node_id, at, telemetry, processes))
    samples_store_batch(batch=batch, gpus=gpus)
    return len(batch)


def _decoded(
    entry: dict[str, Any],
) -> tuple[tuple[p.TelemetrySample, ...], tuple[p.ProcessSample, ...]] | None:
    """The samples of a queued entry as the full way would decode them, or None if it would refuse them
    (a sample that does not decode, or a number beyond the 64-bit columns). The samples are in the
    heartbeat's body (`body`), or beside it in an entry queued by an earlier version of the plane."""
    source = entry.get("body", entry)
    try:
        raw = {"telemetry": source.get("telemetry", []), "processes": source.get("processes", [])}
        telemetry = tuple(p.TelemetrySample.from_dict(item) for item in raw["telemetry"])
        processes = tuple(p.ProcessSample.from_dict(item) for item in raw["processes"])
    except (p.ProtocolError, TypeError, ValueError, KeyError, AttributeError):
        return None
    if p.wire_problem(raw) is not None:
        return None
    return telemetry, processes
