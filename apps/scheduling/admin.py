from django.contrib import admin

from apps.scheduling.models import Assignment, Cycle


@admin.register(Cycle)
class CycleAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "pool",
        "policy",
        "started_at",
        "tasks_considered",
        "tasks_placed",
        "tasks_preempted",
        "conflicts",
        "snapshot_ms",
        "solve_ms",
        "commit_ms",
    ]
    list_filter = ["pool", "policy"]


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ["task", "node", "borrowed", "created_at", "released_at", "release_reason"]
    list_filter = ["borrowed"]
    raw_id_fields = ["task", "cycle"]
    readonly_fields = ["unit_ids"]  # written by the cycle only
