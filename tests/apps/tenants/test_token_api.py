"""Self-service API tokens over the API (`/api/v1/tokens/`), persona by persona: alice (member of A),
ada (admin of A), vic (viewer in A), bob (member of B), eve (signed in, member of nothing), root
(platform admin) and nobody signed in.

Another's token you may not see answers 404, a tenant you are not in is "unknown" on its field, and a
role above your own is a 403 that says what the most is.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.tenants.models import ApiToken, TokenAudit
from apps.tenants.services import TOKEN_MAX_TTL_DAYS, membership_set, token_create

PERSONAS = ["alice", "ada", "vic", "bob", "eve", "root", "anon"]


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _client(api: Any, world: Any, persona: str) -> APIClient:
    return api(None if persona == "anon" else getattr(world, persona))


@pytest.fixture
def alices(world: Any) -> ApiToken:
    """A token of alice's in tenant A, made by the operator path."""
    return token_create(user=world.alice, tenant=world.tenant_a, name="alice-ci")[0]


# ------------------------------------------------------------------------------------------ creation


@pytest.mark.parametrize(
    ("persona", "want", "role"),
    [
        ("alice", 201, "member"),
        ("ada", 201, "admin"),
        ("vic", 201, "viewer"),
        ("root", 201, "admin"),  # a platform admin needs no membership
        ("bob", 400, None),  # tenant A is not his: "unknown tenant"
        ("eve", 400, None),
        ("anon", 401, None),
    ],
    ids=lambda v: str(v),
)
def test_making_a_token_in_tenant_a_gives_each_persona_its_own_role_at_most(
    world: Any, api: Any, persona: str, want: int, role: str | None
) -> None:
    response = _client(api, world, persona).post(
        "/api/v1/tokens/", {"name": "ci", "tenant": "vision"}, format="json"
    )
    assert response.status_code == want, response.content
    if want == 201:
        assert response.json()["role"] == role and response.json()["user"] == persona
    if want == 400:
        assert response.json()["tenant"] == ["unknown tenant 'vision'"]


def test_the_secret_is_in_the_creating_answer_only_and_works(world: Any, api: Any) -> None:
    client = api(world.alice)
    created = client.post("/api/v1/tokens/", {"name": "ci", "tenant": "vision"}, format="json")
    assert created.status_code == 201
    assert created["Cache-Control"] == "no-store"
    body = created.json()
    raw = body["secret"]
    assert raw.startswith("wg_") and raw.startswith(body["prefix"]) and body["state"] == "active"

    listing = client.get("/api/v1/tokens/")
    detail = client.get(f"/api/v1/tokens/{body['id']}/")
    for answer in (listing, detail):
        assert answer.status_code == 200
        assert raw not in answer.content.decode()
        assert b"secret" not in answer.content and b"token_hash" not in answer.content
    stored = ApiToken.objects.get(pk=body["id"])
    assert raw not in (stored.token_hash, stored.prefix)

    tasks = _bearer(raw).get("/api/v1/tasks/")
    assert tasks.status_code == 200
    assert [t["id"] for t in tasks.json()["results"]] == [world.task_a.pk]


def test_the_tenant_defaults_to_the_callers_only_one(world: Any, api: Any) -> None:
    response = api(world.bob).post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201 and response.json()["tenant"] == "speech"


@pytest.mark.parametrize(
    ("persona", "role", "want"),
    [
        ("vic", "member", 403),
        ("alice", "admin", 403),
        ("alice", "viewer", 201),
        ("ada", "admin", 201),
    ],
    ids=lambda v: str(v),
)
def test_a_token_s_role_is_at_most_its_makers(
    world: Any, api: Any, persona: str, role: str, want: int
) -> None:
    response = api(getattr(world, persona)).post(
        "/api/v1/tokens/", {"name": "ci", "tenant": "vision", "role": role}, format="json"
    )
    assert response.status_code == want, response.content
    if want == 403:
        held = {"vic": "viewer", "alice": "member"}[persona]
        assert response.json()["detail"] == (
            f"a token's role cannot be above its maker's: {role} asked in tenant 'vision', where the "
            f"most is {held} ({persona}'s role there)"
        )


