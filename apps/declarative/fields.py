"""How one value of a document is read: each parser takes what YAML gave and returns the value in its
document form, or raises `FieldError` with a sentence that says what is accepted.

Document form is what `get -o yaml` prints and `apply` compares: GPUs as numbers of GPUs (`8`, `0.5`),
never milli, so a diff reads `spec.guaranteed_gpus: 8 → 16`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

Parser = Callable[[Any], Any]

MILLI_PER_GPU = 1000
# Label keys and values as Kubernetes takes them (an optional DNS prefix, then a name of 63 characters).
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class FieldError(Exception):
    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path  # below the field that raised it: "[2].model"


def _what(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return "a list" if isinstance(value, list) else "a mapping"


def text(max_length: int, *, blank: bool = True) -> Parser:
    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise FieldError(f"is {_what(value)}; write text (in quotes if it looks like a number)")
        if not blank and not value.strip():
            raise FieldError("is blank; write a value")
        if len(value) > max_length:
            raise FieldError(f"is longer than {max_length} characters")
        return value

    return parse


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"is {_what(value)}; write true or false")
    return value


def integer(minimum: int, maximum: int = 2**31 - 1) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(f"is {_what(value)}; write a whole number without quotes")
        if not minimum <= value <= maximum:
            raise FieldError(f"is {value}; write a number from {minimum} to {maximum}")
        return value

    return parse


def optional(parser: Parser) -> Parser:
    def parse(value: Any) -> Any:
        return None if value is None else parser(value)

    return parse


def choice(values: Sequence[str]) -> Parser:
    def parse(value: Any) -> str:
        if value not in values:
            raise FieldError(f"is {_what(value)}; write one of {', '.join(values)}")
        return value

    return parse


def text_list(max_length: int) -> Parser:
    item = text(max_length, blank=False)

    def parse(value: Any) -> list[str]:
        if not isinstance(value, list):
            raise FieldError(f"is {_what(value)}; write a list: [a, b]")
        out = []
        for index, entry in enumerate(value):
            try:
                out.append(item(entry))
            except FieldError as exc:
                raise FieldError(exc.message, f"[{index}]") from None
        return out

    return parse


def gpus(value: Any) -> int | float:
    """A number of GPUs, whole or in thousandths (0.25 is 250 milli-GPUs); stored as milli."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"is {_what(value)}; write a number of GPUs, e.g. 8 or 0.5")
    if value < 0:
        raise FieldError(f"is {value}; a number of GPUs is 0 or more")
    milli = value * MILLI_PER_GPU
    if abs(milli - round(milli)) > 1e-6:
        raise FieldError(f"is {value}; GPUs are counted in thousandths (milli-GPUs): at most 3 decimals")
    return gpus_from_milli(round(milli))


def gpus_from_milli(milli: int) -> int | float:
    """The document form of a milli-GPU count: an int when whole (8, not 8.0)."""
    return milli // MILLI_PER_GPU if milli % MILLI_PER_GPU == 0 else milli / MILLI_PER_GPU


def gpus_to_milli(value: int | float) -> int:
    return round(value * MILLI_PER_GPU)


def number(minimum: float) -> Parser:
    def parse(value: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(f"is {_what(value)}; write a number")
        if value < minimum:
            raise FieldError(f"is {value}; write {minimum:g} or more")
        return value

    return parse


def labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise FieldError(f"is {_what(value)}; write a mapping: {{KEY: value}}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise FieldError(
                "is not a label key (letters, digits, -_. and an optional dns/ prefix)", f".{key}"
            )
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            raise FieldError(f"is {_what(item)}; label values are text: quote it", f".{key}")
        if not isinstance(item, str) or not _LABEL_VALUE.match(item):
            raise FieldError("is not a label value (63 letters, digits or -_. at most)", f".{key}")
        out[key] = item
    return out
