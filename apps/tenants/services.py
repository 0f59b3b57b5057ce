"""Writes for tenants, memberships and API tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.tenants.models import ApiToken, Membership, Tenant

# Tokens look like `wg_<43 url-safe chars>`: the prefix makes a leaked token recognisable to secret
# scanners, the rest is 32 random bytes.
TOKEN_PREFIX = "wg_"
# last_used_at is a hint for operators, not an audit log: writing it at most once a minute keeps a
# busy pipeline from turning every read into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def tenant_create(
    *, slug: str, name: str, kind: str = Tenant.Kind.TEAM, parent: Tenant | None = None
) -> Tenant:
    if parent is not None and parent.kind != Tenant.Kind.ORG:
        raise ValidationError({"parent": [f"tenant {parent.slug!r} is a team; teams cannot hold tenants"]})
    tenant = Tenant(slug=slug, name=name, kind=kind, parent=parent)
    tenant.full_clean()
    tenant.save()
    return tenant


def membership_set(*, user: AbstractBaseUser, tenant: Tenant, role: str) -> Membership:
    if role not in Membership.Role.values:
        raise ValidationError(
            {"role": [f"unknown role {role!r}; use one of {', '.join(Membership.Role.values)}"]}
        )
    membership, _ = Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": role})
    return membership


@transaction.atomic
def token_create(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    name: str,
    ttl_days: int | None = None,
    now: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its plaintext, which is never stored and cannot be shown again.

    The user must belong to the tenant (directly or through an ancestor): a token never grants more
    than its owner has. A platform admin (staff) may hold one in any tenant: their powers (deciding
    overrides, operating nodes) come from the platform role, not from a membership, and the token
    carries no role in the tenant that the admin does not hold.
    """
    from apps.tenants.selectors import access_for

    now = now or timezone.now()
    if not getattr(user, "is_staff", False) and access_for(user=user).role(tenant.pk) is None:
        raise ValidationError(
            {"tenant": [f"user {user.get_username()!r} is not a member of tenant {tenant.slug!r}"]}
        )
    ttl = settings.WHALEGEN_TOKEN_TTL_DAYS if ttl_days is None else ttl_days
    if ttl < 0:
        raise ValidationError({"ttl_days": ["must be 0 (never expires) or more"]})
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        tenant=tenant,
        name=name,
        prefix=raw[:10],
        token_hash=token_hash(raw),
        expires_at=now + timedelta(days=ttl) if ttl else None,
    )
    return token, raw


def token_revoke(*, token: ApiToken, now: datetime | None = None) -> ApiToken:
    from apps.tenants.callers import forget_callers

    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now or timezone.now())
    # An UPDATE sends no post_save: forget this process's remembered callers here (other processes
    # forget within WHALEGEN_AUTH_CACHE_S, apps.tenants.callers).
    forget_callers()
    token.refresh_from_db()
    return token


def token_authenticate(*, raw: str, now: datetime | None = None) -> ApiToken | None:
    """The live token for `raw`, with its user loaded; None when unknown, revoked, expired or inactive."""
    now = now or timezone.now()
    token = (
        ApiToken.objects.select_related("user", "tenant")
        .filter(token_hash=token_hash(raw), revoked_at__isnull=True)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
