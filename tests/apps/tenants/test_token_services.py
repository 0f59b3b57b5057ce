"""Token services and reads without HTTP: the role a token acts with, the audit trail, expiry bounds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.common.errors import NotAllowed
from apps.tenants.models import TokenAudit
from apps.tenants.selectors import access_for, token_effective_role
from apps.tenants.services import TOKEN_MAX_TTL_DAYS, Via, membership_set, token_create, token_revoke


def test_an_org_token_acts_with_the_lower_role_in_every_team_below(world: Any) -> None:
    org = world.tenant_a.parent
    membership_set(user=world.eve, tenant=org, role="admin")
    membership_set(user=world.eve, tenant=world.tenant_b, role="viewer")  # no weaker than the org's admin
    token, _ = token_create(user=world.eve, tenant=org, name="org-ci", role="member")
    access = access_for(user=world.eve, token=token)
    assert access.roles == {org.pk: "member", world.tenant_a.pk: "member", world.tenant_b.pk: "member"}
    assert not access.platform_admin


def test_removing_the_membership_leaves_the_token_no_role(world: Any) -> None:
    token, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    world.alice.memberships.all().delete()
    assert token_effective_role(token=token) is None
    assert access_for(user=world.alice, token=token).roles == {}


def test_a_platform_admins_token_keeps_the_platform_role_only_as_admin(world: Any) -> None:
    admin, _ = token_create(user=world.root, tenant=world.tenant_a, name="ops")
    viewer, _ = token_create(user=world.root, tenant=world.tenant_a, name="wall", role="viewer")
    assert admin.role == "admin" and access_for(user=world.root, token=admin).platform_admin
    wall = access_for(user=world.root, token=viewer)
    assert not wall.platform_admin and wall.role(world.tenant_a.pk) == "viewer"
    assert wall.role(world.tenant_b.pk) is None


def test_creation_and_revocation_leave_one_audit_entry_each_that_outlives_the_token(world: Any) -> None:
    token, _ = token_create(
        user=world.alice, tenant=world.tenant_a, name="ci", role="viewer", by=world.alice, via=Via.DASHBOARD
    )
    token_revoke(token=token, by=world.ada, via=Via.API)
    token_revoke(token=token, by=world.ada, via=Via.API)
    token.delete()
    rows = list(
        TokenAudit.objects.values_list("action", "actor", "via", "owner", "tenant", "role", "token_name")
    )
    assert rows == [
        ("created", "user:alice", "dashboard", "alice", "vision", "viewer", "ci"),
        ("revoked", "user:ada", "api", "alice", "vision", "viewer", "ci"),
    ]
    assert set(TokenAudit.objects.values_list("token_prefix", flat=True)) == {token.prefix}


def test_a_refused_creation_leaves_no_token_and_no_audit(world: Any) -> None:
    with pytest.raises(NotAllowed):
        token_create(user=world.vic, tenant=world.tenant_a, name="ci", role="admin", via=Via.API)
    with pytest.raises(ValidationError, match="not a member of tenant 'vision'"):
        token_create(user=world.bob, tenant=world.tenant_a, name="ci")
    assert not TokenAudit.objects.exists()


@pytest.mark.parametrize(
    ("via", "ttl_days", "never"),
    [(Via.OPERATOR, 0, True), (Via.OPERATOR, 3650, False), (Via.API, None, False)],
    ids=["the operator may make one that never expires", "the operator is not bounded", "self-service"],
)
def test_only_the_operator_path_escapes_the_expiry_bound(
    world: Any, via: str, ttl_days: int | None, never: bool
) -> None:
    token, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci", ttl_days=ttl_days, via=via)
    assert (token.expires_at is None) == never


def test_a_configured_default_of_never_gives_self_service_the_longest_life(world: Any, settings: Any) -> None:
    settings.WHALEGEN_TOKEN_TTL_DAYS = 0
    now = timezone.now()
    token, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci", via=Via.API, now=now)
    assert token.expires_at == now + timedelta(days=TOKEN_MAX_TTL_DAYS)