def test_a_token_cannot_make_a_token_with_a_higher_role_than_its_own(world: Any) -> None:
    _, viewer_raw = token_create(user=world.ada, tenant=world.tenant_a, name="dash", role="viewer")
    client = _bearer(viewer_raw)
    refused = client.post("/api/v1/tokens/", {"name": "ci", "role": "member"}, format="json")
    assert refused.status_code == 403
    assert (
        "where the most is viewer (the role of the token this request came with" in refused.json()["detail"]
    )
    made = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert made.status_code == 201 and made.json()["role"] == "viewer" and made.json()["tenant"] == "vision"
    audit = TokenAudit.objects.get(token_id=made.json()["id"])
    assert audit.via == "api" and audit.via_token_prefix == viewer_raw[:10] and audit.actor == "user:ada"


def test_a_token_makes_tokens_only_inside_its_own_tenant(world: Any) -> None:
    membership_set(user=world.alice, tenant=world.tenant_b, role="member")
    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="vision-ci")
    response = _bearer(raw).post("/api/v1/tokens/", {"name": "x", "tenant": "speech"}, format="json")
    assert response.status_code == 400 and response.json()["tenant"] == ["unknown tenant 'speech'"]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"ttl_days": TOKEN_MAX_TTL_DAYS + 1}, "ttl_days", f"less than or equal to {TOKEN_MAX_TTL_DAYS}"),
        ({"ttl_days": 0}, "ttl_days", "0 (never) is only for operators on the plane"),
        ({"expires_at": "2020-01-01T00:00:00Z"}, "expires_at", "has passed"),
        ({"ttl_days": 5, "expires_at": "2099-01-01T00:00:00Z"}, "expires_at", "not both"),
        ({"expires_at": "2099-01-01T00:00:00Z"}, "expires_at", f"at most {TOKEN_MAX_TTL_DAYS} days ahead"),
        ({"name": "  "}, "name", "may not be blank"),
        ({"role": "owner"}, "role", "not a valid choice"),
        ({"secret": "wg_mine"}, "secret", "unknown field"),
    ],
    ids=["too long a life", "never", "in the past", "both expiries", "beyond a year", "blank name",
         "unknown role", "a chosen secret"],
)  # fmt: skip
def test_a_bad_request_names_its_field_and_says_why(
    world: Any, api: Any, body: dict, field: str, message: str
) -> None:
    response = api(world.alice).post("/api/v1/tokens/", {"name": "ci", **body}, format="json")
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()[field])
    assert not ApiToken.objects.filter(user=world.alice).exists()


def test_the_expiry_is_what_was_asked(world: Any, api: Any) -> None:
    client = api(world.alice)
    by_days = client.post("/api/v1/tokens/", {"name": "a", "ttl_days": 7}, format="json").json()
    when = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    at = client.post("/api/v1/tokens/", {"name": "b", "expires_at": when.isoformat()}, format="json").json()
    default = client.post("/api/v1/tokens/", {"name": "c"}, format="json").json()
    expiry = {t.name: t.expires_at for t in ApiToken.objects.filter(user=world.alice)}
    assert abs(expiry["a"] - timezone.now() - timedelta(days=7)) < timedelta(minutes=1)
    assert expiry["b"] == when
    assert abs(expiry["c"] - timezone.now() - timedelta(days=90)) < timedelta(minutes=1)  # the setting
    assert {by_days["state"], at["state"], default["state"]} == {"active"}


def test_a_token_cannot_make_one_that_outlives_it(world: Any) -> None:
    parent, raw = token_create(user=world.alice, tenant=world.tenant_a, name="short", ttl_days=5)
    client = _bearer(raw)
    refused = client.post("/api/v1/tokens/", {"name": "long", "ttl_days": 30}, format="json")
    assert refused.status_code == 400
    assert refused.json()["ttl_days"][0].startswith("a token cannot outlive the token that makes it")
    made = client.post("/api/v1/tokens/", {"name": "default"}, format="json")
    assert made.status_code == 201
    assert ApiToken.objects.get(pk=made.json()["id"]).expires_at == parent.expires_at


