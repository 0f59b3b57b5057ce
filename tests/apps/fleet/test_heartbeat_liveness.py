"""Heartbeats that change nothing, recorded in Redis and flushed to PostgreSQL in batches
(`apps.fleet.liveness`, docs/fleet.md "Heartbeat load"): real Redis (REDIS_URL) and PostgreSQL."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.fleet.test_heartbeat_front import front
from whalegen import protocol as p

pytestmark = pytest.mark.django_db


def inventory(node: Any) -> tuple[p.GpuInventory, ...]:
    return tuple(
        p.GpuInventory(gpu.index, gpu.uuid, "H100", gpu.model, 81_559, f"0000:0{gpu.index}:00.0", False)
        for gpu in node.gpus.order_by("index")
    )


def message(node: Any, *, sent_at_s: float | None = None, **fields: Any) -> p.Heartbeat:
    fields.setdefault("inventory", inventory(node))
    fields.setdefault("running", ())
    return p.Heartbeat(
        node_id=str(node.pk), agent_version="0.1", sent_at_s=sent_at_s or time.time(), **fields
    )


def body(message: p.Heartbeat) -> bytes:
    return json.dumps(message.to_dict()).encode()


def telemetry(node: Any) -> tuple[p.TelemetrySample, ...]:
    return tuple(
        p.TelemetrySample(gpu.uuid, time.time(), 1024, 81_559, 37, 12, 140.0, 350.0, 55, 1800, 9000, 0)
        for gpu in node.gpus.order_by("index")
    )


@pytest.fixture
def redis_on(settings: Any) -> None:
    assert settings.REDIS_URL, "these tests need the real Redis (REDIS_URL)"
    settings.WHALEGEN_HEARTBEAT_REDIS = True


def test_a_heartbeat_that_changes_nothing_skips_postgresql_until_the_flush(
    fleet: Any, redis_on: None, django_assert_num_queries: Any
) -> None:
    from apps.fleet import liveness
    from apps.fleet.models import NodeAgent

    sent = time.time() - 20
    assert front(fleet.token_a, body(message(fleet.node, sent_at_s=sent)))[0] == 200  # the full way
    fleet.node.refresh_from_db()
    first_seen = fleet.node.last_heartbeat_at
    second = body(message(fleet.node, sent_at_s=sent + 10))
    with django_assert_num_queries(0):
        status, answered, _ = front(fleet.token_a, second)
    assert status == 200
    assert answered == p.HeartbeatAck(generation=NodeAgent.objects.get(pk=fleet.node.pk).generation).to_dict()
    fleet.node.refresh_from_db()
    assert fleet.node.last_heartbeat_at == first_seen  # in Redis only, so far
    flushed = liveness.flush()
    assert (flushed.nodes, flushed.lost_forgotten) == (1, 0)
    fleet.node.refresh_from_db()
    assert fleet.node.last_heartbeat_at > first_seen
    agent = NodeAgent.objects.get(pk=fleet.node.pk)
    assert agent.last_sent_s == pytest.approx(sent + 10)
    assert agent.heartbeat_gap_s == pytest.approx(10.0)
    assert liveness.flush().nodes == 0  # nothing new since


def test_a_web_process_that_has_not_seen_the_credential_takes_the_shortcut_after_one_lookup(
    fleet: Any, redis_on: None, django_assert_num_queries: Any
) -> None:
    """Each web process has its own credential memory: a heartbeat landing on another process than the
    one that left the fingerprint costs one indexed lookup, not a transaction."""
    from apps.fleet.credentials import credentials

    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # the full way
    credentials._entries.clear()  # as another web process would be
    again = body(message(fleet.node))
    with django_assert_num_queries(1):
        assert front(fleet.token_a, again)[0] == 200


@pytest.mark.parametrize("change", ["inventory", "running", "agent version", "event"])
def test_a_heartbeat_that_changes_something_takes_the_full_way(
    fleet: Any, redis_on: None, change: str
) -> None:
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # shortcut
    before = fleet.node.__class__.objects.get(pk=fleet.node.pk).last_heartbeat_at
    if change == "inventory":
        changed = message(fleet.node, inventory=inventory(fleet.node)[:1])
    elif change == "running":
        changed = message(fleet.node, running=(p.RunningTask(task_id="999", attempt=1, pid=4),))
    elif change == "agent version":
        changed = p.Heartbeat(node_id=str(fleet.node.pk), agent_version="0.2", sent_at_s=time.time(),
                              inventory=inventory(fleet.node), running=())  # fmt: skip
    else:
        uuid = inventory(fleet.node)[1].uuid
        event = p.GpuEvent(gpu_uuid=uuid, kind="xid", xid=13, at_s=time.time())
        changed = message(fleet.node, events=(event,))
    assert front(fleet.token_a, body(changed))[0] == 200
    assert fleet.node.__class__.objects.get(pk=fleet.node.pk).last_heartbeat_at > before


def test_runs_the_plane_believes_alive_but_the_agent_does_not_list_keep_the_full_way(
    fleet: Any, redis_on: None
) -> None:
    """Dropped-run detection needs every heartbeat that lists fewer runs than the plane believes alive
    (it stamps `missing_since`): such a heartbeat never leaves a fingerprint."""
    from apps.fleet.models import TaskRun
    from apps.inventory.models import Node

    TaskRun.objects.create(node=fleet.node, task=fleet.task_a, attempt=0, state=TaskRun.State.RUNNING)
    seen = []
    for _ in range(2):
        assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
        seen.append(Node.objects.get(pk=fleet.node.pk).last_heartbeat_at)
    assert seen[1] > seen[0]  # both the full way
    assert TaskRun.objects.get(node=fleet.node, task=fleet.task_a).missing_since is not None
    # Listed, the run and the plane agree: the next heartbeat may take the shortcut.
    listed = message(fleet.node, running=(p.RunningTask(task_id=str(fleet.task_a.pk), attempt=0),))
    assert front(fleet.token_a, body(listed))[0] == 200
    assert TaskRun.objects.get(node=fleet.node, task=fleet.task_a).missing_since is None
    before = Node.objects.get(pk=fleet.node.pk).last_heartbeat_at
    assert front(fleet.token_a, body(listed))[0] == 200
    assert Node.objects.get(pk=fleet.node.pk).last_heartbeat_at == before  # in Redis


def test_a_lost_node_comes_back_the_full_way(
    fleet: Any, redis_on: None, django_capture_on_commit_callbacks: Any
) -> None:
    from apps.fleet.nodes import _node_lose
    from apps.inventory.models import Node

    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    node = Node.objects.get(pk=fleet.node.pk)
    with django_capture_on_commit_callbacks(execute=True):
        assert _node_lose(node=node, now=timezone.now(), reason="test", expect=node)
    assert Node.objects.get(pk=node.pk).state == Node.State.LOST
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    assert Node.objects.get(pk=node.pk).state == Node.State.READY


def test_the_flush_sends_a_lost_node_heard_in_redis_back_the_full_way(fleet: Any, redis_on: None) -> None:
    """A node lost between its fingerprint and its next beat (the check's commit raced the beat): the
    flush finds it lost, drops the fingerprint, and the next heartbeat brings it back."""
    from apps.fleet import liveness
    from apps.inventory.models import Node

    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    Node.objects.filter(pk=fleet.node.pk).update(state=Node.State.LOST, state_before_lost=Node.State.READY)
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # still the shortcut
    assert Node.objects.get(pk=fleet.node.pk).state == Node.State.LOST
    assert liveness.flush().lost_forgotten == 1
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    assert Node.objects.get(pk=fleet.node.pk).state == Node.State.READY


def test_a_replaced_credential_is_refused_although_a_process_remembers_its_node(
    fleet: Any, redis_on: None, settings: Any
) -> None:
    """Another process still remembers the old credential's node (its memory is per process): the
    shortcut does not take it, because the fingerprint in Redis was made with the old credential and
    `node_token_issue` dropped it for every process."""
    from apps.fleet.credentials import KnownNode, credentials
    from apps.fleet.nodes import node_token_issue
    from apps.fleet.selectors import credential_hash

    settings.WHALEGEN_AUTH_CACHE_S = 0.0  # the full way looks the credential up every time
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # shortcut
    fresh = node_token_issue(node=fleet.node)
    old = credential_hash(fleet.token_a)
    credentials._entries[old] = KnownNode(fleet.node.pk, fleet.node.name, old, time.monotonic())
    status, answered, _ = front(fleet.token_a, body(message(fleet.node)))
    assert (status, answered["detail"]) == (401, "unknown node token")
    assert front(fresh, body(message(fleet.node)))[0] == 200


def test_telemetry_of_the_shortcut_is_stored_by_the_flush(fleet: Any, redis_on: None, settings: Any) -> None:
    from apps.fleet import liveness
    from apps.fleet.models import GpuSample

    settings.WHALEGEN_TELEMETRY_SAMPLE_S = 0.0  # due on every heartbeat
    assert front(fleet.token_a, body(message(fleet.node, telemetry=telemetry(fleet.node))))[0] == 200
    stored = GpuSample.objects.filter(gpu__node=fleet.node).count()
    assert stored == 2  # the full way, at once
    for _ in range(2):
        assert front(fleet.token_a, body(message(fleet.node, telemetry=telemetry(fleet.node))))[0] == 200
    assert GpuSample.objects.filter(gpu__node=fleet.node).count() == stored
    assert liveness.flush().telemetry == 2
    assert GpuSample.objects.filter(gpu__node=fleet.node).count() == stored + 4


def test_telemetry_is_queued_once_per_sample_period(fleet: Any, redis_on: None, settings: Any) -> None:
    from apps.fleet import liveness

    settings.WHALEGEN_TELEMETRY_SAMPLE_S = 3600.0
    for _ in range(3):
        assert front(fleet.token_a, body(message(fleet.node, telemetry=telemetry(fleet.node))))[0] == 200
    assert liveness.flush().telemetry == 0  # stored by the first (full) heartbeat; not due again


def test_telemetry_in_a_body_that_is_not_utf8_text_is_stored_by_the_flush(
    fleet: Any, redis_on: None, settings: Any
) -> None:
    """The shortcut queues the body as received, which only nests in the entry as UTF-8 JSON text;
    `json.loads` also reads UTF-16, whose samples are re-encoded instead."""
    from apps.fleet import liveness
    from apps.fleet.models import GpuSample

    settings.WHALEGEN_TELEMETRY_SAMPLE_S = 0.0
    utf16 = json.dumps(message(fleet.node, telemetry=telemetry(fleet.node)).to_dict()).encode("utf-16-le")
    assert front(fleet.token_a, utf16)[0] == 200  # the full way
    stored = GpuSample.objects.filter(gpu__node=fleet.node).count()
    utf16 = json.dumps(message(fleet.node, telemetry=telemetry(fleet.node)).to_dict()).encode("utf-16-le")
    assert front(fleet.token_a, utf16)[0] == 200  # the shortcut
    assert liveness.flush().telemetry == 1
    assert GpuSample.objects.filter(gpu__node=fleet.node).count() == stored + 2


def test_telemetry_queued_by_an_earlier_plane_is_still_stored(fleet: Any, redis_on: None) -> None:
    """An entry in the earlier form (the samples beside the node, not the body) left in Redis across an
    upgrade."""
    from apps.fleet import liveness
    from apps.fleet.models import GpuSample

    samples = [sample.to_dict() for sample in telemetry(fleet.node)]
    earlier = {"node": fleet.node.pk, "at": time.time(), "telemetry": samples, "processes": []}
    client = liveness._redis.client()
    assert client is not None
    client.rpush(liveness.telemetry_key(), json.dumps(earlier))
    assert liveness.flush().telemetry == 1
    assert GpuSample.objects.filter(gpu__node=fleet.node).count() == 2


def test_the_shortcut_loads_its_script_again_after_redis_lost_it(
    fleet: Any, redis_on: None, django_assert_num_queries: Any
) -> None:
    """A Redis restarted without its scripts (or SCRIPT FLUSH) answers NOSCRIPT: the beat loads the
    script and is still recorded in Redis, not sent the full way."""
    from apps.fleet import liveness

    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # the full way
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # the shortcut, script loaded
    client = liveness._redis.client()
    assert client is not None
    client.script_flush()
    again = body(message(fleet.node))
    with django_assert_num_queries(0):
        assert front(fleet.token_a, again)[0] == 200
    assert liveness.flush().nodes == 1


def test_a_beat_sent_before_the_last_one_keeps_the_later_send_time(fleet: Any, redis_on: None) -> None:
    """Beats can arrive out of order (two connections, a retry): the send time and gap only move forward."""
    from apps.fleet import liveness
    from apps.fleet.models import NodeAgent

    sent = time.time() - 30
    assert front(fleet.token_a, body(message(fleet.node, sent_at_s=sent)))[0] == 200  # the full way
    assert front(fleet.token_a, body(message(fleet.node, sent_at_s=sent + 20)))[0] == 200
    assert front(fleet.token_a, body(message(fleet.node, sent_at_s=sent + 10)))[0] == 200  # late
    assert liveness.flush().nodes == 1
    agent = NodeAgent.objects.get(pk=fleet.node.pk)
    assert agent.last_sent_s == pytest.approx(sent + 20)
    assert agent.heartbeat_gap_s == pytest.approx(20.0)


def test_the_node_health_check_counts_heartbeats_held_in_redis(fleet: Any, redis_on: None) -> None:
    from apps.fleet.nodes import nodes_mark_lost
    from apps.inventory.models import Node

    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    assert front(fleet.token_b, body(message(fleet.node_b)))[0] == 200
    long_ago = timezone.now() - timedelta(hours=1)
    # Node A's row says silent for an hour; its latest heartbeat went to Redis only.
    Node.objects.filter(pk=fleet.node.pk).update(last_heartbeat_at=long_ago)
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    lost = nodes_mark_lost()
    assert fleet.node.pk not in lost
    assert Node.objects.get(pk=fleet.node.pk).state != Node.State.LOST
    # The control: the same silence with nothing in Redis is a loss.
    Node.objects.filter(pk=fleet.node.pk).update(last_heartbeat_at=long_ago)
    assert fleet.node.pk in nodes_mark_lost()


def test_a_flush_postgresql_refuses_declares_nobody_lost_and_keeps_the_beats(
    fleet: Any, redis_on: None, monkeypatch: Any
) -> None:
    from django.db import DatabaseError

    from apps.fleet import liveness
    from apps.fleet.nodes import nodes_mark_lost
    from apps.inventory.models import Node

    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
    assert front(fleet.token_b, body(message(fleet.node_b)))[0] == 200
    Node.objects.filter(pk=fleet.node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert front(fleet.token_a, body(message(fleet.node)))[0] == 200  # in Redis only
    real = liveness._flush_beats

    def refused(*args: Any) -> Any:
        raise DatabaseError("deadlock detected (injected)")

    monkeypatch.setattr(liveness, "_flush_beats", refused)
    assert nodes_mark_lost() == []
    assert Node.objects.get(pk=fleet.node.pk).state != Node.State.LOST
    monkeypatch.setattr(liveness, "_flush_beats", real)
    assert fleet.node.pk not in nodes_mark_lost()  # the kept beat arrived with the next flush
    assert Node.objects.get(pk=fleet.node.pk).state != Node.State.LOST


@pytest.mark.parametrize("without", ["switched off", "no REDIS_URL (the embedded default)"])
def test_without_redis_every_heartbeat_is_a_transaction(fleet: Any, settings: Any, without: str) -> None:
    from apps.fleet import liveness

    if without == "switched off":
        settings.WHALEGEN_HEARTBEAT_REDIS = False
    else:
        settings.REDIS_URL = None
        liveness._redis.reset()
    seen = []
    for _ in range(2):
        assert front(fleet.token_a, body(message(fleet.node)))[0] == 200
        fleet.node.refresh_from_db()
        seen.append(fleet.node.last_heartbeat_at)
    assert seen[1] > seen[0]
    assert liveness.flush().nodes == 0
