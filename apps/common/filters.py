"""Query filters shared by the list endpoints."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 instant, handed to the database in UTC.

    Python accepts UTC offsets up to ±23:59, PostgreSQL only ±15:59 (a 500 on main for
    `created_after=2026-01-01T00:00:00+16:00`); an instant in UTC always fits. One that falls outside
    years 1–9999 once in UTC cannot be represented at all: a 400.
    """

    default_error_messages = {
        "out_of_range": "%(value)s is outside the years 1–9999 once converted to UTC",
    }

    def to_python(self, value: Any) -> datetime | None:
        try:
            parsed = super().to_python(value)
            return parsed.astimezone(UTC) if parsed is not None and parsed.tzinfo is not None else parsed
        except OverflowError as exc:
            raise forms.ValidationError(
                self.error_messages["out_of_range"], code="out_of_range", params={"value": value}
            ) from exc


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField
