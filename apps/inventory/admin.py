from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.common import hooks
from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "region"]
    search_fields = ["name"]


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    """Platform admins set how the pool's hosts run tasks: a runtime change applies to tasks submitted
    afterwards (each task keeps the runtime it got), an image rule to submissions afterwards."""

    list_display = ["name", "description", "runtime", "image_pull_policy"]
    list_filter = ["runtime"]
    search_fields = ["name"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "model", "uuid", "mem_mib", "mig_capable", "partition_mode", "health"]
    readonly_fields = fields  # the agent's, as on the GPU's own page (GpuAdmin)
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    """No "Add": a node comes from `whalegen apply` (a Node document) or joins by itself, with its GPUs read
    from the host; one made here would have no GPUs and no credential."""

    list_display = [
        "name",
        "cluster",
        "pool",
        "state",
        "cpu_milli",
        "mem_mib",
        "last_heartbeat_at",
    ]
    list_filter = ["state", "cluster", "pool"]
    search_fields = ["name"]
    readonly_fields = ["agent_credential_hash", "last_heartbeat_at", "version"]
    inlines = [GpuInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # A node is locked before its delete is decided. The scheduling cycle locks the nodes it places on,
    # and the assignments it writes carry no database constraint (apps.scheduling.models.Assignment):
    # holding the lock, the admin's check for protected objects sees every assignment committed before
    # it, and refuses the delete rather than leave an assignment that names no node. Nodes are deleted
    # one at a time (no bulk action, which would decide before it could lock).
    def delete_view(self, request, object_id, extra_context=None):
        with transaction.atomic():
            if request.method == "POST":
                pk = unquote(object_id)
                list(Node.objects.select_for_update().filter(pk=pk).values_list("pk", flat=True))
            return super().delete_view(request, object_id, extra_context)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


class ComputeUnitInline(admin.TabularInline):
    """A GPU's units, shown, never edited here. They are cut when the GPU is added (`gpu_add`: equal
    shares, MIG layouts checked against the model's table) or re-carved by the scheduler, and its picture
    of a GPU relies on that: a GPU's shares are alike (docs/scheduling.md §3), a unit row is never
    rewritten while it exists (ComputeUnit). A unit edited by hand could already be bound by a cycle."""

    model = ComputeUnit
    extra = 0
    can_delete = False
    fields = ["kind", "mig_profile", "mig_start", "mps_thread_pct", "gpu_milli", "mem_mib", "held_by"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Gpu | None = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[ComputeUnit]:
        return hooks.units_with_holders(super().get_queryset(request))

    @admin.display(description="held by task")
    def held_by(self, unit: ComputeUnit) -> int | None:
        """The task whose live assignment lists the unit (a unit stores no holder)."""
        return getattr(unit, "holder_id", None)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "model", "node", "index", "partition_mode", "health"]
    list_filter = ["model", "partition_mode", "health", "node__pool"]
    search_fields = ["uuid", "node__name"]
    inlines = [ComputeUnitInline]

    # Shown, never edited: a GPU and its units are what the node's agent reports and the scheduler carves
    # (the partition mode goes with the units, changed only by a re-carve); a row added or edited here
    # would contradict the host. Deleted with its node.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Gpu | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Gpu | None = None) -> bool:
        return False
