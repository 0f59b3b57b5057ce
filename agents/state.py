"""What the agent keeps on local disk: its state file and the outbox of unsent reports.

The state file lets a restarted agent re-adopt its running tasks and keep enforcing the last desired
state it saw, even if the plane is down when it starts. The outbox holds every report until the plane
acknowledges it, so an outage loses nothing; reports carry a sequence number and the plane treats a
resent one as a repeat.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "agent-state.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Owner-only: the state file holds every run's environment (tenants' secrets) and the outbox their
    output; the tasks on this host run as other users and must read neither (docs/isolation.md)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover .tmp keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as out:
        # dumps, not dump: dump streams through the pure-Python encoder, ten times slower on the
        # outbox's reports of thousands of output lines.
        out.write(json.dumps(data, sort_keys=True))
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


class StateFile:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        self._last_written: str | None = None

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            # A torn file cannot happen with atomic replace; a hand-edited broken one is set aside.
            self.path.replace(self.path.with_suffix(".corrupt"))
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, data: dict[str, Any]) -> bool:
        """Write only when something changed (the loop calls this every tick). True if written."""
        text = json.dumps(data, sort_keys=True)
        if text == self._last_written:
            return False
        write_json_atomic(self.path, data)
        self._last_written = text
        return True


class Outbox:
    """One file a report. The agent is the directory's only writer, so once a listing found it empty it
    stays empty until `put`: an idle agent asks every tick and lists the directory no more after that."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._seen_empty = False  # not yet listed: a previous agent's reports may wait here

    def put(self, seq: int, report: dict[str, Any]) -> None:
        write_json_atomic(self.directory / f"{seq:012d}.json", report)
        self._seen_empty = False

    def pending(self) -> list[tuple[int, dict[str, Any]]]:
        if self._seen_empty:
            return []
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                found.append((int(path.stem), json.loads(path.read_text())))
            except (ValueError, OSError):
                path.replace(path.with_suffix(".bad"))
        self._seen_empty = not found
        return found

    def done(self, seq: int) -> None:
        (self.directory / f"{seq:012d}.json").unlink(missing_ok=True)

    def count(self) -> int:
        """Reports waiting (cheap: names only; the agent asks every tick before reading more output)."""
        if self._seen_empty:
            return 0
        waiting = sum(1 for _ in self.directory.glob("*.json"))
        self._seen_empty = waiting == 0
        return waiting

    def last_seq(self) -> int:
        seqs = [int(p.stem) for p in self.directory.glob("*.json") if p.stem.isdigit()]
        return max(seqs, default=0)
