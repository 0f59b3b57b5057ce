"""ARCHITECTURE §1 import rules, enforced by reading the source and by importing in a clean process."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = [
    "whalegen/gpus",
    "whalegen/placement",
    "whalegen/scheduling",
    "whalegen/forecast",
    "whalegen/sim",
    "whalegen/goodput",
    "whalegen/protocol.py",
    "whalegen/logformat.py",
]
FORBIDDEN_IN_PURE = {"django", "celery", "rest_framework", "django_filters", "drf_spectacular", "apps"}
PRODUCT_PACKAGES = {"whalegen", "apps", "agents"}


def _python_files(rel: str) -> list[Path]:
    path = ROOT / rel
    if path.is_file():
        return [path]
    return sorted(path.rglob("*.py")) if path.exists() else []


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", PURE)
def test_pure_core_never_imports_django_celery_or_apps(package: str) -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _python_files(package)
        for line, module in _imported_modules(path)
        if module.split(".")[0] in FORBIDDEN_IN_PURE
    ]
    assert offences == []


def test_agent_imports_only_gpus_and_protocol_from_the_product() -> None:
    allowed = ("whalegen.gpus", "whalegen.protocol", "whalegen.logformat", "agents")
    offences = []
    for path in _python_files("agents"):
        for line, module in _imported_modules(path):
            top = module.split(".")[0]
            if top in {"django", "celery", "rest_framework"} or (
                top in PRODUCT_PACKAGES and not module.startswith(allowed) and module != "whalegen"
            ):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert offences == []


def test_pure_core_loads_in_a_process_without_django() -> None:
    modules = [
        "whalegen.gpus", "whalegen.placement", "whalegen.forecast", "whalegen.sim", "whalegen.goodput",
        "whalegen.logformat",
    ]  # fmt: skip
    if (ROOT / "whalegen" / "protocol.py").exists():
        modules.append("whalegen.protocol")
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(FORBIDDEN_IN_PURE)!r})\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_apps_common_imports_no_other_app() -> None:
    # apps/common is the bottom layer every app builds on (errors, the API's error shape, pagination,
    # parsers): an import of an app from it would tie every app to that one.
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _python_files("apps/common")
        for line, module in _imported_modules(path)
        if module.split(".")[0] == "apps" and module.split(".")[1:2] != ["common"]
    ]
    assert offences == []


def _app_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importing app, imported app) for every import of one app by another under apps/,
    at module level or inside a function; migrations aside (they name other apps' migrations by design)."""
    found = []
    for path in _python_files("apps"):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 3 or "migrations" in rel.parts:
            continue  # apps/api_urls.py gathers every app's URLs: it is the project's, not an app's
        for line, module in _imported_modules(path):
            parts = module.split(".")
            if parts[0] == "apps" and len(parts) > 1 and parts[1] != rel.parts[1]:
                found.append((str(rel), line, rel.parts[1], parts[1]))
    return found


def test_every_app_is_in_the_written_order() -> None:
    from apps import LAYERS

    on_disk = {p.parent.name for p in (ROOT / "apps").glob("*/__init__.py")}
    assert sorted(on_disk - set(LAYERS)) == []


def test_apps_import_only_apps_below_them_in_the_written_order() -> None:
    # ARCHITECTURE §1 and docs/architecture.md: apps import each other only downward, in apps.LAYERS. A lower
    # app that must reach a higher one calls a hook of apps/common/hooks.py, which the higher app fills.
    from apps import LAYERS

    rank = {app: i for i, app in enumerate(LAYERS)}
    offences = [
        f"{path}:{line} ({importer}) imports {imported}, which is not below it in apps.LAYERS"
        for path, line, importer, imported in _app_imports()
        if rank.get(imported, len(rank)) >= rank.get(importer, -1)
    ]
    assert offences == []


def test_every_hook_has_its_function_once_the_apps_are_ready() -> None:
    # A lower app's call into a higher one goes through apps/common/hooks.py; the higher app registers the
    # function in its AppConfig.ready. One left unregistered would fail only when its path first runs.
    import django
    from django.apps import apps as registry

    from apps.common import hooks

    django.setup()
    assert registry.ready
    assert [hook.name for hook in hooks.ALL if not hook.registered] == []
    for hook in hooks.ALL:
        assert f"apps.{hook.registered_by}" in {config.name for config in registry.get_app_configs()}
