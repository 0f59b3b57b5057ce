"""Printing and following a task's output (`whalegen tasks logs`, `whalegen submit --wait`).

The task's stdout goes to our stdout and its stderr to our stderr, so a CI log shows both the way a
local run would; the launcher's own lines (a command that could not start, how the run ended) and
the marks where the output cap dropped lines go to stderr, prefixed `[whalegen]`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from whalegen.commands._http import Client


def print_lines(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        end = "" if line.get("partial") else "\n"
        if line["stream"] == "stdout":
            sys.stdout.write(line["text"] + end)
        elif line["stream"] == "stderr":
            sys.stderr.write(line["text"] + end)
        else:
            sys.stderr.write(f"[whalegen] {line['text']}\n")
    if lines:
        sys.stdout.flush()
        sys.stderr.flush()


@dataclass
class Follower:
    """Where the reading of one task's output stands: its attempt and the next line number."""

    task_id: int
    attempt: int | None = None  # None: the task's current attempt
    offset: int = 0
    complete: bool = False

    def step(self, client: Client, *, wait_s: float) -> dict[str, Any]:
        """Print the next page (waiting up to `wait_s` for one); returns the page."""
        params: dict[str, Any] = {"offset": self.offset, "limit": 5000}
        if self.attempt is not None:
            params["attempt"] = self.attempt
        if wait_s > 0:
            params.update(follow="true", wait_s=wait_s)
        page: dict[str, Any] = client.call("GET", f"/tasks/{self.task_id}/logs/", params=params)
        if self.attempt is None:
            self.attempt = page["attempt"]
        print_lines(page["lines"])
        self.offset = page["next_offset"]
        self.complete = page["complete"]
        return page

    def next_attempt(self, attempt: int) -> None:
        """The task was requeued: read the new run from its start."""
        sys.stderr.write(f"[whalegen] task {self.task_id}: attempt {attempt}\n")
        self.attempt, self.offset, self.complete = attempt, 0, False


def failure_reason(client: Client, task_id: int) -> str:
    """The reason of the event that ended the task failed ("" if it did not fail)."""
    events = client.call("GET", f"/tasks/{task_id}/events/", params={"limit": 1000})["results"]
    failed = [event for event in events if event["to_state"] == "failed"]
    return failed[-1]["reason"] if failed else ""
