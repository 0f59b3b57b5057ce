from django.contrib import admin

from apps.tenants.models import ApiToken, Membership, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "kind", "parent", "run_uid"]
    list_filter = ["kind"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created with `whalegen token create` (the plaintext is shown once); here they are only
    listed and revoked."""

    list_display = [
        "prefix",
        "name",
        "user",
        "tenant",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = [
        "user",
        "tenant",
        "name",
        "prefix",
        "token_hash",
        "created_at",
        "expires_at",
        "last_used_at",
    ]

    def has_add_permission(self, request):
        return False
