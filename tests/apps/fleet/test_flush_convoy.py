"""The report/flush lock convoy (docs/notes/agent-fleet.md, run 3): a report transaction holding its
node's row must not stop the node-health flush, nor, through it, the reports of other nodes. Real
PostgreSQL and Redis, each party on its own connection and thread; waits have generous deadlines and
nothing is timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.apps.fleet.test_heartbeat_front import front
from tests.apps.fleet.test_heartbeat_liveness import body, message

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE_S = 30.0


@pytest.fixture
def redis_on(settings: Any) -> None:
    assert settings.REDIS_URL, "these tests need the real Redis (REDIS_URL)"
    settings.WHALEGEN_HEARTBEAT_REDIS = True


def in_thread(
    work: Callable[[], Any], errors: list[BaseException]
) -> tuple[threading.Thread, threading.Event]:
    """Start `work` on its own thread and database connection; the event is set when it returned."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
            done.set()
        except BaseException as error:  # reported to the test, which fails on it
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


@pytest.fixture
def report_open(fleet: Any) -> Iterator[Callable[[Any], Callable[[], None]]]:
    """`report_open(node)` holds `node`'s row as a report's transaction does (`agent_report`'s own lock,
    `node_lock`) on another connection; returns once the lock is held, with the call that commits it."""
    release = threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def hold(node: Any) -> Callable[[], None]:
        from apps.fleet.reports import node_lock

        holding = threading.Event()

        def work() -> None:
            with transaction.atomic():
                node_lock(node)
                holding.set()
                assert release.wait(DEADLINE_S * 4), "the test never let the report go"

        thread, _ = in_thread(work, errors)
        threads.append(thread)
        assert holding.wait(DEADLINE_S), f"the report transaction never locked its node: {errors}"

        def commit() -> None:
            release.set()
            thread.join(DEADLINE_S)
            assert not thread.is_alive(), "the report transaction did not end"

        return commit

    yield hold
    release.set()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert not errors, errors


def beat_twice(node: Any, token: str, sent_s: float) -> None:
    """A heartbeat the full way, then one that changes nothing: recorded in Redis only, node dirty."""
    assert front(token, body(message(node, sent_at_s=sent_s)))[0] == 200
    assert front(token, body(message(node, sent_at_s=sent_s + 10)))[0] == 200


def report_on(node: Any) -> None:
    from apps.fleet.reports import agent_report
    from whalegen import protocol as p

    agent_report(node=node, message=p.Report(node_id=str(node.pk), seq=1, sent_at_s=time.time()))


def test_a_flush_skips_a_node_a_report_holds_and_other_nodes_reports_do_not_wait(
    fleet: Any, redis_on: None, report_open: Callable[[Any], Callable[[], None]]
) -> None:
    from apps.fleet import liveness
    from apps.fleet.models import AgentReport
    from apps.inventory.models import Node

    low, high = sorted([fleet.node, fleet.node_b], key=lambda node: node.pk)
    tokens = {fleet.node.pk: fleet.token_a, fleet.node_b.pk: fleet.token_b}
    sent = time.time() - 20
    for node in (low, high):
        beat_twice(node, tokens[node.pk], sent)
    before = {node.pk: Node.objects.get(pk=node.pk).last_heartbeat_at for node in (low, high)}

    release = report_open(high)  # the higher-id node: the old flush locked `low` before waiting on it
    errors: list[BaseException] = []
    flushed: list[liveness.FlushResult] = []
    flush_thread, flush_done = in_thread(lambda: flushed.append(liveness.flush()), errors)
    # Give a flush that waits time to take `low` and queue on `high` before the report on `low` comes.
    flush_done.wait(2.0)
    report_thread, report_done = in_thread(lambda: report_on(low), errors)

    assert flush_done.wait(DEADLINE_S) or errors, "the flush waited on the node a report holds"
    assert report_done.wait(DEADLINE_S) or errors, "a report on another node waited behind the flush"
    assert not errors, errors
    (result,) = flushed
    assert (result.nodes, result.held, result.complete) == (1, frozenset({high.pk}), True)
    assert AgentReport.objects.filter(node=low, seq=1).exists()
    assert Node.objects.get(pk=low.pk).last_heartbeat_at > before[low.pk]
    assert Node.objects.get(pk=high.pk).last_heartbeat_at == before[high.pk]  # still in Redis only

    release()
    for thread in (flush_thread, report_thread):
        thread.join(DEADLINE_S)
    later = liveness.flush()  # the held beat was left dirty: the next flush lands it
    assert (later.nodes, later.held) == (1, frozenset())
    assert Node.objects.get(pk=high.pk).last_heartbeat_at > before[high.pk]


def test_a_node_whose_beat_a_report_held_back_is_not_marked_lost(
    fleet: Any, redis_on: None, report_open: Callable[[Any], Callable[[], None]], settings: Any
) -> None:
    """Its row says silent past the threshold, but it beat since the last flush (the beat waits in
    Redis): the node-health check neither waits on its row nor marks it lost."""
    from apps.fleet.nodes import nodes_mark_lost
    from apps.inventory.models import Node

    low, high = sorted([fleet.node, fleet.node_b], key=lambda node: node.pk)
    tokens = {fleet.node.pk: fleet.token_a, fleet.node_b.pk: fleet.token_b}
    sent = time.time() - 20
    for node in (low, high):
        beat_twice(node, tokens[node.pk], sent)
    # Its last beat to reach the row is long past the lost threshold; the one in Redis is fresh.
    silent_since = timezone.now() - timedelta(hours=1)
    Node.objects.filter(pk=high.pk).update(last_heartbeat_at=silent_since)
    Node.objects.exclude(pk__in=[low.pk, high.pk]).update(created_at=timezone.now())

    release = report_open(high)
    errors: list[BaseException] = []
    marked: list[list[int]] = []
    _, checked = in_thread(lambda: marked.append(nodes_mark_lost()), errors)
    assert checked.wait(DEADLINE_S), "the node-health check waited on the node a report holds"
    assert not errors, errors
    assert high.pk not in marked[0]
    high.refresh_from_db()
    assert high.state != Node.State.LOST

    release()
    assert nodes_mark_lost() == []  # the beat lands now, and the node is still not lost
    high.refresh_from_db()
    assert high.state != Node.State.LOST
    assert high.last_heartbeat_at > silent_since
