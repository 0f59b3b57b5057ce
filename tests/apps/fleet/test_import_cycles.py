"""No import cycle runs through a fleet or workloads module (issue #40): the heartbeat's modules once
imported each other in a circle (fleet services → changes → liveness → services, and liveness → the
API views), held together by imports inside functions. Read from the source, imports inside functions
included, so such a cycle cannot hide in one again."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WATCHED = ("apps.fleet", "apps.workloads")


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "apps").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `apps` that `path` imports anywhere in it (top level or inside a function)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:
                    out.add(submodule)
                elif node.module in modules:
                    out.add(node.module)
    return out


def _cycle_through(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A shortest path of imports from `start` back to itself, or None."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imported in sorted(graph[module]):
                if imported == start:
                    return [*paths[module], start]
                if imported not in paths:
                    paths[imported] = [*paths[module], imported]
                    following.append(imported)
        frontier = following
    return None


def test_no_import_cycle_runs_through_a_fleet_or_workloads_module() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    cycles = [
        " → ".join(cycle)
        for name in sorted(modules)
        if name.startswith(WATCHED) and (cycle := _cycle_through(name, graph)) is not None
    ]
    assert cycles == []
