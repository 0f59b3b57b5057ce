"""DRF exception handler: one shape for every error the API returns.

Validation errors keep DRF's field-keyed shape (`{"gpu_milli": ["…"]}`) so a pipeline can show the
message next to the field it concerns; every other error is `{"detail": "…"}`.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler

from apps.common.errors import ApplicationError
from apps.workloads.services import BulkItemError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, BulkItemError):
        # Errors line up with the submitted list, as DRF does for a list serializer.
        items: list[Any] = [{} for _ in range(exc.count)]
        items[exc.index] = as_serializer_error(exc.error)
        exc = exceptions.ValidationError({"tasks": items})
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(as_serializer_error(exc))
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, ApplicationError):
        return Response({"detail": exc.message}, status=exc.status)
    return drf_exception_handler(exc, context)
