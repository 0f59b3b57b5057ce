"""Reads for tenants: above all, what a caller may see and do (`access_for`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from apps.tenants.models import ROLE_RANK, ApiToken, Membership, Tenant


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
    if token is not None:
        scope = _subtree(tree, token.tenant_id)
        roles = {tid: role for tid, role in roles.items() if tid in scope}
    return Access(platform_admin=bool(getattr(user, "is_staff", False)), roles=roles)


def tenant_list(*, access: Access) -> QuerySet[Tenant]:
    queryset = Tenant.objects.select_related("parent")
    if access.platform_admin:
        return queryset.all()
    return queryset.filter(pk__in=access.tenant_ids)


def tenant_get_by_slug(*, slug: str) -> Tenant | None:
    return Tenant.objects.filter(slug=slug).first()
