"""Small display filters: milli-GPUs as GPUs, seconds as a readable duration, codes as words."""

from __future__ import annotations

from datetime import datetime

from django import template

from apps.dashboard.words import node_state_label, reason_label

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


@register.filter
def reason(code: str | None) -> str:
    """A why-pending code as words ("needs_layout_change" → "only a new MIG layout would fit")."""
    return reason_label(code)


@register.filter
def node_state(state: str) -> str:
    return node_state_label(state)


@register.filter
def age(since: datetime | None, now: datetime) -> str:
    """How long ago, as `duration` writes it; "–" when never."""
    if since is None:
        return "–"
    return duration(max(0.0, (now - since).total_seconds()))
