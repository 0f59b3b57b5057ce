"""Log lines for operators, in the standard library only: plain lines or JSON lines, context fields, and
no credentials in either (docs/logs-and-metrics.md, "Logs"). The plane (`whalegen.config.logging`) and the
agent (`agents.agent`) both format with these, so the module imports nothing but the standard library — the
agent runs on GPU hosts without Django or Celery (tests/test_import_rules.py).

- `redact` / `RedactFilter` rewrite a message with its arguments merged in and every credential replaced
  by `[redacted]`: bearer and basic credentials, the plane's own token formats (`wg_…` user tokens,
  `wgn_…` node tokens, `wgj_…` join tokens), and `token=` / `password=` / `secret=` / `SECRET_KEY=`
  style pairs, in `key=value`, `key: value` and JSON/dict (`"key": "value"`) spellings. Both formatters
  redact again what the filter never sees: exception tracebacks and stack text.
- `JsonFormatter` writes one JSON object per line: `time` (UTC, ISO 8601, milliseconds), `level`,
  `component` (which process: `web`, `worker`, `beat`, `agent`, …), `logger`, `message`, then whichever
  context fields the record carries (CONTEXT_FIELDS), then `exc`/`stack` (a traceback as one string field,
  never as lines of its own).
- `PlainFormatter` writes the historic `asctime level logger message` line and appends the known context
  fields as `key=value` pairs: the opt-in for a person's terminal (`whalegen demo`).
- `formatter_for(fmt)` picks one by the `WHALEGEN_LOG_FORMAT` spelling (`plain`, else JSON: JSON is the
  default, so a process nobody configured still writes lines a log pipeline can parse).
- `set_component(name)` names the process once, at its start (gunicorn's logger, Celery's worker and beat
  classes, the agent's command); until then `WHALEGEN_COMPONENT`, else `plane`.
- `structured_stdio(logger)` turns what a one-shot start-up step prints (`manage.py migrate`'s progress,
  the bootstrap join token's sentence) and an uncaught exception's traceback into log records, from the
  first byte; `ConsoleHandler` is the stream handler that writes past it, to the real stream.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

# The context fields a record may carry (`extra={"task_id": …}`), in the order they are written: who and
# what first, then an HTTP request's own fields (gunicorn's access lines).
CONTEXT_FIELDS = (
    "request_id", "celery_task_id", "celery_task", "tenant", "node", "task_id", "attempt", "pool", "cycle_id",
    "method", "path", "status", "duration_ms", "bytes", "remote_addr",
)  # fmt: skip
REDACTED = "[redacted]"
DEFAULT_COMPONENT = "plane"
# Where the plane leaves a request's `tenant` / `node` in the WSGI environ for gunicorn's access line.
ENVIRON_FIELDS_KEY = "whalegen.log_fields"

_component: str | None = None


def set_component(name: str) -> None:
    """Name this process in every line it writes from now on (`web`, `worker`, `beat`, `agent`, …)."""
    global _component
    _component = name


def component() -> str:
    """This process's name: the one set, else `WHALEGEN_COMPONENT`, else `plane`."""
    return _component or os.environ.get("WHALEGEN_COMPONENT") or DEFAULT_COMPONENT


_SECRET_KEYS = r"[\w.-]*(?:token|password|passwd|secret|api[_-]?key|credential)[\w.-]*"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # `Authorization: Bearer abc…` and `Basic …`, wherever they appear (a header dict, a curl line).
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]+"), rf"\1\2{REDACTED}"),
    # The plane's own credentials, recognisable by their prefix even without a key beside them.
    (re.compile(r"\bwg[nj]?_[A-Za-z0-9_-]{16,}"), REDACTED),
    # "token": "abc", 'password': 'x', token=abc, SECRET_KEY=abc, secret: abc (value up to a delimiter);
    # a value already redacted is left alone, so redacting twice (filter, then formatter) changes nothing.
    (
        re.compile(
            rf"(?i)(\b{_SECRET_KEYS}[\"']?\s*[=:]\s*)([\"']?)(?!{re.escape(REDACTED)})([^\s&\"',;}}\]]+)"
        ),
        rf"\1\2{REDACTED}",
    ),
)


# Every match of a pattern above contains one of these (lower-cased): a text with none skips the patterns,
# which are most of a log line's cost (docs/notes/log-lines.md).
_TRIGGERS = ("bearer", "basic", "wg_", "wgn_", "wgj_", "token", "passw", "secret", "apikey", "api_key",
             "api-key", "credential")  # fmt: skip


