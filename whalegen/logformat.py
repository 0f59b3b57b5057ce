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
"""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import UTC, datetime
from typing import Any

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
