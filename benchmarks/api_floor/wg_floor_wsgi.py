"""The WSGI entry benchmarks/api_load.py serves: the measured checkout's own application, plus the
floor endpoints that split a request's cost by layer (this directory is put on the server's path next
to the measured checkout, so an older checkout gets the same floors).

- `/floor/bare/` never reaches Django: gunicorn parsing a request and writing a fixed answer;
- `/api/v1/floor/django/` (wg_floor_urls): Django and every middleware of the project, a trivial view;
- `/api/v1/floor/drf/`: the same plus DRF with the project's bearer-token authentication, no query.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "wg_floor_settings")

from whalegen.config.wsgi import application as _plane

_BARE_BODY = b'{"ok":true}'
_BARE_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(_BARE_BODY)))]


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ.get("PATH_INFO") == "/floor/bare/":
        start_response("200 OK", _BARE_HEADERS)
        return [_BARE_BODY]
    return _plane(environ, start_response)