def test_asking_a_token_for_its_own_lifetime_again_says_how_many_days_it_may_give(world: Any) -> None:
    # docs/ci.md's first step: a member's 90-day token (the default, as `whalegen demo` prints them) asks
    # for a 90-day CI token minutes later. It cannot give that; the refusal names the number it can.
    parent, raw = token_create(user=world.alice, tenant=world.tenant_a, name="demo")
    client = _bearer(raw)
    refused = client.post("/api/v1/tokens/", {"name": "ci", "ttl_days": 90}, format="json")
    assert refused.status_code == 400
    message = refused.json()["ttl_days"][0]
    assert message.endswith("; ask for at most 89 days, or leave ttl_days out to get that expiry"), message
    assert client.post("/api/v1/tokens/", {"name": "ci", "ttl_days": 89}, format="json").status_code == 201
    late = (parent.expires_at + timedelta(hours=1)).isoformat()
    by_time = client.post("/api/v1/tokens/", {"name": "ci-at", "expires_at": late}, format="json")
    said = by_time.json()["expires_at"][0]
    assert said.endswith("; name a time up to then, or leave the expiry out to get that one"), said


# ----------------------------------------------------------------------------------- reading


@pytest.mark.parametrize(
    ("persona", "want"),
    [
        ("alice", {"alice-ci"}),
        ("ada", {"alice-ci", "ada-ci"}),  # a tenant admin sees the tenant's tokens
        ("vic", set()),
        ("bob", {"bob-ci"}),
        ("eve", set()),
        ("root", {"alice-ci", "ada-ci", "bob-ci"}),
    ],
    ids=lambda v: str(v),
)
def test_lists_hold_the_tokens_a_persona_may_see(
    world: Any, api: Any, alices: ApiToken, persona: str, want: set[str]
) -> None:
    token_create(user=world.ada, tenant=world.tenant_a, name="ada-ci")
    token_create(user=world.bob, tenant=world.tenant_b, name="bob-ci")
    response = api(getattr(world, persona)).get("/api/v1/tokens/")
    assert response.status_code == 200
    assert {row["name"] for row in response.json()["results"]} == want


def test_nobody_signed_in_is_refused_with_401(world: Any, api: Any, alices: ApiToken) -> None:
    for path in ("/api/v1/tokens/", f"/api/v1/tokens/{alices.pk}/"):
        assert api(None).get(path).status_code == 401
    assert api(None).post(f"/api/v1/tokens/{alices.pk}/revoke/").status_code == 401


WANT_READ = {"alice": 200, "ada": 200, "vic": 404, "bob": 404, "eve": 404, "root": 200, "anon": 401}


@pytest.mark.parametrize("persona", PERSONAS)
def test_reading_alices_token(world: Any, api: Any, alices: ApiToken, persona: str) -> None:
    response = _client(api, world, persona).get(f"/api/v1/tokens/{alices.pk}/")
    assert response.status_code == WANT_READ[persona], response.content
    if response.status_code == 200:
        body = response.json()
        assert (body["name"], body["user"], body["role"], body["effective_role"]) == (
            "alice-ci", "alice", "member", "member",
        )  # fmt: skip
        assert [(a["action"], a["actor"], a["via"]) for a in body["audit"]] == [
            ("created", "operator", "operator")
        ]


def test_a_token_sees_only_its_owners_tokens_in_its_own_tenant(world: Any) -> None:
    membership_set(user=world.alice, tenant=world.tenant_b, role="member")
    token_create(user=world.alice, tenant=world.tenant_b, name="speech-ci")
    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="vision-ci")
    listing = _bearer(raw).get("/api/v1/tokens/").json()["results"]
    assert [row["name"] for row in listing] == ["vision-ci"]
    speech = ApiToken.objects.get(name="speech-ci")
    assert _bearer(raw).get(f"/api/v1/tokens/{speech.pk}/").status_code == 404


# ----------------------------------------------------------------------------------- revoking

WANT_REVOKE = {"alice": 200, "ada": 200, "vic": 404, "bob": 404, "eve": 404, "root": 200, "anon": 401}


