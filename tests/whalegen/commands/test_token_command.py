"""`whalegen token create --user` (the operator's path) against the configured database (PostgreSQL in the
test run); the API path is tests/whalegen/commands/test_token_cli.py."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from whalegen.cli import main


def test_token_create_prints_a_working_token_once(world, capsys) -> None:
    assert main(["token", "create", "--user", "alice", "--tenant", "vision", "--ttl-days", "1"]) == 0
    captured = capsys.readouterr()
    raw = captured.out.strip()
    assert raw.startswith("wg_") and "shown once" in captured.err
    client = APIClient()
    response = client.get("/api/v1/tasks/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert [t["id"] for t in response.json()["results"]] == [world.task_a.pk]


def test_token_create_refuses_a_user_outside_the_tenant(world, capsys) -> None:
    assert main(["token", "create", "--user", "eve", "--tenant", "vision"]) == 1
    assert "not a member of tenant 'vision'" in capsys.readouterr().err


def test_token_create_names_what_is_missing(world, capsys) -> None:
    assert main(["token", "create", "--user", "nobody", "--tenant", "vision"]) == 1
    assert "no user 'nobody'" in capsys.readouterr().err


def test_the_operator_path_takes_a_role_and_audits_as_operator(world, capsys) -> None:
    from apps.tenants.models import ApiToken, TokenAudit

    argv = ["token", "create", "--local", "--user", "ada", "--tenant", "vision", "--role", "viewer"]
    assert main(argv) == 0
    assert "role viewer" in capsys.readouterr().err
    token = ApiToken.objects.get(user=world.ada)
    assert token.role == "viewer"
    audit = TokenAudit.objects.get(token=token)
    assert (audit.action, audit.actor, audit.via, audit.owner) == ("created", "operator", "operator", "ada")


def test_the_operator_path_keeps_a_token_within_its_owners_role(world, capsys) -> None:
    assert main(["token", "create", "--user", "alice", "--tenant", "vision", "--role", "admin"]) == 1
    assert "where the most is member (alice's role there)" in capsys.readouterr().err


def test_the_operator_path_still_makes_a_token_that_never_expires(world, capsys) -> None:
    from apps.tenants.models import ApiToken

    assert main(["token", "create", "--user", "alice", "--tenant", "vision", "--ttl-days", "0"]) == 0
    assert "expires never" in capsys.readouterr().err
    assert ApiToken.objects.get(user=world.alice).expires_at is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--local", "--tenant", "vision"], "--local makes a token for a named member; add --user USER"),
        (["--user", "alice"], "--user needs --tenant"),
        (["--user", "alice", "--tenant", "vision", "--server", "http://x"], "drop --server/--token"),
    ],
    ids=["--local without a user", "a user without a tenant", "a user and a server"],
)
def test_the_operator_path_refuses_what_does_not_fit_it(world, capsys, argv: list[str], message: str) -> None:
    assert main(["token", "create", *argv]) == 65
    assert message in capsys.readouterr().err
