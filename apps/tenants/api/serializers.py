from __future__ import annotations

from django.utils import timezone
from rest_framework import serializers

from apps.common.fields import (
    StrictCharField,
    StrictChoiceField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictSlugField,
)
from apps.tenants.models import ApiToken, Membership, Tenant, TokenAudit
from apps.tenants.selectors import token_effective_role, token_state
from apps.tenants.services import TOKEN_MAX_TTL_DAYS


class TenantOutputSerializer(serializers.ModelSerializer):
    parent = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True, help_text="Null for a top-level tenant."
    )
    role = serializers.SerializerMethodField(
        help_text="The caller's role here; null for platform admins without one."
    )

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "kind", "parent", "role"]
        read_only_fields = fields

    def get_role(self, tenant: Tenant) -> str | None:
        return self.context["access"].role(tenant.pk)


class TokenCreateInputSerializer(StrictInputSerializer):
    """A token of your own, in a tenant you belong to, with a role no higher than yours there (nor than the
    token you call with), expiring within a year. Unknown fields are refused, each named."""

    name = StrictCharField(max_length=100, help_text="A label to tell tokens apart (e.g. `ci`).")
    tenant = StrictSlugField(
        max_length=64,
        required=False,
        help_text="Tenant slug; default: the calling token's tenant, or your only tenant.",
    )
    role = StrictChoiceField(
        choices=Membership.Role.choices,
        required=False,
        help_text="At most your role in the tenant (and the calling token's); default: that most.",
    )
    ttl_days = StrictIntegerField(
        min_value=0,
        max_value=TOKEN_MAX_TTL_DAYS,
        required=False,
        help_text=f"Days until expiry, 1..{TOKEN_MAX_TTL_DAYS}; or give `expires_at`. Default: the plane's "
        "WHALEGEN_TOKEN_TTL_DAYS (90), shortened to the calling token's own expiry.",
    )
    expires_at = serializers.DateTimeField(
        required=False, help_text=f"When it expires, within {TOKEN_MAX_TTL_DAYS} days; or give `ttl_days`."
    )


class TokenOutputSerializer(serializers.ModelSerializer):
    """A token as lists show it: never its secret, never its hash."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.SlugRelatedField(slug_field="username", read_only=True, help_text="The token's owner.")
    state = serializers.SerializerMethodField(help_text="`active`, `expired` or `revoked`.")

    class Meta:
        model = ApiToken
        fields = [
            "id", "name", "prefix", "tenant", "user", "role", "state", "created_at", "expires_at",
            "last_used_at", "revoked_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_state(self, token: ApiToken) -> str:
        return token_state(token, now=timezone.now())


class TokenAuditOutputSerializer(serializers.ModelSerializer):
    # Plain strings, not enums: OverrideAuditEntry already owns the document's `ActionEnum`.
    action = serializers.CharField(read_only=True, help_text="`created` or `revoked`.")
    via = serializers.CharField(read_only=True, help_text="`api`, `dashboard`, `operator` or `admin`.")

    class Meta:
        model = TokenAudit
        fields = ["created_at", "action", "actor", "via", "via_token_prefix"]
        read_only_fields = fields


class TokenDetailOutputSerializer(TokenOutputSerializer):
    """A token with the role it acts with now and its audit trail; never its secret, never its hash."""

    effective_role = serializers.SerializerMethodField(
        help_text="The role it acts with now: the lower of `role` and its owner's present role in the "
        "tenant; null when the owner holds none there any more."
    )
    audit = TokenAuditOutputSerializer(many=True, read_only=True)

    class Meta(TokenOutputSerializer.Meta):
        fields = [*TokenOutputSerializer.Meta.fields, "effective_role", "audit"]
        read_only_fields = fields

    def get_effective_role(self, token: ApiToken) -> str | None:
        return token_effective_role(token=token)


class TokenCreatedOutputSerializer(TokenOutputSerializer):
    """The token just made, with its secret: the one answer that ever carries it."""

    secret = serializers.SerializerMethodField(
        help_text="The token itself (`Authorization: Bearer …`, WHALEGEN_TOKEN). Shown in this answer only: "
        "the plane keeps its SHA-256, never the token."
    )

    class Meta(TokenOutputSerializer.Meta):
        fields = [*TokenOutputSerializer.Meta.fields, "secret"]
        read_only_fields = fields

    def get_secret(self, token: ApiToken) -> str:
        return self.context["secret"]
