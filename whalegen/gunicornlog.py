"""gunicorn's own lines in the plane's log format (docs/logs-and-metrics.md, "Logs"): `PlaneLogger` is the
`logger_class` of docker/gunicorn.conf.py.

gunicorn writes its error lines (`Booting worker`, `Worker timeout`, a worker's traceback) and its access
lines through loggers of its own (`gunicorn.error` on stderr, `gunicorn.access` on stdout) that do not
propagate to the root logger, so the settings' `LOGGING` never reaches them. `PlaneLogger` gives them the
plane's formatter (`WHALEGEN_LOG_FORMAT`: JSON unless `plain`) and the redaction filter, names the process
`web`, and writes each access line as a record with the request's fields instead of gunicorn's
`access_log_format` text: `method`, `path` (the raw URI, query string included, redacted), `status`,
`duration_ms`, `bytes`, `remote_addr`, the `request_id` the plane answered with (`X-Request-ID`) and the
`tenant` or `node` its credential belongs to (left in the WSGI environ by the plane's authentication).
The master, which runs no Django, gets the same handler on its root logger, so a warning or a library's
line there is a JSON line too.

Imports gunicorn and the standard-library `whalegen.logformat` only: the master loads this before any
worker imports Django or the Celery app.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from typing import Any

from gunicorn import glogging

from whalegen.logformat import ENVIRON_FIELDS_KEY, RedactFilter, formatter_for, set_component

REQUEST_ID_HEADER = "x-request-id"


def _dress(handler: logging.Handler, formatter: logging.Formatter) -> None:
    handler.setFormatter(formatter)
    if not any(isinstance(existing, RedactFilter) for existing in handler.filters):
        handler.addFilter(RedactFilter())


class PlaneLogger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's logger with the plane's format, redaction and structured access lines."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        set_component("web")
        logging.captureWarnings(True)
        formatter = formatter_for(os.environ.get("WHALEGEN_LOG_FORMAT", "json"))
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                _dress(handler, formatter)
        root = logging.getLogger()
        if not root.handlers:  # the master; a worker's Django set-up replaces this with `LOGGING`'s
            root.addHandler(logging.StreamHandler(sys.stderr))
            root.setLevel(self.loglevel)
        for handler in root.handlers:
            _dress(handler, formatter)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: datetime.timedelta) -> None:
        if not self.access_log_enabled:
            return
        status = resp.status.split(None, 1)[0] if isinstance(resp.status, str) else resp.status
        headers = {str(name).lower(): value for name, value in resp.headers}
        method = environ.get("REQUEST_METHOD", "-")
        path = environ.get("RAW_URI") or environ.get("PATH_INFO", "-")
        fields: dict[str, Any] = {
            "method": method,
            "path": path,
            "status": int(status) if str(status).isdigit() else status,
            "duration_ms": round(request_time.total_seconds() * 1000, 1),
            "bytes": getattr(resp, "sent", None),
            "remote_addr": environ.get("REMOTE_ADDR"),
        }
        if headers.get(REQUEST_ID_HEADER):
            fields["request_id"] = headers[REQUEST_ID_HEADER]
        # The tenant or node the request's credential belongs to, as authentication found it.
        fields.update(environ.get(ENVIRON_FIELDS_KEY) or {})
        try:
            self.access_log.info("%s %s %s", method, path, status, extra=fields)
        except Exception:
            self.error_log.exception("writing an access line failed")
