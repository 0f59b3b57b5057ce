"""The dashboard's API tokens page, persona by persona: alice (member of A), ada (admin of A), vic
(viewer in A), bob (member of B), eve (in no tenant), root (platform admin), anonymous.

The rules are the API's (tests/apps/tenants/test_token_api.py): a member sees and revokes their own
tokens, a tenant admin their tenants', a platform admin all; another's token is a 404."""

from __future__ import annotations

from typing import Any

import pytest

from apps.tenants.models import ApiToken, TokenAudit
from apps.tenants.services import token_create

pytestmark = pytest.mark.django_db


def text(response: Any) -> str:
    return response.content.decode()


@pytest.fixture
def tokens(world: Any) -> dict[str, ApiToken]:
    return {
        "alice": token_create(user=world.alice, tenant=world.tenant_a, name="alice-ci")[0],
        "ada": token_create(user=world.ada, tenant=world.tenant_a, name="ada-ci")[0],
        "bob": token_create(user=world.bob, tenant=world.tenant_b, name="bob-ci")[0],
    }


@pytest.mark.parametrize("path", ["/tokens/"])
def test_anonymous_is_sent_to_the_login_page(page: Any, path: str) -> None:
    response = page().get(path)
    assert response.status_code == 302 and response["Location"] == f"/login/?next={path}"


@pytest.mark.parametrize(
    ("persona", "want"),
    [
        ("alice", {"alice-ci"}),
        ("ada", {"alice-ci", "ada-ci"}),
        ("vic", set()),
        ("bob", {"bob-ci"}),
        ("eve", set()),
        ("root", {"alice-ci", "ada-ci", "bob-ci"}),
    ],
    ids=lambda v: str(v),
)
def test_the_page_lists_the_tokens_a_persona_may_see(
    world: Any, page: Any, tokens: dict[str, ApiToken], persona: str, want: set[str]
) -> None:
    response = page(getattr(world, persona)).get("/tokens/")
    assert response.status_code == 200
    shown = {name for name in ("alice-ci", "ada-ci", "bob-ci") if f"<td>{name}</td>" in text(response)}
    assert shown == want
    assert 'href="/tokens/" aria-current="page">API tokens</a>' in text(response)
    # eve belongs nowhere: there is no tenant to make a token in.
    assert ('id="token-form"' in text(response)) == (persona != "eve")


def test_a_member_makes_a_token_and_sees_its_secret_once(world: Any, page: Any) -> None:
    client = page(world.alice)
    made = client.post("/tokens/", {"name": "gitlab", "tenant": "vision", "role": "viewer", "ttl_days": "30"})
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(user=world.alice, name="gitlab")
    secret = text(made).split('<code id="new-token-secret">')[1].split("</code>")[0]
    assert secret.startswith(token.prefix) and token.role == "viewer"
    again = client.get("/tokens/")
    assert secret not in text(again) and token.prefix in text(again)
    audit = TokenAudit.objects.get(token=token)
    assert (audit.action, audit.actor, audit.via) == ("created", "user:alice", "dashboard")


@pytest.mark.parametrize(
    ("persona", "post", "status", "message"),
    [
        ("vic", {"role": "member"}, 403, "where the most is viewer (vic&#x27;s role there)"),
        ("bob", {}, 400, "unknown tenant"),
        ("alice", {"ttl_days": "0"}, 400, "greater than or equal to 1"),
        ("alice", {"name": ""}, 400, "This field is required."),
    ],
    ids=["a viewer asks for member", "another tenant", "a token that never expires", "no name"],
)
def test_a_refused_token_says_why_and_nothing_is_made(
    world: Any, page: Any, persona: str, post: dict, status: int, message: str
) -> None:
    response = page(getattr(world, persona)).post("/tokens/", {"name": "ci", "tenant": "vision", **post})
    assert response.status_code == status
    assert message in text(response)
    assert 'id="new-token-secret"' not in text(response)
    assert not ApiToken.objects.exists()


WANT_REVOKE = {"alice": 302, "ada": 302, "root": 302, "vic": 404, "bob": 404, "eve": 404}


@pytest.mark.parametrize("persona", list(WANT_REVOKE))
def test_revoking_alices_token(world: Any, page: Any, tokens: dict[str, ApiToken], persona: str) -> None:
    token = tokens["alice"]
    response = page(getattr(world, persona)).post(f"/tokens/{token.pk}/revoke/")
    assert response.status_code == WANT_REVOKE[persona]
    token.refresh_from_db()
    assert (token.revoked_at is not None) == (response.status_code == 302)
    if response.status_code == 302:
        assert response["Location"] == "/tokens/"
        audit = TokenAudit.objects.get(token=token, action="revoked")
        assert (audit.actor, audit.via) == (f"user:{persona}", "dashboard")


def test_revoking_is_a_post(world: Any, page: Any, tokens: dict[str, ApiToken]) -> None:
    assert page(world.alice).get(f"/tokens/{tokens['alice'].pk}/revoke/").status_code == 405
