"""`whalegen apply`, `get` and `describe` against a live plane (pytest-django's live server): the
example fleet applied, read back with `get -o yaml` and applied again unchanged, dry-run differences,
refusals and invalid documents as a person reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from whalegen.cli import main

FLEET = Path(__file__).resolve().parents[3] / "docs" / "examples" / "fleet.yaml"


@pytest.fixture
def plane(live_server, transactional_db, monkeypatch):
    """The live server's URL and a platform admin's token, in the environment the CLI reads."""
    from apps.tenants.services import tenant_create, token_create
    from tests.apps.factories import UserFactory

    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    _, raw = token_create(user=root, tenant=tenant_create(slug="ops", name="Ops"), name="cli")
    monkeypatch.setenv("WHALEGEN_URL", live_server.url)
    monkeypatch.setenv("WHALEGEN_TOKEN", raw)
    return live_server.url


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_get_yaml_of_every_kind_applies_back_unchanged(plane, capsys, tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "apply", "-f", str(FLEET))
    assert code == 0, out
    assert "pool/h100-train created" in out and "quota/vision/h100-train created" in out
    for kind in ("cl", "pool", "no", "tn", "mem", "q", "quo", "bu", "price"):
        code, out, _ = _run(capsys, "get", kind, "-o", "yaml")
        assert code == 0
        (tmp_path / f"{kind}.yaml").write_text(out)
    code, out, _ = _run(capsys, "apply", "-f", str(tmp_path))
    assert code == 0
    lines = out.splitlines()
    assert lines and all(line.endswith(" unchanged") for line in lines), out


def test_a_dry_run_prints_old_and_new_and_changes_nothing(plane, capsys, tmp_path: Path) -> None:
    _run(capsys, "apply", "-f", str(FLEET))
    was = "spec: {pool: h100-train, default_priority: 10, weight: 2}"
    changed = FLEET.read_text().replace(was, was.replace("weight: 2", "weight: 5"))
    assert changed != FLEET.read_text()
    (tmp_path / "fleet.yaml").write_text(changed)
    code, out, _ = _run(capsys, "apply", "-f", str(tmp_path / "fleet.yaml"), "--dry-run")
    assert code == 0
    assert "queue/vision/train configured (dry run)\n  spec.weight: 2 → 5" in out
    code, out, _ = _run(capsys, "get", "queue", "vision/train", "-o", "json")
    assert '"weight": 2' in out


def test_get_lists_tables_with_short_names_and_label_selectors(plane, capsys) -> None:
    _run(capsys, "apply", "-f", str(FLEET))
    code, out, _ = _run(capsys, "get", "no", "-l", "gpu=L4")
    assert code == 0
    assert out.splitlines()[0].split() == ["NAME", "POOL", "STATE", "CORDONED"]
    assert sorted(line.split()[0] for line in out.splitlines()[1:]) == [
        "eu-west-1/eu-l4-01", "eu-west-1/eu-l4-02", "us-east-1/us-l4-01",
    ]  # fmt: skip
    code, out, _ = _run(capsys, "get", "quotas", "-o", "wide")
    assert "SOURCE" in out.splitlines()[0] and "fleet.yaml#" in out
    code, _, err = _run(capsys, "get", "pools", "-l", "a=b")
    assert code == 65 and "pools carry no labels" in err


def test_describe_shows_spec_status_and_source(plane, capsys) -> None:
    _run(capsys, "apply", "-f", str(FLEET))
    code, out, _ = _run(capsys, "describe", "node", "eu-west-1/eu-h100-01")
    assert code == 0
    assert "Applied from: " in out and "fleet.yaml#" in out
    assert (
        "partition: mig, mig: 3g.40gb@4 2g.20gb@0 1g.10gb@2 1g.10gb@3" in out
        and "Labels: gpu=H100-80GB, zone=eu-west-a" in out
    )
    code, _, err = _run(capsys, "describe", "pool", "nope")
    assert code == 65 and "no pool 'nope'" in err


def test_invalid_documents_are_listed_by_file_document_and_field(plane, capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: Pool\nmetadata: {name: ok}\n---\n"
        "kind: Quota\nmetadata: {tenant: ops, pool: ok}\nspec: {guaranteed_gpus: eight}\n"
    )
    code, out, err = _run(capsys, "apply", "-f", str(bad))
    assert code == 65 and out == ""
    assert f"{bad}#2 spec.guaranteed_gpus: is the string 'eight'; write a number of GPUs" in err


def test_a_refused_object_says_why_and_the_others_apply(plane, capsys, tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(
        "kind: Pool\nmetadata: {name: p1}\n---\n"
        "kind: Queue\nmetadata: {tenant: ops, name: q1}\nspec: {pool: nowhere}\n"
    )
    code, out, _ = _run(capsys, "apply", "-f", str(tmp_path / "q.yaml"))
    assert code == 65
    assert "pool/p1 created" in out
    assert "queue/ops/q1 refused: pool 'nowhere' does not exist" in out


def test_get_reads_tasks_gpus_overrides_and_tokens(plane, capsys) -> None:
    _run(capsys, "apply", "-f", str(FLEET))
    code, out, _ = _run(capsys, "get", "gpus")
    assert code == 0 and len(out.splitlines()) == 1 + 68
    code, out, _ = _run(capsys, "get", "tokens")
    assert code == 0 and "cli" in out
    code, out, err = _run(capsys, "get", "tasks")
    assert code == 0 and "No tasks found." in err
    code, out, err = _run(capsys, "get", "overrides")
    assert code == 0
