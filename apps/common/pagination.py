"""List pagination with `limit` / `offset` that are checked, not guessed.

DRF's LimitOffsetPagination silently falls back to the default for `limit=abc` and hands
`limit=99999999999999999999` to PostgreSQL (a 500: bigint out of range). Here a value that is not a
non-negative integer is a 400 naming the parameter; `limit` is capped at MAX_LIMIT (a page above it is
cut to it, as documented), `offset` at the largest row number PostgreSQL can skip.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from apps.common.fields import INT64_MAX

MAX_LIMIT = 1000


def _non_negative(request: Request, name: str, *, minimum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > INT64_MAX:
        raise ValidationError({name: [f"{name} must be an integer from {minimum} to {INT64_MAX}"]})
    value = int(raw)
    if value < minimum:
        raise ValidationError({name: [f"{name} must be at least {minimum}"]})
    return value


class CheckedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request: Request) -> int | None:
        value = _non_negative(request, self.limit_query_param, minimum=1)
        if value is None:
            return self.default_limit
        return min(value, self.max_limit)

    def get_offset(self, request: Request) -> int:
        return _non_negative(request, self.offset_query_param, minimum=0) or 0

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": INT64_MAX}
                parameter["description"] = (
                    f"Rows per page (default from the server; above {MAX_LIMIT} reads as {MAX_LIMIT})."
                )
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
        return parameters
