"""The task page's output box says what it holds: all of a short output ("4 lines", "1 line"), or the end
of a long one ("the last 200 lines"), never "the last 1 lines" for a run that printed one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from apps.dashboard.presenters import run_view


def _page(count: int, offset: int, complete: bool = True) -> SimpleNamespace:
    lines = [{"n": offset + i, "stream": "stdout", "text": f"line {i}"} for i in range(count)]
    return SimpleNamespace(
        attempt=0, attempts=[0] if count else [], lines=lines, offset=offset, next_offset=offset + count,
        complete=complete,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("count", "offset", "want"),
    [
        (0, 0, "No output yet"),
        (1, 0, "All of the output (1 line)"),
        (4, 0, "All of the output (4 lines)"),
        (200, 100, "The last 200 lines"),
        (1, 7, "The last line"),
    ],
    ids=["no output", "one line", "a short output", "the end of a long output", "one line after a cut"],
)
def test_the_output_note_says_whether_the_box_holds_all_of_it(count: int, offset: int, want: str) -> None:
    run = run_view(command=["sh"], env={}, exit_code=0, failure_reason="", page=_page(count, offset))
    assert run.tail_note == want
    assert run.from_first_line == (offset == 0)
