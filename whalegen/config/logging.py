"""Log records for operators: plain lines or JSON lines (`WHALEGEN_LOG_FORMAT=json`), context fields, and
no secrets in either (docs/operations.md "Logs").

- `RequestContextFilter` puts the id of the HTTP request being served (`apps.metrics.middleware`) on
  every record logged while serving it.
- `RedactFilter` rewrites a record's message with its arguments merged in and every credential replaced
  by `[redacted]`: bearer and basic credentials, the plane's own token formats (`wg_…` user tokens,
  `wgn_…` node tokens), and `token=` / `password=` / `secret=` / `SECRET_KEY=` style pairs, in
  `key=value`, `key: value` and JSON/dict (`"key": "value"`) spellings. Both formatters redact again
  what the filter never sees: exception tracebacks and stack text.
- `JsonFormatter` writes one JSON object per line: `ts` (UTC, ISO 8601, milliseconds), `level`, `logger`,
  `message`, then whichever context fields the record carries (`request_id`, `task_id`, `pool`,
  `cycle_id`, `node`, and Celery's `celery_task_id`), then `exc` for a traceback.
- `PlainFormatter` writes the historic `asctime level logger message` line and appends the known context
  fields as `key=value` pairs.

Pure standard library: the agent and the management commands import it without Django.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

# The context fields a record may carry (`extra={"task_id": …}`), in the order they are written.
CONTEXT_FIELDS = ("request_id", "task_id", "pool", "cycle_id", "node", "celery_task_id")
REDACTED = "[redacted]"

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "whalegen_request_id", default=None
)

_SECRET_KEYS = r"[\w.-]*(?:token|password|passwd|secret|api[_-]?key|credential)[\w.-]*"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # `Authorization: Bearer abc…` and `Basic …`, wherever they appear (a header dict, a curl line).
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]+"), rf"\1\2{REDACTED}"),
    # The plane's own credentials, recognisable by their prefix even without a key beside them.
    (re.compile(r"\bwgn?_[A-Za-z0-9_-]{16,}"), REDACTED),
    # "token": "abc", 'password': 'x', token=abc, SECRET_KEY=abc, secret: abc (value up to a delimiter).
    (
        re.compile(rf"(?i)(\b{_SECRET_KEYS}[\"']?\s*[=:]\s*)([\"']?)([^\s&\"',;}}\]]+)"),
        rf"\1\2{REDACTED}",
    ),
)


def redact(text: str) -> str:
    """`text` with every credential pattern above replaced by `[redacted]`."""
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


class RequestContextFilter(logging.Filter):
    """Stamp `request_id` on records logged while an HTTP request is served (unless one is already set)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            # Django logs a 4xx/5xx answer ("Unauthorized: /api/…") after the middleware returned, with
            # the request itself in `extra`: its id is read from there.
            request_id = request_id_var.get() or getattr(getattr(record, "request", None), "request_id", None)
            if request_id is not None:
                record.request_id = request_id
        return True


def _celery_task_id() -> str | None:
    """The id of the Celery task this thread runs, if Celery is loaded and running one."""
    import sys

    if "celery" not in sys.modules:
        return None
    from celery import current_task

    try:
        task = current_task
        request = task.request if task else None
    except Exception:
        return None
    task_id = getattr(request, "id", None)
    return str(task_id) if task_id else None


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    """The context fields `record` carries, in CONTEXT_FIELDS order."""
    found = {
        name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None
    }
    if "celery_task_id" not in found:
        celery_task_id = _celery_task_id()
        if celery_task_id is not None:
            found["celery_task_id"] = celery_task_id
    return found


class JsonFormatter(logging.Formatter):
    """One JSON object per line; see the module docstring for the fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for name, value in context_of(record).items():
            entry[name] = value if isinstance(value, (int, float, bool)) else redact(str(value))
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exc"] = redact(record.exc_text)
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


class PlainFormatter(logging.Formatter):
    """`2026-12-01 14:00:00,123 INFO apps.fleet.services message [node=n1 task_id=42]`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = context_of(record)
        if context:
            # The context goes on the first line: a traceback below it stays as Python printed it.
            first, newline, rest = line.partition("\n")
            pairs = " ".join(f"{name}={value}" for name, value in context.items())
            line = f"{first} [{pairs}]{newline}{rest}"
        return redact(line)


def logging_config(*, fmt: str, level: str, access_level: str) -> dict[str, Any]:
    """The `LOGGING` dict of the plane's settings: one console handler in the chosen format, both filters
    on it. `fmt` is `json` or `plain` (anything else is plain)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request": {"()": "whalegen.config.logging.RequestContextFilter"},
            "redact": {"()": "whalegen.config.logging.RedactFilter"},
        },
        "formatters": {
            "plain": {"()": "whalegen.config.logging.PlainFormatter"},
            "json": {"()": "whalegen.config.logging.JsonFormatter"},
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "json" if fmt.strip().lower() == "json" else "plain",
                "filters": ["request", "redact"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        # One line per HTTP request (the development server) and per Celery task run: INFO logs them all;
        # `whalegen demo` sets WARNING so ten polling agents do not bury its status line.
        "loggers": {name: {"level": access_level} for name in ("django.server", "celery.app.trace")},
    }
