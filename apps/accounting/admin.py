from django.contrib import admin

from apps.accounting.models import Budget, BudgetChange


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

    list_display = ["id", "quota", "period", "gpu_hours", "updated_at"]
    readonly_fields = [f.name for f in Budget._meta.fields]
    inlines = [ChangeInline]

    def has_add_permission(self, request):
        return False
