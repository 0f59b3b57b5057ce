"""One error shape for everything under /api/: a JSON object with a `detail` string, always.

- 400 (bad input) also names each field it refuses, DRF's way: `{"detail": "invalid input: gpu_milli",
  "gpu_milli": ["…"]}`, so a pipeline can show the message next to the field; a bulk submission's
  `tasks` is a list that lines up with the submitted one (`{}` for the tasks that were fine).
- Every other refusal is `{"detail": "…"}`: 401, 403, 404, 405, 406, 409, 413, 415, 429.

DRF's views go through `exception_handler`; what Django answers outside them (no such URL, a
non-numeric id, an oversized body, a crash) is turned into the same shape by `ApiErrorMiddleware`.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler

from apps.common.errors import ApplicationError, BulkItemError, CodedValidationError

API_PREFIX = "/api/"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "payload_too_large"


def body_limit_bytes() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440)


def too_large_message() -> str:
    return f"the request body is larger than {body_limit_bytes():,} bytes; send fewer tasks per request"


def _summary(errors: Any) -> str:
    if isinstance(errors, dict):
        return "invalid input: " + ", ".join(str(key) for key in errors)
    return "invalid input"


def validation_body(errors: Any) -> dict[str, Any]:
    """A 400's body: the field-keyed errors plus the `detail` every error carries."""
    if isinstance(errors, list):
        errors = {"non_field_errors": errors}
    return {"detail": _summary(errors), **errors}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, BulkItemError):
        # A refusal of the service lines up with the submitted list, exactly like a field error.
        items: list[Any] = [{} for _ in range(exc.count)]
        items[exc.index] = as_serializer_error(exc.error)
        body = {"detail": f"task {exc.index} of the {exc.count} submitted was refused; nothing was stored",
                "tasks": items}  # fmt: skip
        if isinstance(exc.error, CodedValidationError):
            body["code"] = exc.error.api_code
        return Response(body, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, CodedValidationError):
        # Valid, but refused for good (e.g. a pool that could never run it): the code lets a pipeline tell
        # it from a typo.
        return Response(
            {**validation_body(as_serializer_error(exc)), "code": exc.api_code},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(as_serializer_error(exc))
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge(too_large_message())
    elif isinstance(exc, ApplicationError):
        return Response({"detail": exc.message}, status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.ValidationError):
        response.data = validation_body(response.data)
    return response


class ApiErrorMiddleware:
    """Under /api/, answer what Django itself refuses in JSON too: a body above the upload limit (413,
    before anything reads it), and any non-JSON error page (Django's HTML 404 for a URL no route
    matches, such as `/api/v1/tasks/abc/` or `/api/v1/tasks/-1/`; its 400 and 500 pages)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
        if length > body_limit_bytes():
            return JsonResponse({"detail": too_large_message()}, status=413)
        response = self.get_response(request)
        if response.status_code >= 400 and not response.get("Content-Type", "").startswith(
            "application/json"
        ):
            phrase = HTTPStatus(response.status_code).phrase if response.status_code in _KNOWN else "error"
            detail = {
                404: "no such resource (ids are positive integers)",
                500: "server error; the plane's log has the details",
            }.get(response.status_code, phrase.lower())
            json_response = JsonResponse({"detail": detail}, status=response.status_code)
            for header in ("Allow", "Retry-After", "WWW-Authenticate"):
                if header in response:
                    json_response[header] = response[header]
            return json_response
        return response


_KNOWN = {s.value for s in HTTPStatus}
