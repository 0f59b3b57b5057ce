"""The core packages import each other in one direction only: their package graph has no cycle.

Read from the source (ast), so an import inside a function counts as much as one at the top: a cycle
through a late import is still a cycle a reader has to hold in their head.
"""

from __future__ import annotations

from pathlib import Path

from tests.whalegen.imports import imported_names

ROOT = Path(__file__).resolve().parents[2]
CORE = ("gpus", "placement", "scheduling", "goodput", "sim", "forecast")


def _imports(path: Path) -> set[str]:
    """The core packages `path` imports (absolute imports only: the core writes no relative ones)."""
    found: set[str] = set()
    for name in imported_names(path):
        parts = name.split(".")
        if len(parts) > 1 and parts[0] == "whalegen" and parts[1] in CORE:
            found.add(parts[1])
    return found


def package_graph() -> dict[str, set[str]]:
    """Package → the other core packages any of its modules imports."""
    graph: dict[str, set[str]] = {}
    for package in CORE:
        edges: set[str] = set()
        for path in sorted((ROOT / "whalegen" / package).rglob("*.py")):
            edges |= _imports(path)
        graph[package] = edges - {package}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as a path (`a → b → a`), or [] when the graph is acyclic (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_core_packages_form_no_import_cycle() -> None:
    cycle = find_cycle(package_graph())
    assert cycle == [], "core package import cycle: " + " → ".join(cycle)


def test_the_cycle_finder_sees_a_cycle_and_a_clean_chain() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_gpus_is_the_bottom_of_the_core() -> None:
    assert package_graph()["gpus"] == set()