def redact(text: str) -> str:
    """`text` with every credential pattern above replaced by `[redacted]`."""
    lowered = text.lower()
    if not any(trigger in lowered for trigger in _TRIGGERS):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactFilter(logging.Filter):
    """Merge a record's arguments into its message and redact the result (attach it to handlers, so it
    sees records from every logger). Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed format string: keep what there is, redacted
            message = f"{record.msg} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        return True


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    """The context fields `record` carries, in CONTEXT_FIELDS order."""
    return {name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None}


class _ContextMixin:
    def context(self, record: logging.LogRecord) -> dict[str, Any]:
        """The context fields written with `record` (the plane's formatters add Celery's task id)."""
        return context_of(record)


class JsonFormatter(_ContextMixin, logging.Formatter):
    """One JSON object per line; see the module docstring for the fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "component": component(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for name, value in self.context(record).items():
            entry[name] = value if isinstance(value, (int, float, bool)) else redact(str(value))
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exc"] = redact(record.exc_text)
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


class PlainFormatter(_ContextMixin, logging.Formatter):
    """`2026-12-01 14:00:00,123 INFO apps.fleet.services message [node=n1 task_id=42]`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = self.context(record)
        if context:
            # The context goes on the first line: a traceback below it stays as Python printed it.
            first, newline, rest = line.partition("\n")
            pairs = " ".join(f"{name}={value}" for name, value in context.items())
            line = f"{first} [{pairs}]{newline}{rest}"
        return redact(line)


def is_plain(fmt: str) -> bool:
    """Whether a `WHALEGEN_LOG_FORMAT` value asks for plain lines (`plain`, any case, spaces ignored)."""
    return fmt.strip().lower() == "plain"


def formatter_for(fmt: str) -> logging.Formatter:
    """`PlainFormatter` for `plain` (any case, spaces ignored), `JsonFormatter` otherwise."""
    return PlainFormatter() if is_plain(fmt) else JsonFormatter()


class LineLog(io.TextIOBase):
    """A text stream (`sys.stdout` / `sys.stderr`) whose every line becomes one record of `logger` at
    `level`: a line printed in pieces (`Applying x...` then ` OK`) is one record, blank lines none, and a
    leading `prefix` (the program's name, which `logger` names already) is dropped. Writes
    made while one of its own records is being handled go to the real stream unchanged, so a handler that
    was bound to this stream can never loop."""

    def __init__(self, real: TextIO, logger: str, level: int, *, prefix: str = "") -> None:
        super().__init__()
        self.real_stream = real
        self._logger = logging.getLogger(logger)
        self._level = level
        self._prefix = prefix
        self._pending = ""
        self._busy = threading.local()

    def write(self, text: str) -> int:
        if getattr(self._busy, "on", False):
            return self.real_stream.write(text)
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        # A partial line stays pending: Django flushes `Applying x...` before it prints ` OK`.
        self.real_stream.flush()

    def finish(self) -> None:
        """The last line, if the process ends without a newline after it."""
        line, self._pending = self._pending, ""
        self._emit(line)

    def _emit(self, line: str) -> None:
        text = line.strip()
        if self._prefix and text.startswith(self._prefix):
            text = text[len(self._prefix) :].lstrip()
        if not text:
            return
        self._busy.on = True
        try:
            self._logger.log(self._level, text)
        finally:
            self._busy.on = False

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.real_stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.real_stream.encoding


def real_stream(stream: TextIO) -> TextIO:
    """The stream under a `LineLog`, or `stream` itself."""
    return stream.real_stream if isinstance(stream, LineLog) else stream


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler (stderr by default) that writes to the real stream when the process's stdio was
    turned into records (`structured_stdio`): bound to the `LineLog` itself, each line would be logged
    again, as a message inside a message."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(real_stream(stream if stream is not None else sys.stderr))


def wants_structured_stdio(fmt: str, *streams: TextIO) -> bool:
    """Whether a start-up step's prints should become log lines: not when plain lines were asked for, and
    not at a person's terminal (prompts and progress are for them there)."""
    return not is_plain(fmt) and not any(stream.isatty() for stream in streams)


@contextlib.contextmanager
def structured_stdio(logger: str, *, stderr_level: int = logging.WARNING, prefix: str = "") -> Iterator[bool]:
    """Inside the block, every byte the process writes is a log line (`WHALEGEN_LOG_FORMAT`: JSON unless
    `plain`), for a one-shot start-up step whose output a log pipeline reads (`manage.py migrate`, the
    bootstrap join token): 1. a root handler on the real stderr until the process configures its own
    (Django's `LOGGING` replaces it with a `ConsoleHandler`), 2. Python's warnings as records, 3. each line
    printed on stdout an INFO record of `logger`, on stderr one at `stderr_level`, without a leading
    `prefix` (`whalegen create join-token:`: the logger says it, and the redaction would take
    `join-token: made` for a credential's key and value), 4. an exception that leaves the block one
    CRITICAL record with its traceback in `exc`, then exit status 1, as Python's own uncaught-exception
    handling would have ended it. Nothing at a terminal or with `plain`; yields whether it did it. The
    streams are restored at the end (a test calls the commands in-process)."""
    fmt = os.environ.get("WHALEGEN_LOG_FORMAT", "json")
    if not wants_structured_stdio(fmt, sys.stdout, sys.stderr):
        yield False
        return
    root = logging.getLogger()
    handler = None
    if not root.handlers:
        handler = ConsoleHandler(sys.stderr)
        handler.setFormatter(formatter_for(fmt))
        handler.addFilter(RedactFilter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    saved = sys.stdout, sys.stderr
    out = LineLog(sys.stdout, logger, logging.INFO, prefix=prefix)
    err = LineLog(sys.stderr, logger, stderr_level, prefix=prefix)
    sys.stdout, sys.stderr = out, err
    try:
        yield True
    except Exception as error:  # SystemExit and KeyboardInterrupt pass through as they are
        out.finish()  # what was printed before it, first
        err.finish()
        logging.getLogger(logger).critical("uncaught %s: %s", type(error).__name__, error, exc_info=True)
        raise SystemExit(1) from None
    finally:
        out.finish()
        err.finish()
        sys.stdout, sys.stderr = saved
        if handler is not None and handler in root.handlers:
            root.removeHandler(handler)