@pytest.mark.parametrize("persona", PERSONAS)
def test_revoking_alices_token(world: Any, api: Any, persona: str) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="alice-ci")
    assert _bearer(raw).get("/api/v1/tasks/").status_code == 200
    response = _client(api, world, persona).post(f"/api/v1/tokens/{token.pk}/revoke/")
    assert response.status_code == WANT_REVOKE[persona], response.content
    token.refresh_from_db()
    if response.status_code != 200:
        assert token.revoked_at is None
        assert _bearer(raw).get("/api/v1/tasks/").status_code == 200
        return
    body = response.json()
    assert body["state"] == "revoked" and body["revoked_at"] is not None
    assert [(a["action"], a["actor"]) for a in body["audit"]] == [
        ("created", "operator"),
        ("revoked", f"user:{persona}"),
    ]
    # Refused at once, with the Bearer challenge.
    refused = _bearer(raw).get("/api/v1/tasks/")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")


def test_revoking_twice_changes_nothing_and_is_audited_once(world: Any, api: Any, alices: ApiToken) -> None:
    client = api(world.alice)
    first = client.post(f"/api/v1/tokens/{alices.pk}/revoke/").json()
    second = client.post(f"/api/v1/tokens/{alices.pk}/revoke/")
    assert second.status_code == 200 and second.json()["revoked_at"] == first["revoked_at"]
    assert list(TokenAudit.objects.filter(token=alices).values_list("action", flat=True)) == [
        "created",
        "revoked",
    ]


def test_a_token_revokes_itself_and_then_is_refused(world: Any) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert client.post(f"/api/v1/tokens/{token.pk}/revoke/").status_code == 200
    assert client.get("/api/v1/tokens/").status_code == 401
    audit = TokenAudit.objects.get(token=token, action="revoked")
    assert (audit.actor, audit.via, audit.via_token_prefix) == ("user:alice", "api", raw[:10])


def test_a_weaker_token_cannot_revoke_a_stronger_one(world: Any) -> None:
    member, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    _, viewer_raw = token_create(user=world.alice, tenant=world.tenant_a, name="dash", role="viewer")
    response = _bearer(viewer_raw).post(f"/api/v1/tokens/{member.pk}/revoke/")
    assert response.status_code == 403
    assert response.json()["detail"] == (
        "a viewer token cannot revoke a member token; use a member token or the dashboard"
    )
    member.refresh_from_db()
    assert member.revoked_at is None


# ------------------------------------------------------------------------------ role at use


def test_lowering_a_members_role_lowers_their_tokens(world: Any) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    submit = {"tenant": "vision", "queue": "train", "command": ["true"], "gpu_milli": 100}
    assert client.post("/api/v1/tasks/", submit, format="json").status_code == 201
    membership_set(user=world.alice, tenant=world.tenant_a, role="viewer")
    refused = client.post("/api/v1/tasks/", submit, format="json")
    assert refused.status_code == 403 and "you have viewer" in refused.json()["detail"]
    detail = client.get(f"/api/v1/tokens/{token.pk}/").json()
    assert (detail["role"], detail["effective_role"]) == ("member", "viewer")


def test_a_viewer_token_reads_but_does_not_write_even_for_an_admin(world: Any) -> None:
    _, raw = token_create(user=world.ada, tenant=world.tenant_a, name="dash", role="viewer")
    client = _bearer(raw)
    assert client.get("/api/v1/tasks/").status_code == 200
    submit = {"queue": "train", "command": ["true"], "gpu_milli": 100}
    assert client.post("/api/v1/tasks/", submit, format="json").status_code == 403


def test_a_platform_admins_viewer_token_is_no_platform_admin(world: Any) -> None:
    from apps.approvals.services import override_request

    override = override_request(
        tenant=world.tenant_a, task=world.task_a, queue=None, wanted_priority=40, reason="deadline",
        requested_by=world.alice,
    )  # fmt: skip
    _, raw = token_create(user=world.root, tenant=world.tenant_a, name="dash", role="viewer")
    # It reads its tenant as a viewer would, membership or not ...
    tasks = _bearer(raw).get("/api/v1/tasks/").json()["results"]
    assert [t["id"] for t in tasks] == [world.task_a.pk]
    # ... and decides nothing.
    answer = _bearer(raw).post(f"/api/v1/overrides/{override.pk}/approve/", {"comment": "go"}, format="json")
    assert answer.status_code == 403
    assert answer.json()["detail"] == "deciding overrides is for platform admins"
