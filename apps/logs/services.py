"""Writes of run output: storing what agents ship (inside the report's transaction), trimming each run
to the cap, and expiring old output (beat)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Sum
from django.utils import timezone

from apps.common.errors import NotAllowed
from apps.fleet.models import TaskRun
from apps.fleet.selectors import parse_run
from apps.inventory.models import Node
from apps.logs.models import LogChunk, LogStream
from apps.workloads.models import Task
from whalegen import protocol as p


def log_chunks_check(*, node: Node, chunks: tuple[p.LogChunk, ...], reported: set[tuple[int, int]]) -> None:
    """A node writes the output of runs it holds: a run it reported (here or before) and no other
    node's. Raises NotAllowed (403) naming the first that is not; nothing is written then."""
    runs = set()
    for chunk in chunks:
        run = parse_run(chunk.task_id, chunk.attempt)
        if run is None:
            raise NotAllowed(f"output for task {chunk.task_id!r}, which was never assigned to node {node.pk}")
        runs.add(run)
    if not runs:
        return
    task_ids = {task_id for task_id, _ in runs}
    held = set(TaskRun.objects.filter(node=node, task_id__in=task_ids).values_list("task_id", "attempt"))
    others = set(
        LogStream.objects.filter(task_id__in=task_ids).exclude(node=node).values_list("task_id", "attempt")
    )
    for run in sorted(runs):
        if run in others or (run not in held and run not in reported):
            raise NotAllowed(f"task {run[0]} attempt {run[1]} is not a run of node {node.pk}")


def log_chunks_store(*, node: Node, chunks: tuple[p.LogChunk, ...]) -> int:
    """Store chunks in order, each line once (call inside the report's transaction, after
    `log_chunks_check`). Returns the rows written."""
    cap_bytes = int(settings.WHALEGEN_LOG_CAP_MIB * (1 << 20))
    written = 0
    streams: dict[tuple[int, int], LogStream] = {}
    for chunk in chunks:
        run = parse_run(chunk.task_id, chunk.attempt)
        assert run is not None  # checked
        stream = streams.get(run)
        if stream is None:
            if not Task.objects.filter(pk=run[0]).exists():
                continue  # deleted since
            LogStream.objects.get_or_create(task_id=run[0], attempt=run[1], defaults={"node": node})
            # The row lock orders two reports racing on one run (they cannot both append).
            stream = LogStream.objects.select_for_update().get(task_id=run[0], attempt=run[1])
            streams[run] = stream
        written += _append(stream, chunk, cap_bytes=cap_bytes)
    for stream in streams.values():
        stream.save()
    return written


def _append(stream: LogStream, chunk: p.LogChunk, *, cap_bytes: int) -> int:
    # 1. What is new: a resent chunk, or the part of one already stored, is skipped.
    skip = max(0, stream.next_line - chunk.first_line)
    lines = chunk.lines[skip:]
    if skip == 0:
        stream.carry_dropped_lines += chunk.dropped_lines
        stream.carry_dropped_bytes += chunk.dropped_bytes
        stream.dropped_lines += chunk.dropped_lines
        stream.dropped_bytes += chunk.dropped_bytes
    stream.eof = stream.eof or chunk.eof
    if not lines:
        return 0
    first = chunk.first_line + skip
    text_bytes = sum(len(line.text.encode()) for line in lines)
    LogChunk.objects.create(
        stream=stream,
        first_line=first,
        end_line=first + len(lines),
        text_bytes=text_bytes,
        lines=[[line.at_s, line.stream.value, line.text, line.partial] for line in lines],
        dropped_lines=stream.carry_dropped_lines,
        dropped_bytes=stream.carry_dropped_bytes,
        head=stream.received_bytes < cap_bytes // 2,
    )
    stream.carry_dropped_lines = stream.carry_dropped_bytes = 0
    stream.next_line = first + len(lines)
    stream.received_bytes += text_bytes
    stream.stored_bytes += text_bytes
    # 2. Over the cap: drop the oldest chunks after the head; the chunk after them tells the gap.
    while stream.stored_bytes > cap_bytes:
        chunks = LogChunk.objects.filter(stream=stream).order_by("first_line")
        oldest = chunks.filter(head=False).first()
        following = chunks.filter(first_line__gt=oldest.first_line).first() if oldest is not None else None
        if oldest is None or following is None:
            break  # the newest chunk alone is above the cap: keep it rather than show nothing
        lines_cut = oldest.end_line - oldest.first_line
        LogChunk.objects.filter(pk=following.pk).update(
            dropped_lines=F("dropped_lines") + oldest.dropped_lines + lines_cut,
            dropped_bytes=F("dropped_bytes") + oldest.dropped_bytes + oldest.text_bytes,
        )
        oldest.delete()
        stream.stored_bytes -= oldest.text_bytes
        stream.dropped_lines += lines_cut
        stream.dropped_bytes += oldest.text_bytes
    return 1


def logs_expire(*, now: datetime | None = None) -> int:
    """Delete the output of tasks that ended more than WHALEGEN_LOG_RETENTION_DAYS ago. Returns the
    number of runs whose output went."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.WHALEGEN_LOG_RETENTION_DAYS)
    old = LogStream.objects.filter(task__finished_at__lt=cutoff)
    count = old.count()
    LogChunk.objects.filter(stream__in=old).delete()
    old.delete()
    return count


def logs_stored_bytes() -> int:
    return int(LogStream.objects.aggregate(total=Sum("stored_bytes"))["total"] or 0)
