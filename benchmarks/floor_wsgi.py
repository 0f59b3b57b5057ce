"""The bare floor of the heartbeat benchmark: a WSGI application that reads the request body and answers
401 with a JSON body, nothing else (no Django, no database). Served by gunicorn with the plane's worker
and thread settings, it is what one HTTP request costs through gunicorn alone on this machine."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

_BODY = b'{"detail": "unknown node token"}'


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length > 0:
        environ["wsgi.input"].read(length)
    start_response(
        "401 Unauthorized", [("Content-Type", "application/json"), ("Content-Length", str(len(_BODY)))]
    )
    return [_BODY]
