"""A run's captured output on the host: written by the launcher, read and shipped by the agent.

Format. One record per line of output, in the order the launcher read them:

    <at_s with 6 decimals> <tag> <text>\\n

`tag` is `o` (stdout), `e` (stderr) or `l` (the launcher's own words); upper case marks a partial line
(the process wrote no newline). `text` is the raw bytes of the line without its newline, so a person can
read the file with `cut -d' ' -f3-`. Line numbers count records from 0 over the whole run.

Cap. The first half of the cap (`cap_bytes`, the agent's `--log-cap-mib`, 10 MiB by default) is the
head, kept whole in `head.log`. After it, records go to tail segments `tail-<first line>-<first byte>.log`
of a quarter of the other half each; once the segments hold more than that half, the oldest is deleted.
So the host keeps the head and the last half-cap of output, at most cap + a segment on disk, and a
reader that finds a gap in line numbers knows how many lines and bytes were dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

HEAD = "head.log"
TAGS = {"stdout": b"o", "stderr": b"e", "launcher": b"l"}
STREAMS = {tag.decode(): name for name, tag in TAGS.items()}
MIN_CAP_BYTES = 4096


class CaptureWriter:
    """Append records under the cap (used by the launcher only: one writer per run)."""

    def __init__(self, directory: str | Path, *, cap_bytes: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        cap_bytes = max(cap_bytes, MIN_CAP_BYTES)
        self.head_cap = cap_bytes // 2
        self.tail_cap = cap_bytes - self.head_cap
        self.segment_bytes = max(self.tail_cap // 4, 1024)
        self.line_no = 0
        self.byte = 0
        self.in_head = True
        self.current: BinaryIO = (self.directory / HEAD).open("ab")
        self.current_size = 0
        self.tails: list[tuple[Path, int]] = []  # closed tail segments, oldest first, with sizes

    def line(self, stream: str, text: bytes, at_s: float, *, partial: bool = False) -> None:
        tag = TAGS[stream].upper() if partial else TAGS[stream]
        record = b"%.6f %s %s\n" % (at_s, tag, text)
        limit = self.head_cap if self.in_head else self.segment_bytes
        if self.current_size and self.current_size + len(record) > limit:
            self._roll()
        self.current.write(record)
        self.current_size += len(record)
        self.line_no += 1
        self.byte += len(record)

    def _roll(self) -> None:
        """Close the full segment and open the next; drop the oldest tails beyond the tail cap (the
        reader knows a segment is complete once a later one exists, so close before opening)."""
        self.current.close()
        if not self.in_head:
            self.tails.append((Path(self.current.name), self.current_size))
        self.in_head = False
        name = f"tail-{self.line_no:012d}-{self.byte:015d}.log"
        self.current = (self.directory / name).open("ab")
        self.current_size = 0
        while self.tails and sum(size for _, size in self.tails) > self.tail_cap - self.segment_bytes:
            path, _ = self.tails.pop(0)
            path.unlink(missing_ok=True)

    def flush(self) -> None:
        self.current.flush()

    def close(self) -> None:
        self.current.close()


@dataclass(frozen=True)
class CapturedLine:
    at_s: float
    stream: str  # stdout | stderr | launcher
    text: str
    partial: bool = False


@dataclass(frozen=True)
class Cursor:
    """Where a reader is: the segment, the offset in it, and the line number and capture byte there."""

    segment: str = HEAD
    pos: int = 0
    line: int = 0
    byte: int = 0


@dataclass(frozen=True)
class Batch:
    first_line: int
    lines: tuple[CapturedLine, ...]
    dropped_lines: int
    dropped_bytes: int
    cursor: Cursor  # after this batch


def _segments(directory: Path) -> list[tuple[int, int, str]]:
    """(first line, first byte, name) of every segment present, in order."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if name == HEAD:
            found.append((0, 0, name))
        elif name.startswith("tail-") and name.endswith(".log"):
            parts = name[5:-4].split("-")
            if len(parts) == 2 and all(part.isdigit() for part in parts):
                found.append((int(parts[0]), int(parts[1]), name))
    return sorted(found)


def _parse(record: bytes) -> CapturedLine:
    at, tag, text = [*record.split(b" ", 2), b"", b""][:3]
    letter = tag.decode(errors="replace") or "o"
    try:
        at_s = float(at)
    except ValueError:
        at_s = 0.0
    return CapturedLine(
        at_s=at_s,
        stream=STREAMS.get(letter.lower(), "stdout"),
        text=text.decode(errors="replace"),
        partial=letter.isupper(),
    )


def read(directory: Path, cursor: Cursor, *, max_bytes: int) -> Batch:
    """Complete records after `cursor`, about `max_bytes` of them, consecutive: a batch never spans a
    gap the cap made (the gap is reported as dropped before the lines after it, in the next batch)."""
    lines: list[CapturedLine] = []
    first_line = cursor.line
    dropped_lines = dropped_bytes = taken = 0
    while taken < max_bytes:
        try:
            with (directory / cursor.segment).open("rb") as segment:
                segment.seek(cursor.pos)
                # Room for one more whole record past the budget (a record is under 80 KiB).
                data = segment.read(max_bytes - taken + (80 << 10))
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1
        if end:
            records = data[:end].split(b"\n")[:-1]
            lines += [_parse(record) for record in records]
            cursor = Cursor(cursor.segment, cursor.pos + end, cursor.line + len(records), cursor.byte + end)
            taken += end
        if end < len(data):
            break  # a record still being written, or more than this batch takes
        # All of this segment that exists is read. A later segment means this one is complete.
        later = [s for s in _segments(directory) if s[0] >= cursor.line and s[2] != cursor.segment]
        if not later:
            break
        next_line, next_byte, name = later[0]
        if next_line > cursor.line:
            if lines:
                break
            dropped_lines += next_line - cursor.line
            dropped_bytes += next_byte - cursor.byte
            first_line = next_line
        cursor = Cursor(name, 0, next_line, next_byte)
    return Batch(first_line, tuple(lines), dropped_lines, dropped_bytes, cursor)


def read_all(directory: Path) -> list[CapturedLine]:
    """Every line still on disk, in order (tests, `whalegen agent` debugging)."""
    lines: list[CapturedLine] = []
    cursor = Cursor()
    while True:
        batch = read(directory, cursor, max_bytes=1 << 20)
        if not batch.lines and batch.cursor == cursor:
            return lines
        lines += batch.lines
        cursor = batch.cursor


def stream_text(directory: Path, stream: str) -> str:
    """One stream's text as the process wrote it (newlines restored)."""
    return "".join(
        line.text + ("" if line.partial else "\n") for line in read_all(directory) if line.stream == stream
    )
