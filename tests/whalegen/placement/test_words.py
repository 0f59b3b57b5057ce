"""Amounts in the words a request was written in: GPUs, never milli-GPUs."""

from __future__ import annotations

import pytest

from whalegen.placement.words import gpus_text, quota_wait_text


@pytest.mark.parametrize(
    ("milli", "words"),
    [(0, "0 GPUs"), (250, "0.25 GPU"), (1000, "1 GPU"), (1500, "1.5 GPUs"), (12_000, "12 GPUs")],
)
def test_milli_gpus_read_as_gpus(milli: int, words: str) -> None:
    assert gpus_text(milli) == words


def test_a_quota_wait_says_what_is_held_what_is_asked_and_how_much_must_end() -> None:
    assert quota_wait_text(
        tenant="ml", held_milli=11_500, asked_milli=2000, guaranteed_milli=8000, borrow_milli=4000
    ) == (
        "quota: tenant ml holds 11.5 GPUs in this pool, its limit is 12 GPUs (8 GPUs guaranteed + 4 GPUs "
        "borrowable), and this task asks 2 GPUs; it fits once 1.5 GPUs of the tenant's work ends"
    )
