"""Reading a module's imports from its source (ast), for the tests that check what the core imports: an
import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_names(path: Path) -> list[str]:
    """Every absolute dotted name the file at `path` imports: `import a.b` gives a.b; `from a.b import c`
    gives a.b and a.b.c (c may be a module or a name in a.b: the caller knows which it wants). Relative
    imports are left out (the core writes none)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names
