from django.contrib import admin

from apps.approvals.models import OverrideAuditEntry, PriorityOverride


class AuditInline(admin.TabularInline):
    model = OverrideAuditEntry
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "action", "actor", "note"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(PriorityOverride)
class PriorityOverrideAdmin(admin.ModelAdmin):
    """Decisions are made through the API (they must leave an audit entry); the admin shows them."""

    list_display = ["id", "tenant", "task", "queue", "wanted_priority", "state", "requested_by", "expires_at"]
    list_filter = ["state", "tenant"]
    readonly_fields = [f.name for f in PriorityOverride._meta.fields]
    inlines = [AuditInline]

    def has_add_permission(self, request):
        return False
