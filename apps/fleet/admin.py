from django.contrib import admin
from django.http import HttpRequest

from apps.fleet.models import AgentReport, GpuEvent, GpuPartition, JoinToken, NodeAgent, NodeJoin, TaskRun


@admin.register(NodeAgent)
class NodeAgentAdmin(admin.ModelAdmin):
    list_display = ["node", "hostname", "protocol_version", "generation", "generation_applied", "stored_seq"]
    readonly_fields = [f.name for f in NodeAgent._meta.fields]


@admin.register(TaskRun)
class TaskRunAdmin(admin.ModelAdmin):
    list_display = ["task", "node", "state", "pid", "exit_code", "updated_at"]
    list_filter = ["state"]


@admin.register(GpuPartition)
class GpuPartitionAdmin(admin.ModelAdmin):
    list_display = ["gpu", "state", "generation", "reported_at"]


@admin.register(GpuEvent)
class GpuEventAdmin(admin.ModelAdmin):
    list_display = ["gpu", "kind", "xid", "fatal", "at"]


@admin.register(AgentReport)
class AgentReportAdmin(admin.ModelAdmin):
    list_display = ["node", "seq", "received_at"]


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    """Read-only: a token is made where its secret can be shown once (`whalegen create join-token`, the
    API), which a form here cannot do, and revoked by `whalegen delete join-token` or the API."""

    list_display = ["name", "pool", "cluster", "prefix", "uses", "max_uses", "expires_at", "revoked_at"]
    list_filter = ["pool", "requires_approval"]
    readonly_fields = [f.name for f in JoinToken._meta.fields if f.name != "token_hash"]
    exclude = ["token_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(NodeJoin)
class NodeJoinAdmin(admin.ModelAdmin):
    """Read-only: written by the join and by approval (`whalegen approve node`, the API)."""

    list_display = ["node", "join_token", "joined_at", "approval_required", "approved_at", "approved_by"]
    readonly_fields = [f.name for f in NodeJoin._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
