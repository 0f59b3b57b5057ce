"""Input fields that take JSON as it was sent: no coercion of numbers into strings (or strings into
numbers), ranges that fit the database column behind the field, and input serializers that refuse
unknown fields instead of dropping them.

Why strict: a pipeline that sends `"gpu_count": "2"` or `"command": [1, 2]` has a bug; storing
`["1", "2"]` hides it until the task fails on a node. A 400 naming the field shows it at submission.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

# Column ranges (PostgreSQL): a value outside them would be a DataError (500) at INSERT.
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1
INT16_MAX = 2**15 - 1


class StrictCharField(serializers.CharField):
    """A string, only a string (DRF's CharField turns 123 into "123")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictSlugField(serializers.SlugField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictChoiceField(serializers.ChoiceField):
    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer (not "5", not 5.0, not true) within the range of its column (int32 unless told)."""

    default_error_messages = {"invalid": "A valid integer is required (a JSON number, not a string)."}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", INT32_MAX)
        kwargs.setdefault("min_value", INT32_MIN)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false (DRF's BooleanField also takes "yes", "1", 1)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that refuses fields it does not know, naming each (a typo such as `gpu_cont`
    would otherwise silently fall back to the default)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                known = ", ".join(sorted(self.fields))
                raise serializers.ValidationError(
                    {name: [f"unknown field; this request takes: {known}"] for name in unknown}
                )
        return super().to_internal_value(data)
