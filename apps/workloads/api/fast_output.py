"""A lean way out: a ModelSerializer's `to_representation`, planned once from its own fields.

Why: DRF shows an object field by field through `get_attribute` (a walk over `source_attrs` with its
exception handling), a None check and the field's `to_representation`; for the 41 fields of a task
that was a quarter of a bulk submission's CPU (docs/api.md, "Submission speed"). The plan reads each
attribute directly and converts the common field types inline, exactly as their `to_representation`
does; every other field type (dates, booleans, nested serializers) is still shown by its own field.
The answer is the serializer's, key for key and value for value: `tests/apps/workloads/
test_fast_output.py` compares the two on tasks in every shape the API shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import serializers

_Convert = Callable[[Any], Any]


def _choice(field: serializers.ChoiceField) -> _Convert:
    lookup = field.choice_strings_to_values

    def convert(value: Any) -> Any:
        if value == "":
            return value
        return lookup.get(str(value), value)

    return convert


def _slug(slug_field: str) -> _Convert:
    return lambda related: getattr(related, slug_field)


def _identity(value: Any) -> Any:
    return value


def _converter(field: serializers.Field) -> _Convert:
    kind = type(field)
    if kind is serializers.IntegerField:
        return int
    if kind is serializers.FloatField:
        return float
    if kind is serializers.CharField:
        return str
    if kind is serializers.ChoiceField:
        return _choice(field)  # type: ignore[arg-type]
    if kind is serializers.JSONField and not field.binary:  # type: ignore[attr-defined]
        return _identity
    if kind is serializers.SlugRelatedField and "__" not in field.slug_field:  # type: ignore[attr-defined]
        return _slug(field.slug_field)  # type: ignore[attr-defined]
    return field.to_representation


class FastOutput:
    """`FastOutput(serializer).to_representation(obj)` == `serializer.to_representation(obj)` for a
    serializer whose readable fields each read one attribute (no dotted sources, no `source="*"`)."""

    def __init__(self, serializer: serializers.Serializer) -> None:
        self._plan: list[tuple[str, str, _Convert]] = []
        for name, field in serializer.fields.items():
            if field.write_only:
                continue
            if len(field.source_attrs) != 1:
                raise ValueError(f"{name}: a dotted or '*' source is not planned here")
            self._plan.append((name, field.source_attrs[0], _converter(field)))

    def to_representation(self, obj: Any) -> dict[str, Any]:
        shown: dict[str, Any] = {}
        for name, attr, convert in self._plan:
            try:
                value = getattr(obj, attr)
            except ObjectDoesNotExist:  # a reverse one-to-one not there (a task without a forecast)
                value = None
            shown[name] = None if value is None else convert(value)
        return shown
