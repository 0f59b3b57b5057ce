"""The WSGI entry point: Django, with the agents' heartbeat answered in front of it.

`POST /api/v1/agent/heartbeat/` is the plane's most frequent request by far (2,000 nodes beating every
10 s are 200 a second) and needs nothing of Django's request machinery: no session, CSRF, messages,
URL resolution or DRF (docs/fleet.md, "Heartbeat load"). It goes to `apps.fleet.heartbeat.answer`
directly, the same function the Django view at that path calls; everything else, any other method at
that path included, goes to Django unchanged. What the front keeps of Django's handling: the
`X-Request-ID` of the request on its log lines and in its answer, the node its credential names on those
lines and on gunicorn's access line (as the agent endpoints' authentication does), the 413 for a body
above the upload limit before it is read, a JSON 500 with the error logged, a warning line for every
refusal, and the database connection rules of `close_old_connections` (a connection that failed is
closed at the end of the request; one past `CONN_MAX_AGE` too).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
django_application = get_wsgi_application()

# Imported once Django is set up.
from django.db import connections  # noqa: E402

from apps.common.exceptions import body_limit_bytes, too_large_message  # noqa: E402
from apps.fleet.heartbeat import answer  # noqa: E402
from apps.metrics.middleware import _ACCEPTED  # noqa: E402
from whalegen import protocol as p  # noqa: E402
from whalegen.config.logging import request_id_var  # noqa: E402

log = logging.getLogger("django.request")

StartResponse = Callable[..., Any]


def _release_connections() -> None:
    """Django's end-of-request rule for database connections (`close_old_connections`), without the
    health check it arms for the next request: that check costs a `SELECT 1` per heartbeat. A connection
    that failed in this request is closed here, so the next request opens a fresh one; one that broke
    while idle fails one heartbeat (a 500 the agent retries) and is closed after it."""
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block or conn.connection is None:
            continue
        conn.close_if_unusable_or_obsolete()
        conn.health_check_done = True


def _respond(
    start_response: StartResponse, status: int, body: dict[str, Any], headers: dict[str, str], request_id: str
) -> Iterable[bytes]:
    data = json.dumps(body).encode()
    head = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    head.append(("X-Request-ID", request_id))
    start_response(f"{status} {HTTPStatus(status).phrase}", [*head, *headers.items()])
    return [data]


def _heartbeat(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    sent = environ.get("HTTP_X_REQUEST_ID", "")
    request_id = sent if _ACCEPTED.match(sent) else uuid.uuid4().hex
    token = request_id_var.set(request_id)
    try:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return _respond(start_response, 400, {"detail": "Content-Length is not a number"}, {}, request_id)
        if length > body_limit_bytes():
            return _respond(start_response, 413, {"detail": too_large_message()}, {}, request_id)
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        try:
            status, answered, headers = answer(
                authorization=environ.get("HTTP_AUTHORIZATION", ""),
                content_type=environ.get("CONTENT_TYPE", ""),
                body=body,
                shortcut=True,
                environ=environ,
            )
        except Exception:
            log.exception("Internal Server Error: %s", p.HEARTBEAT_PATH)
            for conn in connections.all(initialized_only=True):
                conn.errors_occurred = True  # checked (and closed if broken) below
            status, answered, headers = 500, {"detail": "server error; the plane's log has the details"}, {}
        if status >= 400:
            log.warning("%s: %s", HTTPStatus(status).phrase, p.HEARTBEAT_PATH)
        return _respond(start_response, status, answered, headers, request_id)
    finally:
        request_id_var.reset(token)
        _release_connections()


def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    if environ.get("PATH_INFO") == p.HEARTBEAT_PATH and environ.get("REQUEST_METHOD") == "POST":
        return _heartbeat(environ, start_response)
    return django_application(environ, start_response)
