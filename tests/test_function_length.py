"""No function of the product over 100 lines (issue 40): a reader holds a function in their head, and a
long one is split into named steps. Benchmarks, tests and migrations are not the product."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apps", "whalegen", "agents")
NOT_PRODUCT = {"migrations", "benchmarks", "tests"}
MAX_LINES = 100  # from the `def` line to the last line of the body, as ast counts them

# Functions allowed over the limit for now, each with why; `path::qualified name`. An entry goes once
# its function is split: keep this list empty, never grow it to make the test pass.
ALLOWED: dict[str, str] = {}


def _functions(
    tree: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, nested ones included, with its qualified name (`Class.method`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _product_files() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if not NOT_PRODUCT & set(path.relative_to(ROOT).parts)
    )


def test_no_function_is_over_100_lines() -> None:
    offenders = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), filename=rel)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_LINES and f"{rel}::{name}" not in ALLOWED:
                offenders.append(f"{rel}:{node.lineno} {name} is {lines} lines")
    assert offenders == [], "split these into named steps:\n" + "\n".join(offenders)


def test_the_check_reads_the_product() -> None:
    # A wrong root or package list would find nothing and pass whatever the code looks like.
    files = [path.relative_to(ROOT).as_posix() for path in _product_files()]
    assert "apps/scheduling/services.py" in files
    assert "whalegen/placement/engine.py" in files
    assert not [f for f in files if "/migrations/" in f]
