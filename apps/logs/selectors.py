"""Reads of run output: a page of a run's lines from a line number (or its tail), and whether more
can still come."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.fleet.models import TaskRun
from apps.logs.models import LogChunk, LogStream
from apps.workloads.models import Task, TaskEvent
from apps.workloads.state_machine import FINAL

# A final task whose run never said "that is all" (its node was lost) stops being followed after this.
FOLLOW_GRACE = timedelta(seconds=60)


@dataclass(frozen=True)
class LogPage:
    task: Task
    attempt: int
    attempts: list[int]  # the attempts that have output
    offset: int
    next_offset: int
    lines: list[dict[str, Any]]
    complete: bool  # nothing more will come for this attempt
    dropped_lines: int
    dropped_bytes: int


def task_log_page(*, task: Task, attempt: int | None, offset: int, limit: int, tail: int | None) -> LogPage:
    """Lines `offset` … of one attempt (the task's current one by default), at most `limit`, with a
    `dropped` entry where a cap cut the output; `tail` instead asks for the last `tail` lines."""
    attempt = task.attempts if attempt is None else attempt
    stream = LogStream.objects.filter(task=task, attempt=attempt).first()
    lines: list[dict[str, Any]] = []
    next_offset = offset
    if stream is not None:
        if tail is not None:
            offset = _tail_offset(stream, tail)
        chunks = LogChunk.objects.filter(stream=stream, end_line__gt=offset).order_by("first_line")
        for chunk in chunks.iterator(chunk_size=50):
            if len(lines) >= limit:
                break
            if chunk.dropped_lines and chunk.first_line >= offset:
                lines.append(
                    {
                        "n": chunk.first_line - chunk.dropped_lines,
                        "at": None,
                        "stream": "dropped",
                        "text": f"… {chunk.dropped_lines} lines ({chunk.dropped_bytes} bytes) dropped by the "
                        "output cap …",
                        "partial": False,
                        "dropped_lines": chunk.dropped_lines,
                        "dropped_bytes": chunk.dropped_bytes,
                    }
                )
            start = max(offset, chunk.first_line) - chunk.first_line
            numbered = enumerate(chunk.lines[start:], start=chunk.first_line + start)
            for i, (at_s, name, text, partial) in numbered:
                if len(lines) >= limit:
                    break
                lines.append({"n": i, "at": at_s, "stream": name, "text": text, "partial": partial})
                next_offset = i + 1
    attempts = sorted(LogStream.objects.filter(task=task).values_list("attempt", flat=True))
    return LogPage(
        task=task,
        attempt=attempt,
        attempts=attempts,
        offset=offset,
        next_offset=max(next_offset, offset),
        lines=lines,
        complete=_complete(task, attempt, stream) and (stream is None or next_offset >= stream.next_line),
        dropped_lines=stream.dropped_lines if stream else 0,
        dropped_bytes=stream.dropped_bytes if stream else 0,
    )


def task_end_reasons(*, task_ids: list[int]) -> dict[int, str]:
    """Why each of these tasks ended failed or cancelled: the reason of its last such event (one query
    for a whole page of tasks)."""
    ended = [Task.State.FAILED, Task.State.CANCELLED]
    events = TaskEvent.objects.filter(task_id__in=task_ids, to_state__in=ended)
    reasons: dict[int, str] = {}
    for task_id, reason in events.order_by("created_at", "id").values_list("task_id", "reason"):
        reasons[task_id] = reason
    return reasons


def _tail_offset(stream: LogStream, tail: int) -> int:
    """The line number `tail` lines before the end (over stored chunks; a gap counts as nothing)."""
    wanted = tail
    for chunk in LogChunk.objects.filter(stream=stream).order_by("-first_line").iterator(chunk_size=50):
        size = chunk.end_line - chunk.first_line
        if size >= wanted:
            return chunk.end_line - wanted
        wanted -= size
    return 0


def _complete(task: Task, attempt: int, stream: LogStream | None) -> bool:
    """No more output will come: the agent said so, or the run is over with no run left to say it."""
    if stream is not None and stream.eof:
        return True
    final = task.state in FINAL
    if not final and attempt >= task.attempts:
        return False
    if not TaskRun.objects.filter(task=task, attempt=attempt, state__in=TaskRun.ALIVE).exists():
        return True
    return final and task.finished_at is not None and timezone.now() - task.finished_at > FOLLOW_GRACE


def task_log_wait(
    *, task: Task, attempt: int | None, offset: int, limit: int, wait_s: float, step_s: float = 0.25
) -> LogPage:
    """Long poll: the page as soon as it has lines or the attempt is complete, else after `wait_s`
    (capped at 30 s) with none."""
    deadline = time.monotonic() + max(0.0, min(wait_s, 30.0))
    while True:
        page = task_log_page(task=task, attempt=attempt, offset=offset, limit=limit, tail=None)
        if page.lines or page.complete or time.monotonic() >= deadline:
            return page
        time.sleep(min(step_s, max(0.0, deadline - time.monotonic())))
        fresh = Task.objects.filter(pk=task.pk).first()
        if fresh is None:  # deleted meanwhile: there is nothing more to wait for
            return dataclasses.replace(page, complete=True)
        task = fresh
