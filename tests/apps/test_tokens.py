"""Bearer tokens: hashed at rest, scoped to one tenant, expiring, revocable, with a last-used time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.tenants.models import ApiToken
from apps.tenants.services import token_create, token_hash, token_revoke


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_only_the_hash_is_stored_and_the_token_works_once_shown(world) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    stored = ApiToken.objects.get(pk=token.pk)
    assert raw not in {stored.token_hash, stored.prefix} and stored.token_hash == token_hash(raw)
    assert raw.startswith(stored.prefix)
    response = _bearer(raw).get("/api/v1/tasks/")
    assert response.status_code == 200
    assert [t["id"] for t in response.json()["results"]] == [world.task_a.pk]
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None


@pytest.mark.parametrize(
    "spoil",
    ["expired", "revoked", "unknown", "inactive user"],
)
def test_a_spoilt_token_is_refused_with_401(world, spoil: str) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    if spoil == "expired":
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    elif spoil == "revoked":
        token_revoke(token=token)
    elif spoil == "unknown":
        raw = raw[:-2] + "xx"
    else:
        world.alice.is_active = False
        world.alice.save()
    response = _bearer(raw).get("/api/v1/tasks/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_token_sees_only_its_tenant_even_when_its_owner_belongs_to_more(world) -> None:
    from apps.tenants.services import membership_set

    membership_set(user=world.alice, tenant=world.tenant_b, role="member")
    _, raw = token_create(user=world.alice, tenant=world.tenant_b, name="speech-ci")
    client = _bearer(raw)
    assert [t["id"] for t in client.get("/api/v1/tasks/").json()["results"]] == [world.task_b.pk]
    assert client.get(f"/api/v1/tasks/{world.task_a.pk}/").status_code == 404


def test_a_token_cannot_be_made_for_a_tenant_its_user_is_not_in(world) -> None:
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="not a member"):
        token_create(user=world.eve, tenant=world.tenant_a, name="sneaky")


def test_a_platform_admin_token_decides_overrides_over_the_api_without_a_membership(world) -> None:
    from apps.approvals.services import override_request

    override = override_request(
        tenant=world.tenant_a, task=world.task_a, queue=None, wanted_priority=40, reason="deadline",
        requested_by=world.alice,
    )  # fmt: skip
    _, raw = token_create(user=world.root, tenant=world.tenant_a, name="ops")
    client = _bearer(raw)
    answer = client.post(f"/api/v1/overrides/{override.pk}/approve/", {"comment": "go"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "approved" and answer.json()["decided_by"] == "root"
    # A member's token cannot decide.
    _, alices = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    other = override_request(
        tenant=world.tenant_a, task=world.task_a, queue=None, wanted_priority=30, reason="again",
        requested_by=world.alice,
    )  # fmt: skip
    assert (
        _bearer(alices).post(f"/api/v1/overrides/{other.pk}/approve/", {}, format="json").status_code == 403
    )


def test_tokens_expire_after_the_configured_days(world, settings) -> None:
    settings.WHALEGEN_TOKEN_TTL_DAYS = 7
    token, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    assert timedelta(days=6, hours=23) < token.expires_at - timezone.now() <= timedelta(days=7)
    forever, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci", ttl_days=0)
    assert forever.expires_at is None


def test_a_malformed_authorization_header_is_refused(world) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer two words")
    assert client.get("/api/v1/tasks/").status_code == 401


def test_a_browser_session_reads_and_needs_csrf_to_write(world) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(world.alice)
    assert client.get("/api/v1/tasks/").status_code == 200
    refused = client.post(f"/api/v1/tasks/{world.task_a.pk}/cancel/", {}, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
