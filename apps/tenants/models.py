"""Who may do what: tenants in a tree (org → team), memberships with roles, and API tokens.

Platform admins are Django staff users (`is_staff`): they operate the fleet, write quotas and decide
priority overrides for every tenant, without being members of any.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.common.models import TimestampedModel


class Tenant(TimestampedModel):
    class Kind(models.TextChoices):
        ORG = "org", "organisation"
        TEAM = "team", "team"

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TEAM)
    # A membership in a tenant carries its role to every tenant below it.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    # The unprivileged uid (and gid) the tenant's runs take on GPU hosts; null = WHALEGEN_TASK_UID_BASE +
    # the tenant's id (`run_uid_effective`). Unique: two tenants sharing a uid could signal and read each
    # other's runs.
    run_uid = models.PositiveIntegerField(null=True, blank=True, unique=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        if self.run_uid is not None and (reason := run_uid_refusal(self.run_uid)):
            raise ValidationError({"run_uid": [reason]})

    @property
    def run_uid_effective(self) -> int:
        """The uid/gid the tenant's runs take: its own `run_uid`, else the range's base + its id."""
        if self.run_uid is not None:
            return self.run_uid
        return int(settings.WHALEGEN_TASK_UID_BASE) + self.pk


def run_uid_refusal(uid: int) -> str:
    """Why `uid` cannot be a tenant's run uid ("" when it can): it must lie in the configured range
    [WHALEGEN_TASK_UID_BASE, + WHALEGEN_TASK_UID_COUNT) and above the host's system accounts (< 1000)."""
    base, count = int(settings.WHALEGEN_TASK_UID_BASE), int(settings.WHALEGEN_TASK_UID_COUNT)
    if uid < 1000:
        return (
            f"uid {uid} is a system account's (below 1000); tenant runs take uids {base}-{base + count - 1}"
        )
    if not base <= uid < base + count:
        return (
            f"uid {uid} is outside the tenant uid range {base}-{base + count - 1} "
            "(WHALEGEN_TASK_UID_BASE, WHALEGEN_TASK_UID_COUNT)"
        )
    return ""


class Membership(TimestampedModel):
    class Role(models.TextChoices):
        VIEWER = "viewer", "viewer"
        MEMBER = "member", "member"
        ADMIN = "admin", "admin"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


# Roles in increasing power; a caller needs at least the rank an action asks for.
ROLE_RANK = {Membership.Role.VIEWER: 1, Membership.Role.MEMBER: 2, Membership.Role.ADMIN: 3}


class ApiToken(TimestampedModel):
    """A bearer token for pipelines. Only its SHA-256 is stored; the token itself is shown once.

    SHA-256 (not a slow password hash) is enough because the token is 256 bits of randomness: there is
    nothing to brute-force, and every API call must look it up in one indexed query.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters of the token, kept so an operator can tell tokens apart in lists.
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    # The most the token may do in its tenant. At use it acts with the lower of this and its owner's role
    # there at that moment (apps.tenants.selectors.access_for), so lowering a member lowers their tokens.
    # No default: every creation states it (services.token_create takes the owner's role when not told).
    role = models.CharField(max_length=8, choices=Membership.Role.choices)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"


class TokenAudit(models.Model):
    """Append-only trail of API token creations and revocations: who did it, when, how, to which token.

    The token's name, prefix, tenant and owner are copied, not only linked: the trail must still say what
    happened after a user, a tenant or the token itself is deleted.
    """

    class Action(models.TextChoices):
        CREATED = "created", "created"
        REVOKED = "revoked", "revoked"

    class Via(models.TextChoices):
        API = "api", "API"
        DASHBOARD = "dashboard", "dashboard"
        OPERATOR = "operator", "operator on the plane"  # `whalegen token create --user`, the demo, scripts
        ADMIN = "admin", "Django admin"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=8, choices=Action.choices)
    token = models.ForeignKey(ApiToken, null=True, on_delete=models.SET_NULL, related_name="audit")
    token_prefix = models.CharField(max_length=16)
    token_name = models.CharField(max_length=100)
    tenant = models.CharField(max_length=64)  # the tenant's slug
    owner = models.CharField(max_length=150)  # the token's user: for whom it was made
    role = models.CharField(max_length=8, choices=Membership.Role.choices)
    actor = models.CharField(max_length=150)  # `user:alice`, or `operator` for the plane's own commands
    via = models.CharField(max_length=10, choices=Via.choices)
    # The prefix of the API token the actor called with ("" for a browser session or the plane itself).
    via_token_prefix = models.CharField(max_length=16, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.token_prefix}… {self.action} by {self.actor}"
