"""One id per HTTP request, on its log lines and in its response (`X-Request-ID`)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from whalegen.config.logging import request_id_var

HEADER = "X-Request-ID"
# An incoming id (a proxy's, a client's) is kept when it looks like one: short and plain, so a header
# cannot smuggle line breaks or a novel into every log line of the request.
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestIdMiddleware:
    """Honour a sane incoming `X-Request-ID` or make one (32 hex digits); set it for the log records of
    this request (`whalegen.config.logging.RequestContextFilter`) and echo it in the response."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        sent = request.headers.get(HEADER, "")
        request_id = sent if _ACCEPTED.match(sent) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = request_id_var.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response[HEADER] = request_id
        return response
