from django.contrib import admin

from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "region"]
    search_fields = ["name"]


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "description"]
    search_fields = ["name"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "model", "uuid", "mem_mib", "mig_capable", "partition_mode", "health"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "pool", "state", "cpu_milli", "mem_mib", "last_heartbeat_at"]
    list_filter = ["state", "cluster", "pool"]
    search_fields = ["name"]
    readonly_fields = ["agent_credential_hash", "last_heartbeat_at", "version"]
    inlines = [GpuInline]


class ComputeUnitInline(admin.TabularInline):
    model = ComputeUnit
    extra = 0
    fields = ["kind", "mig_profile", "mig_start", "mps_thread_pct", "gpu_milli", "mem_mib", "task"]
    raw_id_fields = ["task"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "model", "node", "index", "partition_mode", "health"]
    list_filter = ["model", "partition_mode", "health", "node__pool"]
    search_fields = ["uuid", "node__name"]
    inlines = [ComputeUnitInline]
