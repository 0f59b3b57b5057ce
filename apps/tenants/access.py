"""What the caller of a view may do: its access (roles per tenant) resolved once per request, and the
checks every app's views share. Tenants' own, so `apps.common` imports no app."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from rest_framework.request import Request

from apps.common.errors import NotAllowed
from apps.tenants.models import ApiToken, Tenant
from apps.tenants.selectors import Access, access_for, tenant_get_by_slug


def request_access(request: Request) -> Access:
    """What the caller may do, computed once per request (two queries) and kept on the request; a bearer
    token's authentication has usually put it there already (apps.tenants.callers remembers it)."""
    cached = getattr(request, "_whalegen_access", None)
    if cached is None:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        cached = access_for(user=request.user, token=token)
        request._whalegen_access = cached  # type: ignore[attr-defined]
    return cached


def request_token(request: Request) -> ApiToken | None:
    return request.auth if isinstance(request.auth, ApiToken) else None


def require_role(access: Access, tenant: Tenant, role: str, action: str) -> None:
    if not access.has(tenant.pk, role):
        held = access.role(tenant.pk) or "no role"
        raise NotAllowed(f"{action} in tenant {tenant.slug!r} needs the {role} role; you have {held}")


def require_platform_admin(access: Access, action: str) -> None:
    if not access.platform_admin:
        raise NotAllowed(f"{action} is for platform admins")


def resolve_tenant(request: Request, slug: str | None, *, role: str, action: str) -> Tenant:
    """The tenant a write acts in: the one named, else the token's, else the caller's only one.

    A tenant the caller cannot see is reported as unknown (never "forbidden"), like a 404.
    """
    access = request_access(request)
    if slug:
        tenant = tenant_get_by_slug(slug=slug)
        if tenant is None or not access.can_see(tenant.pk):
            raise ValidationError({"tenant": [f"unknown tenant {slug!r}"]})
    elif (token := request_token(request)) is not None:
        tenant = token.tenant
    else:
        candidates = [tid for tid in access.roles if access.has(tid, role)]
        if not candidates and not access.platform_admin:
            raise NotAllowed(f"{action} needs the {role} role in a tenant, and you hold it in none")
        if len(candidates) != 1:
            raise ValidationError({"tenant": ["you may act in several tenants; name the tenant"]})
        tenant = Tenant.objects.get(pk=candidates[0])
    require_role(access, tenant, role, action)
    return tenant
