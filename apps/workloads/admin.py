from django.contrib import admin

from apps.workloads.models import Queue, Quota, Task, TaskEvent, TaskProfile


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "pool",
        "guaranteed_milli",
        "borrow_limit_milli",
        "gpu_mem_limit_mib",
    ]
    list_filter = ["pool"]

    # Moving a quota to another tenant or pool would move the work admitted under it with it.
    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "pool"] if obj else []


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "pool", "default_priority", "weight", "default_image"]
    list_filter = ["tenant", "pool"]
    search_fields = ["name"]


class TaskEventInline(admin.TabularInline):
    model = TaskEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "from_state", "to_state", "actor", "reason"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    """Read-only: state changes go through the state machine and requests are charged to quotas at
    submission, so a form edit would bypass both. Cancel through the API or `whalegen tasks cancel`."""

    list_display = [
        "id",
        "name",
        "tenant",
        "queue",
        "state",
        "gpu_count",
        "gpu_milli",
        "priority",
        "created_at",
    ]
    list_filter = ["state", "tenant", "pool", "kind", "isolation"]
    search_fields = ["name", "gang_id", "profile_key", "idempotency_key"]
    inlines = [TaskEventInline]
    # `env` values may be secrets (tokens, keys): the page shows the variables' names, never the values.
    exclude = ["env"]
    readonly_fields = ["env_keys"]

    @admin.display(description="env keys (values not shown)")
    def env_keys(self, obj: Task) -> str:
        return ", ".join(obj.env_keys) or "-"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        # A task is the record of what ran and what was charged (accounting, history, assignments and
        # events, which carry no database constraint back to it): it is cancelled, never deleted.
        return False


@admin.register(TaskProfile)
class TaskProfileAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "profile_key",
        "sample_count",
        "duration_p50_s",
        "duration_p90_s",
        "gpu_mem_peak_mib",
    ]
    list_filter = ["tenant"]
    search_fields = ["profile_key"]
