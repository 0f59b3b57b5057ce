from django.contrib import admin

from apps.fleet.models import AgentReport, GpuEvent, GpuPartition, NodeAgent, TaskRun


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
