"""`whalegen apply --local`: the operator's path on the plane's database, with no token — how an empty
database gets the tenant its first API token is scoped to (tests/e2e/test_no_shell.py runs it in a
fresh process against a fresh plane; here in process, on the test database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from whalegen.cli import main

FIRST = "kind: Tenant\nmetadata: {name: ml}\nspec: {display_name: Machine learning}\n"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_client_settings(monkeypatch):
    monkeypatch.delenv("WHALEGEN_URL", raising=False)
    monkeypatch.delenv("WHALEGEN_TOKEN", raising=False)


def test_local_apply_makes_the_first_tenant_without_a_token_and_again_changes_nothing(
    db, no_client_settings, capsys, tmp_path: Path
) -> None:
    from apps.declarative.models import AppliedObject
    from apps.tenants.models import Tenant

    (tmp_path / "first.yaml").write_text(FIRST)
    assert _run(capsys, "apply", "--local", "-f", str(tmp_path / "first.yaml")) == (
        0,
        "tenant/ml created\n",
        "",
    )
    assert Tenant.objects.get(slug="ml").name == "Machine learning"
    record = AppliedObject.objects.get()
    assert (record.source, record.applied_by) == (f"{tmp_path / 'first.yaml'}#1", "system")
    code, out, _ = _run(capsys, "apply", "--local", "-f", str(tmp_path / "first.yaml"))
    assert (code, out) == (0, "tenant/ml unchanged\n")


def test_local_apply_lists_invalid_documents_and_writes_nothing(
    db, no_client_settings, capsys, tmp_path: Path
) -> None:
    from apps.tenants.models import Tenant

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        FIRST + "---\nkind: Quota\nmetadata: {tenant: ml, pool: p}\nspec: {guaranteed_gpus: eight}\n"
    )
    code, out, err = _run(capsys, "apply", "--local", "-f", str(bad))
    assert code == 65 and out == ""
    assert "nothing was applied" in err
    assert f"{bad}#2 spec.guaranteed_gpus: is the string 'eight'; write a number of GPUs" in err
    assert not Tenant.objects.exists()


def test_local_apply_refuses_a_server_or_token(no_client_settings, capsys, tmp_path: Path) -> None:
    (tmp_path / "first.yaml").write_text(FIRST)
    code, _, err = _run(
        capsys, "apply", "--local", "--server", "http://x", "-f", str(tmp_path / "first.yaml")
    )
    assert code == 65 and "drop --server/--token" in err
