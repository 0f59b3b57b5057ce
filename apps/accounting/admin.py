from django.contrib import admin

from apps.accounting.models import Budget, BudgetChange
from apps.declarative.admin import applied_from_column


class ChangeInline(admin.TabularInline):
    model = BudgetChange
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "actor", "old_gpu_hours", "new_gpu_hours", "reason"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    """Budgets are set through the API (every change must leave an audit entry); the admin shows them."""

    list_display = ["id", "quota", "period", "gpu_hours", "updated_at", "applied_from"]
    readonly_fields = [*(f.name for f in Budget._meta.fields), "applied_from"]
    applied_from = applied_from_column("Budget")
    inlines = [ChangeInline]

    def has_add_permission(self, request):
        return False
