"""A lean way through task input validation for bodies that are plainly valid, built from the serializer
itself, with the serializer kept as the judge of everything else.

Why: DRF's field machinery (per-field `run_validation`, validators, error plumbing) was a fifth of a
bulk submission's CPU. Most bodies a pipeline sends are valid and use plain JSON values; for them the
outcome is known without that machinery. So:
- `FastInput(serializer)` reads the serializer's declared fields once (kinds, ranges, lengths, choices,
  defaults, `validate_<field>` methods) into small checks;
- `values(body)` returns exactly the validated data the serializer would, or None whenever the body is
  anything but plainly valid: an unknown field, a wrong type, a value out of range, a string the
  serializer would trim or refuse, a field kind it does not know. None means "ask the serializer", which
  then accepts or refuses with its own messages, so every error a client sees is unchanged.
It never accepts what the serializer refuses (tests/apps/workloads/test_fast_input.py checks this on
generated bodies, valid and not).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import (
    MaxLengthValidator,
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
    ProhibitNullCharactersValidator,
    RegexValidator,
)
from rest_framework import fields as f
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from apps.common.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictSlugField,
)

# A check returns the validated value, or raises _Ask when the serializer must judge.
Check = Callable[[Any], Any]
_SLUG = re.compile(r"^[-a-zA-Z0-9_]+\Z")
# What CharField refuses (NUL, lone surrogates); the JSON parser already refuses both, this is a second
# guard so the lean way never depends on it.
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
_STRING_VALIDATORS = (MaxLengthValidator, MinLengthValidator, ProhibitNullCharactersValidator,
                      ProhibitSurrogateCharactersValidator)  # fmt: skip


class _Ask(Exception):
    """This value needs the serializer's judgement."""


class _Unsupported(Exception):
    """A field this module does not model: bodies with it always go to the serializer."""


def _string_check(field: f.CharField) -> Check:
    slug = isinstance(field, StrictSlugField)
    allowed = (*_STRING_VALIDATORS, RegexValidator) if slug else _STRING_VALIDATORS
    if type(field) not in (StrictCharField, StrictSlugField) or any(
        not isinstance(v, allowed) for v in field.validators
    ):
        raise _Unsupported(field.field_name)
    max_length, min_length = field.max_length, field.min_length
    allow_blank, trim = field.allow_blank, field.trim_whitespace

    def check(value: Any) -> Any:
        if not isinstance(value, str) or _BAD_CHAR.search(value):
            raise _Ask
        if trim and value.strip() != value:
            raise _Ask  # the serializer would trim it (or call it blank): let it
        if value == "" and not allow_blank:
            raise _Ask
        if (max_length is not None and len(value) > max_length) or (
            min_length is not None and value and len(value) < min_length
        ):
            raise _Ask
        if slug and not _SLUG.match(value):  # DRF's slug pattern, or stricter (no trailing newline)
            raise _Ask
        return value

    return check


def _integer_check(field: f.IntegerField) -> Check:
    if type(field) is not StrictIntegerField or any(
        not isinstance(v, (MaxValueValidator, MinValueValidator)) for v in field.validators
    ):
        raise _Unsupported(field.field_name)
    low, high = field.min_value, field.max_value

    def check(value: Any) -> Any:
        if type(value) is not int or (low is not None and value < low) or (high is not None and value > high):
            raise _Ask
        return value

    return check


def _choice_check(field: f.ChoiceField) -> Check:
    if type(field) is not StrictChoiceField or field.validators or field.allow_blank:
        raise _Unsupported(field.field_name)
    choices = {key: key for key in field.choices if isinstance(key, str)}

    def check(value: Any) -> Any:
        if type(value) is not str or value not in choices:
            raise _Ask
        return choices[value]

    return check


def _boolean_check(field: f.BooleanField) -> Check:
    if type(field) is not StrictBooleanField or field.validators:
        raise _Unsupported(field.field_name)

    def check(value: Any) -> Any:
        if type(value) is not bool:
            raise _Ask
        return value

    return check


