"""Reads for tenants: above all, what a caller may see and do (`access_for`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q, QuerySet
from django.http import Http404

from apps.tenants.models import ROLE_RANK, ApiToken, Membership, Tenant, TokenAudit


@dataclass(frozen=True)
class Access:
    """What one caller may do: a role per tenant, and whether they are a platform admin.

    Roles flow down the tenant tree; a token narrows the caller to its tenant's subtree.
    """

    platform_admin: bool = False
    roles: Mapping[int, str] = field(default_factory=dict)

    @property
    def tenant_ids(self) -> list[int]:
        return sorted(self.roles)

    def role(self, tenant_id: int) -> str | None:
        return self.roles.get(tenant_id)

    def can_see(self, tenant_id: int) -> bool:
        return self.platform_admin or tenant_id in self.roles

    def has(self, tenant_id: int, role: str) -> bool:
        """True when the caller holds `role` or stronger there; platform admins act as admin everywhere."""
        if self.platform_admin:
            return True
        held = self.roles.get(tenant_id)
        return held is not None and ROLE_RANK[held] >= ROLE_RANK[role]  # type: ignore[index]


def _subtree(tree: Mapping[int, int | None], root_id: int) -> set[int]:
    found = {root_id}
    # The tree is shallow (org → team) but nothing forbids deeper: walk until no new child appears.
    changed = True
    while changed:
        children = {tid for tid, parent in tree.items() if parent in found and tid not in found}
        found |= children
        changed = bool(children)
    return found


def access_for(*, user: AbstractBaseUser | AnonymousUser, token: ApiToken | None = None) -> Access:
    if not user.is_authenticated:
        return Access()
    memberships = list(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
    tree: dict[int, int | None] = dict(Tenant.objects.values_list("id", "parent_id"))
    roles: dict[int, str] = {}
    for tenant_id, role in memberships:
        for tid in _subtree(tree, tenant_id):
            # The strongest role wins where an org membership and a team membership overlap.
            if tid not in roles or ROLE_RANK[role] > ROLE_RANK[roles[tid]]:  # type: ignore[index]
                roles[tid] = role
    platform_admin = bool(getattr(user, "is_staff", False))
    if token is not None:
        # A token narrows its owner twice: to its tenant's subtree, and to its own role there. A platform
        # admin's token carries the platform role only when it is an admin token: a platform admin's
        # viewer token for a wall dashboard must not decide overrides.
        scope = _subtree(tree, token.tenant_id)
        if platform_admin and token.role != Membership.Role.ADMIN:
            # A platform admin is admin everywhere, so their weaker token holds its own role across its
            # scope, membership or not, and nothing of the platform role.
            roles = {tid: token.role for tid in scope}
            platform_admin = False
        else:
            roles = {tid: role_lower(role, token.role) for tid, role in roles.items() if tid in scope}
    return Access(platform_admin=platform_admin, roles=roles)


def role_lower(first: str, second: str) -> str:
    """The weaker of two roles."""
    return first if ROLE_RANK[first] <= ROLE_RANK[second] else second  # type: ignore[index]


def tenant_list(*, access: Access) -> QuerySet[Tenant]:
    queryset = Tenant.objects.select_related("parent")
    if access.platform_admin:
        return queryset.all()
    return queryset.filter(pk__in=access.tenant_ids)


def tenant_get_by_slug(*, slug: str) -> Tenant | None:
    return Tenant.objects.filter(slug=slug).first()


# ------------------------------------------------------------------------------------------- API tokens


def token_role_ceiling(*, access: Access, tenant_id: int) -> str | None:
    """The highest role a token this caller makes in the tenant may carry: their own role there (what a
    token they call with allows of it), admin for a platform admin; None where they hold no role."""
    if access.platform_admin:
        return Membership.Role.ADMIN
    return access.role(tenant_id)


def token_list(
    *, access: Access, user: AbstractBaseUser | AnonymousUser, scope_token: ApiToken | None = None
) -> QuerySet[ApiToken]:
    """The tokens a caller may see: their own, every token of the tenants they administer (a team's admin
    must be able to cut off a leaver's or a leaked token without waiting for a platform admin), and all
    of them for a platform admin. A caller using a token (`scope_token`) sees only inside its scope."""
    queryset = ApiToken.objects.select_related("user", "tenant")
    if access.platform_admin:
        return queryset
    own = Q(user_id=user.pk)
    if scope_token is not None:
        own &= Q(tenant_id__in=access.tenant_ids)
    administered = [tid for tid in access.tenant_ids if access.has(tid, Membership.Role.ADMIN)]
    return queryset.filter(own | Q(tenant_id__in=administered))


def token_get(
    *,
    access: Access,
    user: AbstractBaseUser | AnonymousUser,
    token_id: int,
    scope_token: ApiToken | None = None,
) -> ApiToken:
    """One token the caller may see; another's token they may not see is a 404, as if it did not exist."""
    visible = token_list(access=access, user=user, scope_token=scope_token)
    token = visible.prefetch_related("audit").filter(pk=token_id).first()
    if token is None:
        raise Http404(f"no token {token_id}")
    return token


def token_state(token: ApiToken, *, now: datetime) -> str:
    """`revoked`, `expired` or `active` (revocation wins: it is the deliberate act)."""
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return "expired"
    return "active"


def token_effective_role(*, token: ApiToken) -> str | None:
    """The role the token acts with now in its tenant: the lower of its own and its owner's present role
    there; None when the owner no longer holds one (the token then authenticates but may do nothing)."""
    access = access_for(user=token.user, token=token)
    if access.platform_admin:
        return token.role
    return access.role(token.tenant_id)


def token_audit(*, token: ApiToken) -> QuerySet[TokenAudit]:
    return TokenAudit.objects.filter(token=token)
