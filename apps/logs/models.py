"""What runs printed: the output agents capture and ship (protocol 1.2 `LogChunk`s), per run.

Its own app rather than a part of `workloads`: output is write-heavy, bounded and expired on its own
clock, and is written by agents (the fleet's report path), not by the task's life cycle; keeping it
apart keeps its migrations and its retention job out of the task tables.
"""

from __future__ import annotations

from django.db import models

from apps.inventory.models import Node
from apps.workloads.models import Task


class LogStream(models.Model):
    """The output of one run: a task's attempt, written by the one node that ran it.

    `next_line` is the number of the next line expected: a chunk is stored from there on, so a resent
    or overlapping chunk adds nothing twice. The plane's own cap (`WHALEGEN_LOG_CAP_MIB`) keeps the
    first half of the run's output (`head` chunks) and drops the oldest of the rest beyond the cap, so a
    run never holds more than the cap however much its agent ships.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="log_streams")
    attempt = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="log_streams")
    next_line = models.PositiveBigIntegerField(default=0)
    received_bytes = models.PositiveBigIntegerField(default=0)  # all text ever stored, trimmed or not
    stored_bytes = models.PositiveBigIntegerField(default=0)
    dropped_lines = models.PositiveBigIntegerField(default=0)  # by the agent's cap and the plane's
    dropped_bytes = models.PositiveBigIntegerField(default=0)
    # A gap announced by a chunk that brought no lines: it is told with the next chunk that does.
    carry_dropped_lines = models.PositiveBigIntegerField(default=0)
    carry_dropped_bytes = models.PositiveBigIntegerField(default=0)
    eof = models.BooleanField(default=False)  # the agent sent all there is
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["task_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["task", "attempt"], name="log_stream_task_attempt_unique")
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} attempt {self.attempt}"


class LogChunk(models.Model):
    """Consecutive lines `first_line` … `end_line - 1` of a run, as `[at_s, stream, text, partial]`.

    `dropped_lines`/`dropped_bytes`: what is missing just before this chunk (cut by a cap)."""

    stream = models.ForeignKey(LogStream, on_delete=models.CASCADE, related_name="chunks")
    first_line = models.PositiveBigIntegerField()
    end_line = models.PositiveBigIntegerField()
    text_bytes = models.PositiveIntegerField()
    lines = models.JSONField()
    dropped_lines = models.PositiveBigIntegerField(default=0)
    dropped_bytes = models.PositiveBigIntegerField(default=0)
    head = models.BooleanField(default=False)  # within the first half of the cap: never trimmed
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["stream_id", "first_line"]
        constraints = [
            models.UniqueConstraint(fields=["stream", "first_line"], name="log_chunk_stream_line_unique")
        ]
        indexes = [models.Index(fields=["stream", "end_line"])]

    def __str__(self) -> str:
        return f"{self.stream_id}: lines {self.first_line}-{self.end_line - 1}"
