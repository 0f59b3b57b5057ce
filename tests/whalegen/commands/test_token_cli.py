"""`whalegen token create|ls|revoke` through the API, against pytest-django's live server (a real HTTP
server over the test database), as a member's shell or a CI job would run them."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.tenants.models import ApiToken, TokenAudit
from apps.tenants.services import token_create
from whalegen.cli import main


@pytest.fixture
def cli(live_server: Any, capsys: pytest.CaptureFixture[str]) -> Any:
    """`cli(token, *argv)` → (exit status, stdout, stderr) of `whalegen *argv` against the live server."""

    def run(token: str, *argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--server", live_server.url, "--token", token])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def alice_raw(world: Any) -> str:
    return token_create(user=world.alice, tenant=world.tenant_a, name="bootstrap")[1]


def _works(raw: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client.get("/api/v1/tasks/").status_code == 200


def test_a_member_makes_a_token_that_works_and_is_printed_once(world: Any, cli: Any, alice_raw: str) -> None:
    code, out, err = cli(
        alice_raw, "token", "create", "--name", "gitlab", "--role", "viewer", "--ttl-days", "30"
    )
    assert code == 0, err
    raw = out.strip()
    assert raw.startswith("wg_") and raw != alice_raw and _works(raw)
    assert "(gitlab) for alice in vision, role viewer, expires 20" in err and err.rstrip().endswith(
        "shown once"
    )
    made = ApiToken.objects.get(name="gitlab")
    assert (made.user, made.role) == (world.alice, "viewer")
    audit = TokenAudit.objects.get(token=made)
    assert (audit.action, audit.actor, audit.via, audit.via_token_prefix) == (
        "created", "user:alice", "api", alice_raw[:10],
    )  # fmt: skip


def test_ls_lists_what_the_caller_may_see_and_never_a_secret(world: Any, cli: Any, alice_raw: str) -> None:
    _, bobs = token_create(user=world.bob, tenant=world.tenant_b, name="bob-ci")
    code, out, _ = cli(alice_raw, "token", "ls")
    assert code == 0
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["ID", "PREFIX", "NAME"]
    assert [row.split()[2] for row in rows[1:]] == ["bootstrap"]
    assert alice_raw not in out and bobs[:10] not in out
    assert rows[1].split()[3:7] == ["vision", "alice", "member", "active"]


def test_revoke_stops_the_token_at_once(world: Any, cli: Any, alice_raw: str) -> None:
    victim, raw = token_create(user=world.alice, tenant=world.tenant_a, name="leaked")
    code, out, _ = cli(alice_raw, "token", "revoke", str(victim.pk))
    assert code == 0 and out.startswith(f"token {victim.pk} {victim.prefix}… (leaked): revoked 20")
    code, _, err = cli(raw, "token", "ls")
    assert code == 77 and "(HTTP 401)" in err and "token is unknown, revoked or expired" in err
    assert TokenAudit.objects.filter(token=victim, action="revoked", actor="user:alice").count() == 1


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["token", "revoke", "{bob}"], 65, "no token {bob} (or not one you may see)"),
        (["token", "create", "--tenant", "speech"], 65, "tenant: unknown tenant 'speech'"),
        (["token", "create", "--role", "admin"], 77, "where the most is member"),
        (
            ["token", "create", "--ttl-days", "400"],
            65,
            "ttl_days: 400 is out of range; write a number at most 365",
        ),
    ],
    ids=["another tenant's token", "another tenant", "a role above mine", "too long a life"],
)
def test_refusals_say_why_with_their_exit_status(
    world: Any, cli: Any, alice_raw: str, argv: list[str], code: int, message: str
) -> None:
    bobs, _ = token_create(user=world.bob, tenant=world.tenant_b, name="bob-ci")
    argv = [arg.format(bob=bobs.pk) for arg in argv]
    got, _, err = cli(alice_raw, *argv)
    assert got == code, err
    assert message.format(bob=bobs.pk) in err
    assert ApiToken.objects.count() == 2  # nothing made, nothing revoked
    bobs.refresh_from_db()
    assert bobs.revoked_at is None


def test_without_a_token_the_cli_says_so(
    live_server: Any, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.delenv("WHALEGEN_TOKEN", raising=False)
    assert main(["token", "ls", "--server", live_server.url]) == 77
    assert "no API token; pass --token or set WHALEGEN_TOKEN" in capsys.readouterr().err
