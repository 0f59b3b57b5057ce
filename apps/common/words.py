"""Small helpers for the sentences refusals and reasons are written in."""

from __future__ import annotations


def plural(count: int, word: str) -> str:
    """`1 node`, `3 nodes`: the count with the word in the number it agrees with."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
