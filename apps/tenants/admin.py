from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.tenants.models import ApiToken, Membership, Tenant, TokenAudit
from apps.tenants.services import token_revoke


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
    """Tokens are made by their owners (dashboard, API, `whalegen token create`; the plaintext is shown
    once); here they are only listed and revoked, through the service, so every revocation is audited."""

    list_display = [
        "prefix",
        "name",
        "user",
        "tenant",
        "role",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant", "role"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = [
        "user",
        "tenant",
        "name",
        "role",
        "prefix",
        "token_hash",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        tokens = list(queryset.select_related("user", "tenant").filter(revoked_at__isnull=True))
        for token in tokens:
            token_revoke(token=token, by=request.user, via=TokenAudit.Via.ADMIN)
        self.message_user(request, f"{len(tokens)} token(s) revoked.")


@admin.register(TokenAudit)
class TokenAuditAdmin(admin.ModelAdmin):
    """The trail is append-only: nothing here is added, changed or deleted by hand."""

    list_display = [
        "created_at",
        "action",
        "token_prefix",
        "token_name",
        "tenant",
        "owner",
        "role",
        "actor",
        "via",
    ]
    list_filter = ["action", "via", "tenant"]
    search_fields = ["token_prefix", "token_name", "owner", "actor"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
