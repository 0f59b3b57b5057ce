from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.accounting.selectors import GROUPS
from whalegen.gpus import model_names


@extend_schema_field({"type": "string", "example": "2026-12-01"})
class InstantField(serializers.Field):
    """A date (its midnight, UTC) or an ISO-8601 date-time (UTC when it names no zone)."""

    default_error_messages = {"invalid": "expected a date (2026-12-01) or an ISO-8601 date-time"}

    def to_internal_value(self, data: Any) -> datetime:
        text = str(data).strip()
        try:
            moment = parse_datetime(text)
            day = None if moment is not None else parse_date(text)
        except ValueError:
            self.fail("invalid")
        if moment is None and day is None:
            self.fail("invalid")
        if moment is None:
            assert isinstance(day, date)
            moment = datetime.combine(day, time(), tzinfo=UTC)
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

    def to_representation(self, value: datetime) -> str:
        return value.isoformat()


class CommaListField(serializers.CharField):
    """`a,b,c` → ["a", "b", "c"] (blank items dropped)."""

    def to_internal_value(self, data: Any) -> list[str]:  # type: ignore[override]
        text = super().to_internal_value(data)
        return [item.strip() for item in text.split(",") if item.strip()]


class AccountingQuerySerializer(serializers.Serializer):
    start = InstantField(
        label="From",
        required=False,
        help_text="first instant counted (a date is its midnight UTC); default: this month's start",
    )
    end = InstantField(
        label="To", required=False, help_text="first instant not counted (exclusive); default: now"
    )
    tenant = CommaListField(required=False, help_text="only these tenants (slugs, comma-separated)")
    queue = CommaListField(required=False, help_text="only queues of these names (comma-separated)")
    pool = CommaListField(required=False, help_text="only these pools (comma-separated)")
    gpu_model = CommaListField(required=False, help_text="only these GPU models (catalogue names)")
    group_by = CommaListField(
        required=False, help_text=f"group rows by any of {', '.join(GROUPS)} (comma-separated, in that order)"
    )
    format = serializers.ChoiceField(
        choices=["json", "csv"], required=False, help_text="csv: the rows as CSV (or send Accept: text/csv)"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # `from` and `to` are Python keywords: the fields are declared as start/end and renamed here.
        self.fields["from"] = self.fields.pop("start")  # keeps its source, `start`
        self.fields["to"] = self.fields.pop("end")

    def validate_group_by(self, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in GROUPS]
        if unknown:
            raise serializers.ValidationError(
                f"cannot group by {', '.join(unknown)}; choose from {', '.join(GROUPS)}"
            )
        if len(set(value)) != len(value):
            raise serializers.ValidationError("name each group once")
        return value

    def validate_gpu_model(self, value: list[str]) -> list[str]:
        known = set(model_names())
        unknown = [name for name in value if name not in known]
        if unknown:
            raise serializers.ValidationError(f"unknown GPU model {', '.join(unknown)}")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start, end = attrs.get("start"), attrs.get("end")
        if start is not None and end is not None and start >= end:
            raise serializers.ValidationError({"to": ["must be after from"]})
        return attrs


class UsageRowSerializer(serializers.Serializer):
    tenant = serializers.CharField(required=False, help_text="when grouped by tenant")
    queue = serializers.CharField(required=False, help_text="tenant/queue, when grouped by queue")
    pool = serializers.CharField(required=False, help_text="when grouped by pool")
    gpu_model = serializers.CharField(required=False, help_text="when grouped by GPU model")
    gpu_hours = serializers.FloatField(help_text="GPU-hours held, fractions at what was held")
    tasks = serializers.IntegerField(help_text="tasks that held GPUs in the range")
    cost = serializers.FloatField(
        allow_null=True, help_text="gpu_hours × price per model; null: no prices set"
    )
    unpriced_gpu_hours = serializers.FloatField(help_text="GPU-hours on models without a price (not in cost)")


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateTimeField(label="From")
    end = serializers.DateTimeField(label="To", help_text="as asked; usage is counted up to now at most")
    group_by = serializers.ListField(child=serializers.CharField())
    currency = serializers.CharField(allow_null=True)
    rows = UsageRowSerializer(many=True)
    total = UsageRowSerializer()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = self.fields.pop("start")  # keeps its source, `start`
        self.fields["to"] = self.fields.pop("end")


class BudgetChangeSerializer(serializers.Serializer):
    at = serializers.DateTimeField(source="created_at")
    actor = serializers.CharField()
    old_gpu_hours = serializers.FloatField(allow_null=True)
    new_gpu_hours = serializers.FloatField()
    reason = serializers.CharField()


class BudgetOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="budget.pk")
    tenant = serializers.CharField(source="budget.quota.tenant.slug")
    pool = serializers.CharField(source="budget.quota.pool.name")
    period = serializers.CharField(source="budget.period")
    gpu_hours = serializers.FloatField(source="budget.gpu_hours", help_text="the limit per period")
    used_gpu_hours = serializers.FloatField(source="used_gpu_h", help_text="used in the current period")
    spent = serializers.BooleanField(help_text="new admissions stop while true")
    changes = BudgetChangeSerializer(source="budget.changes.all", many=True)


class BudgetSetInputSerializer(serializers.Serializer):
    tenant = serializers.SlugField()
    pool = serializers.SlugField()
    gpu_hours = serializers.FloatField(min_value=0, help_text="GPU-hours per calendar month (UTC)")
    reason = serializers.CharField(max_length=500, help_text="kept in the audit trail")
