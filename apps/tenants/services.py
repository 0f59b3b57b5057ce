"""Writes for tenants, memberships and API tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.common.errors import Conflict, NotAllowed
from apps.common.models import save_validated
from apps.common.words import plural
from apps.tenants.callers import forget_callers
from apps.tenants.models import ROLE_RANK, ApiToken, Membership, Tenant, TokenAudit
from apps.tenants.selectors import Access, access_for, token_role_ceiling

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


def tenant_update(*, tenant: Tenant, values: dict[str, Any]) -> Tenant:
    """Name, kind, parent and run UID; a team cannot become a tenant's parent."""
    parent = values.get("parent", tenant.parent)
    if parent is not None and parent.kind != Tenant.Kind.ORG:
        raise Conflict(f"tenant {parent.slug!r} is a team; teams cannot hold tenants")
    save_validated(tenant, {k: v for k, v in values.items() if k in ("name", "kind", "parent", "run_uid")})
    forget_callers()  # roles flow down the tree: a moved tenant changes who may see what
    return tenant


def tenant_delete_refusal(tenant: Tenant) -> str:
    """Why `tenant` may not be deleted ("" when it may): its tasks' history, or what still hangs off it."""
    tasks = tenant.tasks.count()
    if tasks:
        return f"tenant {tenant.slug!r} has {plural(tasks, 'task')} (history is kept)"
    for related, what in (
        (tenant.children, "child tenant"),
        (tenant.queues, "queue"),
        (tenant.quotas, "quota"),
    ):
        count = related.count()
        if count:
            return f"tenant {tenant.slug!r} still has {plural(count, what)}; remove them first"
    return ""


def tenant_delete(*, tenant: Tenant) -> None:
    """Delete a tenant whose refusal was asked first, inside the same transaction."""
    tenant.delete()  # memberships and tokens go with it
    forget_callers()


def membership_set(*, user: AbstractBaseUser, tenant: Tenant, role: str) -> Membership:
    if role not in Membership.Role.values:
        raise ValidationError(
            {"role": [f"unknown role {role!r}; use one of {', '.join(Membership.Role.values)}"]}
        )
    membership, _ = Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": role})
    return membership


def membership_remove(*, membership: Membership) -> None:
    membership.delete()
    forget_callers()  # the member's remembered access must not outlive the membership


# Self-service tokens (the API, the dashboard, `whalegen token create` over HTTP) live at most a year: a
# CI secret that leaked unnoticed stops working on its own (GitHub bounds its fine-grained tokens the same
# way). The plane's own path (`whalegen token create --user`, run by an operator with the plane's
# settings) may still make one that never expires (`--ttl-days 0`): the first token of a fresh plane, a
# service account the platform team rotates itself.
TOKEN_MAX_TTL_DAYS = 365

Via = TokenAudit.Via


def _actor(user: AbstractBaseUser | None) -> str:
    return f"user:{user.get_username()}" if user is not None else "operator"


def _iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds")


def _expiry(
    *,
    ttl_days: int | None,
    expires_at: datetime | None,
    now: datetime,
    bounded: bool,
    via_token: ApiToken | None,
) -> datetime | None:
    """When a new token expires (None: never).

    1. An explicit `expires_at` or `ttl_days` (not both); neither: WHALEGEN_TOKEN_TTL_DAYS.
    2. `bounded` (self-service): within TOKEN_MAX_TTL_DAYS, never "never".
    3. A token made by a caller using a token does not outlive that token: the default is shortened to
       it, an explicit expiry beyond it is refused (a token could otherwise renew itself forever).
    """
    field = "expires_at" if expires_at is not None else "ttl_days"
    if ttl_days is not None and expires_at is not None:
        raise ValidationError({"expires_at": ["give ttl_days or expires_at, not both"]})
    limit = now + timedelta(days=TOKEN_MAX_TTL_DAYS)
    if expires_at is not None:
        if expires_at <= now:
            raise ValidationError({field: [f"{_iso(expires_at)} has passed; name a time still to come"]})
        expiry: datetime | None = expires_at
    else:
        ttl = settings.WHALEGEN_TOKEN_TTL_DAYS if ttl_days is None else ttl_days
        if ttl < 0:
            raise ValidationError({field: ["must be 0 (never expires) or more"]})
        if ttl == 0 and bounded and ttl_days is not None:
            raise ValidationError(
                {field: [f"a token made here expires within {TOKEN_MAX_TTL_DAYS} days; 0 (never) is only "
                         "for operators on the plane (`whalegen token create --user`)"]}
            )  # fmt: skip
        # A configured default of 0 ("never") gives a self-service token the longest life allowed.
        expiry = now + timedelta(days=ttl) if ttl else (limit if bounded else None)
    if bounded and expiry is not None and expiry > limit:
        raise ValidationError(
            {field: [f"at most {TOKEN_MAX_TTL_DAYS} days ahead (until {_iso(limit)}); make a new token then"]}
        )
    ceiling = via_token.expires_at if via_token is not None else None
    if via_token is None or ceiling is None or (expiry is not None and expiry <= ceiling):
        return expiry
    if ttl_days is None and expires_at is None:
        return ceiling
    raise ValidationError({field: [_outlives_text(via_token, ceiling, now, field)]})


