"""The line above `whalegen replay`'s table names the seeds and how many runs each mean is over: the
README's one-seed run printed "seeds 42 (1 runs)"."""

from __future__ import annotations

import pytest

from whalegen.commands.replay import seeds_text


@pytest.mark.parametrize(
    ("seeds", "want"),
    [
        ([42], "seed 42 (1 run)"),
        (list(range(42, 52)), "seeds 42–51 (10 runs)"),
        ([7, 3], "seeds 3–7 (2 runs)"),
    ],
    ids=["one seed", "the README's ten seeds", "seeds given out of order"],
)
def test_the_summary_line_counts_seeds_and_runs_in_words(seeds: list[int], want: str) -> None:
    assert seeds_text(seeds) == want
