"""The profile-aware policy's code path never reaches the goodput replay's truth (whalegen/goodput/truth.py):
what it predicts of a service on a MIG slice, or of a co-location, comes from what production observes.

Read from the source (ast), following every `whalegen.*` import transitively, an import inside a function
as much as one at the top."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.whalegen.imports import imported_names

ROOT = Path(__file__).resolve().parents[3]
TRUTH = "whalegen.goodput.truth"
# The policy's entry points: the policy itself, and the decision step every caller (production cycle,
# replay, benchmarks) drives it through.
POLICY_PATH = ("whalegen.placement.aware", "whalegen.scheduling.decide", "whalegen.placement.engine")


def module_file(module: str) -> Path | None:
    """The source file of a `whalegen.*` module, or None when the dotted name is not a module."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(module: str) -> set[str]:
    """The `whalegen.*` modules `module` imports: `from a.b import c` counts a.b and, if c is a module,
    a.b.c; every package on the way counts too (importing a.b.c runs a/__init__ and a/b/__init__)."""
    path = module_file(module)
    assert path is not None, module
    found: set[str] = set()
    for name in imported_names(path):
        if not name.startswith("whalegen."):
            continue
        parts = name.split(".")
        for end in range(2, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if module_file(prefix) is not None:
                found.add(prefix)
    return found


def reachable(start: str) -> dict[str, str]:
    """Every module `start` reaches through imports → the module that imports it (for the path)."""
    parent: dict[str, str] = {start: ""}
    todo = [start]
    while todo:
        current = todo.pop()
        for nxt in sorted(imported_modules(current)):
            if nxt not in parent:
                parent[nxt] = current
                todo.append(nxt)
    return parent


def path_to(parent: dict[str, str], module: str) -> str:
    chain = [module]
    while parent[chain[-1]]:
        chain.append(parent[chain[-1]])
    return " → ".join(reversed(chain))


@pytest.mark.parametrize("entry", POLICY_PATH)
def test_the_policy_code_path_does_not_import_the_replay_truth(entry: str) -> None:
    parent = reachable(entry)
    assert TRUTH not in parent, "the policy reads the truth: " + path_to(parent, TRUTH)


def test_the_walker_finds_the_truth_where_it_is_imported() -> None:
    # The replay owns the truth: if the walker missed it there, the test above could not fail.
    parent = reachable("whalegen.goodput.replay")
    assert TRUTH in parent
    assert path_to(parent, TRUTH).startswith("whalegen.goodput.replay")