def _outlives_text(via_token: ApiToken, ceiling: datetime, now: datetime, field: str) -> str:
    """The refusal of an expiry past the maker's, with what would be accepted: a caller who asked for the
    default 90 days from a 90-day token made minutes earlier must learn the number that works."""
    head = f"a token cannot outlive the token that makes it ({via_token.prefix}… expires {_iso(ceiling)})"
    days_left = (ceiling - now).days
    if field == "expires_at":
        return f"{head}; name a time up to then, or leave the expiry out to get that one"
    if days_left < 1:
        return f"{head}; leave ttl_days out to get that expiry"
    return f"{head}; ask for at most {days_left} days, or leave ttl_days out to get that expiry"


def _role_for(
    *,
    requested: str | None,
    ceiling: str | None,
    owner: AbstractBaseUser,
    tenant: Tenant,
    via_token: ApiToken | None,
) -> str:
    """The role a new token gets: the one asked for, at most the ceiling; the ceiling when none is asked."""
    if ceiling is None:
        raise ValidationError(
            {"tenant": [f"user {owner.get_username()!r} is not a member of tenant {tenant.slug!r}"]}
        )
    if requested is None:
        return ceiling
    if requested not in Membership.Role.values:
        raise ValidationError(
            {"role": [f"unknown role {requested!r}; use one of {', '.join(Membership.Role.values)}"]}
        )
    if ROLE_RANK[requested] > ROLE_RANK[ceiling]:  # type: ignore[index]
        why = (
            f"the role of the token this request came with ({via_token.prefix}…)"
            if via_token is not None and via_token.role == ceiling
            else f"{owner.get_username()}'s role there"
        )
        raise NotAllowed(
            f"a token's role cannot be above its maker's: {requested} asked in tenant {tenant.slug!r}, "
            f"where the most is {ceiling} ({why})"
        )
    return requested


def _audit(
    *,
    token: ApiToken,
    action: str,
    by: AbstractBaseUser | None,
    via: str,
    via_token: ApiToken | None,
) -> TokenAudit:
    return TokenAudit.objects.create(
        action=action,
        token=token,
        token_prefix=token.prefix,
        token_name=token.name,
        tenant=token.tenant.slug,
        owner=token.user.get_username(),
        role=token.role,
        actor=_actor(by),
        via=via,
        via_token_prefix=via_token.prefix if via_token is not None else "",
    )


@transaction.atomic
def token_create(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    name: str,
    role: str | None = None,
    ttl_days: int | None = None,
    expires_at: datetime | None = None,
    access: Access | None = None,
    by: AbstractBaseUser | None = None,
    via: str = Via.OPERATOR,
    via_token: ApiToken | None = None,
    now: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for `user` and return it with its plaintext, which is never stored and cannot be
    shown again. `by` made it (None: an operator on the plane), `via` says how, `via_token` is the token
    `by` called with; the creation is audited in the same transaction.

    A token never grants more than its owner has:
    1. The ceiling is the owner's role in the tenant (directly or through an ancestor) as `access` gives
       it: the caller's, as the API saw it (so no higher than the token they call with), else the user's
       own. A platform admin's ceiling is admin: their powers (deciding overrides, operating nodes) come
       from the platform role, not from a membership. No role there: refused.
    2. The role is the one asked for, at most the ceiling; without one, the ceiling.
    3. The expiry (`_expiry`): bounded for every path but the operator's.
    """

    now = now or timezone.now()
    if not name.strip():
        raise ValidationError({"name": ["give the token a name, to tell it apart in lists (e.g. ci)"]})
    if len(name) > ApiToken._meta.get_field("name").max_length:  # type: ignore[operator]
        raise ValidationError({"name": ["is longer than 100 characters"]})
    access = access if access is not None else access_for(user=user)
    ceiling = token_role_ceiling(access=access, tenant_id=tenant.pk)
    token_role = _role_for(requested=role, ceiling=ceiling, owner=user, tenant=tenant, via_token=via_token)
    expiry = _expiry(
        ttl_days=ttl_days, expires_at=expires_at, now=now, bounded=via != Via.OPERATOR, via_token=via_token
    )
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        tenant=tenant,
        name=name,
        role=token_role,
        prefix=raw[:10],
        token_hash=token_hash(raw),
        expires_at=expiry,
    )
    _audit(token=token, action=TokenAudit.Action.CREATED, by=by, via=via, via_token=via_token)
    return token, raw


@transaction.atomic
def token_revoke(
    *,
    token: ApiToken,
    by: AbstractBaseUser | None = None,
    via: str = Via.OPERATOR,
    via_token: ApiToken | None = None,
    now: datetime | None = None,
) -> ApiToken:
    """Revoke the token: it is refused from now on (in this process at once, in the plane's other
    processes within WHALEGEN_AUTH_CACHE_S). Revoking a revoked token changes nothing and is not audited
    again. Who may revoke which token is the caller's to check (selectors.token_get); the one rule here:
    a token cannot revoke one with a higher role (a leaked viewer token must not cut off the team's CI).
    """
    from apps.tenants.callers import forget_callers

    if via_token is not None and ROLE_RANK[token.role] > ROLE_RANK[via_token.role]:  # type: ignore[index]
        raise NotAllowed(
            f"a {via_token.role} token cannot revoke a {token.role} token; "
            f"use a {token.role} token or the dashboard"
        )
    updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    # An UPDATE sends no post_save: forget this process's remembered callers here (other processes
    # forget within WHALEGEN_AUTH_CACHE_S, apps.tenants.callers).
    forget_callers()
    token.refresh_from_db()
    if updated == 1:
        _audit(token=token, action=TokenAudit.Action.REVOKED, by=by, via=via, via_token=via_token)
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
