"""A WSGI application for tests/ops/test_gunicorn_settings.py: answers a heartbeat with the client's TCP
port as the ack's generation (the port tells the test which connection carried each heartbeat), and
`GET /slow/` after a second (a stand-in for an agent's long poll holding its thread)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length > 0:
        environ["wsgi.input"].read(length)
    if environ["PATH_INFO"] == "/slow/":
        time.sleep(1.0)
    body = json.dumps({"generation": int(environ["REMOTE_PORT"])}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