def _list_length(value: Any, allow_empty: bool, min_length: int | None, max_length: int | None) -> None:
    """A list of an allowed length, or _Ask (what ListField and a many=True serializer check alike)."""
    if type(value) is not list or (not value and not allow_empty):
        raise _Ask
    if (max_length is not None and len(value) > max_length) or (
        min_length is not None and len(value) < min_length
    ):
        raise _Ask


def _list_check(field: f.ListField) -> Check:
    if type(field) is not serializers.ListField or any(
        not isinstance(v, (MaxLengthValidator, MinLengthValidator)) for v in field.validators
    ):
        raise _Unsupported(field.field_name)
    child = _value_check(field.child)
    max_length, min_length, allow_empty = field.max_length, field.min_length, field.allow_empty

    def check(value: Any) -> Any:
        _list_length(value, allow_empty, min_length, max_length)
        return [child(item) for item in value]

    return check


def _dict_check(field: f.DictField) -> Check:
    if type(field) is not serializers.DictField or field.validators or not field.allow_empty:
        raise _Unsupported(field.field_name)
    child = _value_check(field.child)

    def check(value: Any) -> Any:
        if type(value) is not dict or any(type(key) is not str for key in value):
            raise _Ask
        return {key: child(item) for key, item in value.items()}

    return check


def _many_check(field: serializers.ListSerializer) -> Check:
    if not isinstance(field.child, StrictInputSerializer) or field.validators:
        raise _Unsupported(field.field_name)
    if type(field).validate is not serializers.ListSerializer.validate:
        raise _Unsupported(field.field_name)
    child = FastInput(field.child)
    max_length, min_length, allow_empty = field.max_length, field.min_length, field.allow_empty

    def check(value: Any) -> Any:
        _list_length(value, allow_empty, min_length, max_length)
        items = []
        for item in value:
            validated = child.values(item)
            if validated is None:
                raise _Ask
            items.append(validated)
        return items

    return check


def _value_check(field: f.Field) -> Check:
    if field.read_only or (field.field_name and field.source != field.field_name):
        raise _Unsupported(field.field_name)
    if isinstance(field, serializers.ListSerializer):
        check = _many_check(field)
    elif isinstance(field, f.CharField):
        check = _string_check(field)
    elif isinstance(field, f.IntegerField):
        check = _integer_check(field)
    elif isinstance(field, f.ChoiceField):
        check = _choice_check(field)
    elif isinstance(field, f.BooleanField):
        check = _boolean_check(field)
    elif isinstance(field, f.ListField):
        check = _list_check(field)
    elif isinstance(field, f.DictField):
        check = _dict_check(field)
    else:
        raise _Unsupported(field.field_name)
    if not field.allow_null:
        return check

    def nullable(value: Any) -> Any:
        return None if value is None else check(value)

    return nullable


class FastInput:
    """Validated data for plainly valid bodies of one input serializer; None sends a body to it."""

    def __init__(self, serializer: StrictInputSerializer) -> None:
        self._serializer = serializer
        self._known = frozenset(serializer.fields)
        self._fields: list[tuple[str, Check, bool, Any, Callable[[Any], Any] | None]] = []
        self._usable = (
            type(serializer).validate is serializers.Serializer.validate and not serializer.validators
        )
        for name, field in serializer.fields.items():
            try:
                check = _value_check(field)
            except _Unsupported:
                self._usable = False
                break
            has_default = field.default is not f.empty
            if has_default and callable(field.default):
                self._usable = False  # a callable default may differ per call
                break
            validate = getattr(serializer, f"validate_{name}", None)
            self._fields.append((name, check, field.required, field.default if has_default else f.empty,
                                 validate))  # fmt: skip

    def values(self, body: Any) -> dict[str, Any] | None:
        if not self._usable or type(body) is not dict or not self._known.issuperset(body):
            return None
        result: dict[str, Any] = {}
        try:
            for name, check, required, default, validate in self._fields:
                if name in body:
                    value = check(body[name])
                elif required:
                    return None
                elif default is f.empty:
                    continue
                else:
                    value = default
                if validate is not None:
                    value = validate(value)
                result[name] = value
        except (_Ask, serializers.ValidationError, DjangoValidationError):
            return None
        return result
