"""Small display filters: milli-GPUs as GPUs, seconds as a readable duration."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def gpus(milli: int | None) -> str:
    """1000 milli-GPUs → "1", 2500 → "2.5", 125 → "0.125"."""
    if milli is None:
        return "–"
    return f"{milli / 1000:.3f}".rstrip("0").rstrip(".")


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as the two largest units: "45 s", "12 min 5 s", "3 h 12 min", "2 d 4 h"."""
    if seconds is None:
        return "–"
    total = round(seconds)
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if total >= size or (unit == "s" and not parts):
            parts.append(f"{total // size} {unit}")
            total %= size
    return " ".join(parts[:2])
