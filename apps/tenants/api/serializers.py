from __future__ import annotations

from rest_framework import serializers

from apps.tenants.models import Tenant


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
