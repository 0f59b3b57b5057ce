"""The plane's logging settings (docs/logs-and-metrics.md "Logs"): the standard-library formatters and
redaction of `whalegen.logformat` (which the agent shares), plus what only the plane knows about a record —
the HTTP request being served and the Celery task being run.

- `RequestContextFilter` puts the id of the HTTP request being served (`apps.metrics.middleware`) on
  every record logged while serving it, and the tenant or node its credential belongs to once
  authentication named them (`log_context_add`).
- `JsonFormatter` / `PlainFormatter` are `whalegen.logformat`'s, adding `celery_task_id` and `celery_task`
  inside a Celery task and on Celery's lines about one.
- `logging_config` builds the `LOGGING` dict of the settings.

Celery is imported only when already loaded: the management commands import this module without it.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from django.core.signals import request_started

from whalegen import logformat
from whalegen.logformat import CONTEXT_FIELDS, REDACTED, RedactFilter, is_plain, redact

__all__ = [
    "CONTEXT_FIELDS",
    "REDACTED",
    "JsonFormatter",
    "PlainFormatter",
    "RedactFilter",
    "RequestContextFilter",
    "context_of",
    "log_context_add",
    "log_environ_add",
    "logging_config",
    "redact",
    "request_id_var",
]

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "whalegen_request_id", default=None
)
# What authentication learned about the request being served (`tenant`, `node`), with that request's id:
# read only while the same request id is being served (the middleware unsets it when the request ends),
# and emptied when the next request starts (Django's `request_started`, in the thread that serves it), so
# neither a line logged after the request nor the thread's next request inherits the last one's tenant.
request_fields_var: contextvars.ContextVar[tuple[str | None, dict[str, Any]] | None] = contextvars.ContextVar(
    "whalegen_request_fields", default=None
)
# The same fields in the WSGI environ (Django's `request.META` is it), where gunicorn's access line,
# written after Django is done, reads them (whalegen/gunicornlog.py).
ENVIRON_KEY = logformat.ENVIRON_FIELDS_KEY


def log_context_add(request: Any, **fields: Any) -> None:
    """Put `fields` (`tenant=slug`, `node=name`) on every log line about `request` from now on: the plane's
    own, Django's 4xx/5xx line and gunicorn's access line. Authentication calls it once it knows them."""
    log_environ_add(request.META, **fields)


def log_environ_add(environ: dict[str, Any], **fields: Any) -> None:
    """`log_context_add` for a request held as its WSGI environ: the heartbeat, answered in front of Django
    (`whalegen.config.wsgi`), has no request object."""
    held = environ.setdefault(ENVIRON_KEY, {})
    for name, value in fields.items():
        if value is not None:
            held[name] = value
    request_fields_var.set((request_id_var.get(), held))


def _forget_request_fields(**_: Any) -> None:
    request_fields_var.set(None)


request_started.connect(_forget_request_fields, dispatch_uid="whalegen.config.logging.request_fields")


def _request_fields(request: Any) -> dict[str, Any]:
    """The fields `log_context_add` set for the request being served, or for the one a record names."""
    held = request_fields_var.get()
    serving = request_id_var.get()
    if held is not None and serving is not None and held[0] == serving:
        return held[1]
    fields = getattr(request, "META", {}).get(ENVIRON_KEY)
    return fields if isinstance(fields, dict) else {}


class RequestContextFilter(logging.Filter):
    """Stamp `request_id` on records logged while an HTTP request is served, and what authentication
    learned about it (`log_context_add`), unless the record already carries them."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        if getattr(record, "request_id", None) is None:
            # Django logs a 4xx/5xx answer ("Unauthorized: /api/…") after the middleware returned, with
            # the request itself in `extra`: its id is read from there.
            request_id = request_id_var.get() or getattr(request, "request_id", None)
            if request_id is not None:
                record.request_id = request_id
        for name, value in _request_fields(request).items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def _celery_task() -> tuple[str, str] | None:
    """The id and name of the Celery task this thread runs, if Celery is loaded and running one."""
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
    return (str(task_id), str(task.name)) if task_id else None


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    """The context fields `record` carries, in CONTEXT_FIELDS order, with the Celery task's id and name if
    any: the task being run, or the one a worker line is about (Celery's "received" and "succeeded" lines
    carry it in `record.data`, logged outside the task)."""
    found = logformat.context_of(record)
    if "celery_task_id" in found:
        return found
    data = getattr(record, "data", None)
    if isinstance(data, dict) and data.get("id"):
        task: tuple[str, str] | None = (str(data["id"]), str(data.get("name", "")))
    else:
        task = _celery_task()
    if task is not None:
        found["celery_task_id"], found["celery_task"] = task
        # Back into CONTEXT_FIELDS order, with the Celery fields where they belong.
        found = {name: found[name] for name in CONTEXT_FIELDS if name in found}
    return found


class JsonFormatter(logformat.JsonFormatter):
    def context(self, record: logging.LogRecord) -> dict[str, Any]:
        return context_of(record)


class PlainFormatter(logformat.PlainFormatter):
    def context(self, record: logging.LogRecord) -> dict[str, Any]:
        return context_of(record)


def logging_config(*, fmt: str, level: str, access_level: str) -> dict[str, Any]:
    """The `LOGGING` dict of the plane's settings: one console handler in the chosen format, both filters
    on it. `fmt` is `plain` or `json` (anything else is JSON)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request": {"()": "whalegen.config.logging.RequestContextFilter"},
            "redact": {"()": "whalegen.logformat.RedactFilter"},
        },
        "formatters": {
            "plain": {"()": "whalegen.config.logging.PlainFormatter"},
            "json": {"()": "whalegen.config.logging.JsonFormatter"},
        },
        "handlers": {
            "console": {
                "class": "whalegen.logformat.ConsoleHandler",
                "formatter": "plain" if is_plain(fmt) else "json",
                "filters": ["request", "redact"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        # One line per HTTP request (the development server) and per Celery task run: INFO logs them all;
        # `whalegen demo` sets WARNING so ten polling agents do not bury its status line. `propagate` undoes
        # Django's default for django.server (its own handler, not propagated), or its lines go nowhere.
        "loggers": {
            name: {"level": access_level, "propagate": True} for name in ("django.server", "celery.app.trace")
        },
    }
