"""Run output on the plane: agents write it with their reports, users read it with the task's rules."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.apps.fleet.conftest import assign
from whalegen import protocol as p

pytestmark = pytest.mark.django_db

OUT, ERR = p.LogStreamName.STDOUT, p.LogStreamName.STDERR


def lines(first: int, count: int, stream: p.LogStreamName = OUT) -> tuple[p.LogLine, ...]:
    return tuple(p.LogLine(time.time(), stream, f"line {n}") for n in range(first, first + count))


def chunk(task: Any, first: int, count: int, attempt: int = 0, **fields: Any) -> p.LogChunk:
    return p.LogChunk(str(task.pk), attempt, first, lines(first, count), **fields)


def report(client: Any, node: Any, seq: int, *, tasks: tuple = (), logs: tuple = ()) -> Any:
    body = p.Report(node_id=str(node.pk), seq=seq, sent_at_s=time.time(), tasks=tasks, logs=logs)
    return client.post(p.REPORT_PATH, body.to_dict(), format="json")


def running(task: Any, attempt: int = 0) -> p.TaskReport:
    return p.TaskReport(str(task.pk), p.TaskState.RUNNING, time.time(), pid=42, attempt=attempt)


def ended(task: Any, code: int) -> p.TaskReport:
    state = p.TaskState.SUCCEEDED if code == 0 else p.TaskState.FAILED
    return p.TaskReport(str(task.pk), state, time.time(), exit_code=code)


@pytest.fixture
def started(fleet: Any, agent_client: Any) -> Any:
    """task_a assigned to node A, whose agent reported it running."""
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    fleet.agent = agent_client(fleet.token_a)
    assert report(fleet.agent, fleet.node, 1, tasks=(running(fleet.task_a),)).status_code == 200
    return fleet


def read(api: Any, user: Any, task: Any, **params: Any) -> Any:
    return api(user).get(f"/api/v1/tasks/{task.pk}/logs/", params)


def test_output_arrives_in_order_once_even_when_chunks_are_resent_or_overlap(started: Any, api: Any) -> None:
    f = started
    assert report(f.agent, f.node, 2, logs=(chunk(f.task_a, 0, 3),)).status_code == 200
    assert report(f.agent, f.node, 2, logs=(chunk(f.task_a, 0, 3),)).status_code == 200  # a resent seq
    # The agent re-read from an older cursor after a crash: lines 1-2 again, then 3-4 new.
    assert report(f.agent, f.node, 3, logs=(chunk(f.task_a, 1, 4),)).status_code == 200
    page = read(api, f.alice, f.task_a).json()
    assert [line["text"] for line in page["lines"]] == [f"line {n}" for n in range(5)]
    assert page["next_offset"] == 5 and page["complete"] is False and page["task_state"] == "running"
    assert [line["text"] for line in read(api, f.alice, f.task_a, offset=3, limit=1).json()["lines"]] == [
        "line 3"
    ]
    assert [line["n"] for line in read(api, f.alice, f.task_a, tail=2).json()["lines"]] == [3, 4]


def test_the_output_is_complete_when_the_run_ended_with_everything_it_printed(started: Any, api: Any) -> None:
    f = started
    eof = p.LogChunk(str(f.task_a.pk), 0, 2, (p.LogLine(time.time(), ERR, "boom"),), eof=True)
    answer = report(f.agent, f.node, 2, tasks=(ended(f.task_a, 3),), logs=(chunk(f.task_a, 0, 2), eof))
    assert answer.status_code == 200
    page = read(api, f.vic, f.task_a).json()  # a viewer of the tenant reads it too
    assert [(line["stream"], line["text"]) for line in page["lines"]] == [
        ("stdout", "line 0"),
        ("stdout", "line 1"),
        ("stderr", "boom"),
    ]
    assert page["complete"] is True and page["task_state"] == "failed" and page["exit_code"] == 3


def test_another_tenant_gets_404_like_for_the_task(started: Any, api: Any) -> None:
    report(started.agent, started.node, 2, logs=(chunk(started.task_a, 0, 2),))
    assert read(api, started.bob, started.task_a).status_code == 404
    assert read(api, started.eve, started.task_a).status_code == 404
    assert read(api, started.root, started.task_a).status_code == 200


def test_a_node_cannot_write_the_output_of_another_nodes_run(
    started: Any, agent_client: Any, api: Any
) -> None:
    f = started
    other = agent_client(f.token_b)
    answer = report(other, f.node_b, 1, logs=(chunk(f.task_a, 0, 2),))
    assert answer.status_code == 403 and "not a run of node" in str(answer.json())
    # Nor one of its own node's tasks' runs it never reported (attempt 1 does not exist yet).
    answer = report(f.agent, f.node, 2, logs=(chunk(f.task_a, 0, 2, attempt=1),))
    assert answer.status_code == 403
    assert read(api, f.alice, f.task_a).json()["lines"] == []


def test_attempts_are_kept_apart(started: Any, api: Any) -> None:
    from apps.fleet.runs import task_requeue
    from apps.workloads.models import Task

    f = started
    report(f.agent, f.node, 2, logs=(chunk(f.task_a, 0, 2),))
    task = Task.objects.get(pk=f.task_a.pk)
    task_requeue(task, via=Task.State.LOST, actor="test", reason="node lost (test)")
    task.refresh_from_db()
    assign(task, f.node, [f.whole_unit])
    report(f.agent, f.node, 3, tasks=(running(task, attempt=1),))
    second = p.LogChunk(str(task.pk), 1, 0, (p.LogLine(time.time(), OUT, "second run"),))
    assert report(f.agent, f.node, 4, logs=(second,)).status_code == 200
    current = read(api, f.alice, task).json()
    assert current["attempt"] == 1 and current["attempts"] == [0, 1]
    assert [line["text"] for line in current["lines"]] == ["second run"]
    first = read(api, f.alice, task, attempt=0).json()
    assert [line["text"] for line in first["lines"]] == ["line 0", "line 1"]
    # Its process may still print while the agent stops it: complete once the agent says it ended.
    assert first["complete"] is False
    stopped = p.TaskReport(str(task.pk), p.TaskState.STOPPED, time.time(), attempt=0)
    report(f.agent, f.node, 5, tasks=(stopped,), logs=(p.LogChunk(str(task.pk), 0, 2, eof=True),))
    assert read(api, f.alice, task, attempt=0).json()["complete"] is True


def test_the_plane_keeps_the_head_and_the_latest_tail_and_says_what_it_dropped(
    started: Any, api: Any, settings: Any
) -> None:
    f = started
    settings.WHALEGEN_LOG_CAP_MIB = 600 / (1 << 20)  # 600 bytes: 300 of head, the rest the latest
    seq = 2
    for first in range(0, 200, 10):  # 200 lines of 6-7 bytes in chunks of 10 (about 70 bytes each)
        report(f.agent, f.node, seq, logs=(chunk(f.task_a, first, 10),))
        seq += 1
    page = read(api, f.alice, f.task_a, limit=10_000).json()
    texts = [line["text"] for line in page["lines"]]
    assert texts[:3] == ["line 0", "line 1", "line 2"] and texts[-1] == "line 199"
    (gap,) = [line for line in page["lines"] if line["stream"] == "dropped"]
    kept = [line for line in page["lines"] if line["stream"] == "stdout"]
    assert len(kept) + gap["dropped_lines"] == 200 and page["dropped_lines"] == gap["dropped_lines"]
    assert gap["dropped_bytes"] == sum(
        len(f"line {n}") for n in range(gap["n"], gap["n"] + gap["dropped_lines"])
    )


def test_an_agents_own_dropped_lines_are_shown_where_they_were(started: Any, api: Any) -> None:
    f = started
    report(
        f.agent,
        f.node,
        2,
        logs=(chunk(f.task_a, 0, 2), chunk(f.task_a, 50, 1, dropped_lines=48, dropped_bytes=999)),
    )
    page = read(api, f.alice, f.task_a).json()
    assert [(line["n"], line["stream"]) for line in page["lines"]] == [
        (0, "stdout"),
        (1, "stdout"),
        (2, "dropped"),
        (50, "stdout"),
    ]
    assert page["lines"][2]["dropped_bytes"] == 999


def test_follow_waits_while_the_run_may_print_and_not_once_it_is_complete(started: Any, api: Any) -> None:
    f = started
    report(f.agent, f.node, 2, logs=(chunk(f.task_a, 0, 1),))
    began = time.monotonic()
    page = read(api, f.alice, f.task_a, offset=1, follow="true", wait_s=0.6).json()
    assert page["lines"] == [] and page["complete"] is False and time.monotonic() - began >= 0.6
    assert read(api, f.alice, f.task_a, offset=0, follow="true", wait_s=5).json()["next_offset"] == 1
    report(
        f.agent, f.node, 3, tasks=(ended(f.task_a, 0),), logs=(p.LogChunk(str(f.task_a.pk), 0, 1, eof=True),)
    )
    began = time.monotonic()
    page = read(api, f.alice, f.task_a, offset=1, follow="true", wait_s=5).json()
    assert page["complete"] is True and time.monotonic() - began < 2  # the end, not a timeout


def test_bad_query_parameters_are_a_400_that_names_them(started: Any, api: Any) -> None:
    answer = read(api, started.alice, started.task_a, offset=-1, limit=0)
    assert answer.status_code == 400 and {"offset", "limit"} <= set(answer.json())
    answer = read(api, started.alice, started.task_a, tail=5, follow="true")
    assert answer.status_code == 400 and "tail" in answer.json()


def test_retention_deletes_the_output_of_tasks_that_ended_long_ago(started: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.logs.models import LogChunk, LogStream
    from apps.logs.services import logs_expire
    from apps.workloads.models import Task

    f = started
    report(f.agent, f.node, 2, tasks=(ended(f.task_a, 0),), logs=(chunk(f.task_a, 0, 3, eof=True),))
    settings.WHALEGEN_LOG_RETENTION_DAYS = 7
    assert logs_expire(now=timezone.now() + timedelta(days=6)) == 0
    assert LogChunk.objects.count() == 1
    assert Task.objects.get(pk=f.task_a.pk).finished_at is not None
    assert logs_expire(now=timezone.now() + timedelta(days=8)) == 1
    assert not LogStream.objects.exists() and not LogChunk.objects.exists()
