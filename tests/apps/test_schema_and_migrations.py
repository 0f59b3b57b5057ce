"""NetBox-style drift checks: the committed OpenAPI document and the migrations match the code."""

from __future__ import annotations

import difflib
from io import StringIO
from pathlib import Path

from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "openapi.yaml"
REGENERATE = "SECRET_KEY=x python manage.py spectacular --file docs/openapi.yaml --validate"


def test_the_committed_openapi_document_matches_the_code(tmp_path: Path) -> None:
    fresh = tmp_path / "openapi.yaml"
    call_command("spectacular", "--file", str(fresh), "--validate", "--fail-on-warn")
    committed = SCHEMA.read_text() if SCHEMA.exists() else ""
    diff = list(
        difflib.unified_diff(committed.splitlines(), fresh.read_text().splitlines(), "committed", "code", n=1)
    )
    assert not diff, f"docs/openapi.yaml is stale; regenerate it with `{REGENERATE}`\n" + "\n".join(diff[:60])


def test_the_models_need_no_new_migration(db: None) -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out)
    except SystemExit as exc:
        raise AssertionError(
            f"models and migrations differ; run `python manage.py makemigrations`\n{out.getvalue()}"
        ) from exc
