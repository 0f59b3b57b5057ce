"""The admin's view of `apply`: where each applied object came from, and the records and prices themselves,
read-only: `whalegen apply` writes them.

The apps whose objects `apply` writes sit below this one (apps.LAYERS) and do not know it: their admin
classes show the object; this module registers each again with an "applied from" column added.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.accounting.admin import BudgetAdmin
from apps.accounting.models import Budget
from apps.declarative.kinds import BY_NAME
from apps.declarative.models import AppliedObject, GpuPrice
from apps.declarative.selectors import applied_source
from apps.inventory.admin import ClusterAdmin, NodeAdmin, PoolAdmin
from apps.inventory.models import Cluster, Node, Pool
from apps.tenants.admin import MembershipAdmin, TenantAdmin
from apps.tenants.models import Membership, Tenant
from apps.workloads.admin import QueueAdmin, QuotaAdmin
from apps.workloads.models import Queue, Quota


def applied_from_column(kind: str) -> Callable[[Any, Any], str]:
    """A read-only admin column and field: the document an object was last applied from, or "-" when no
    file applied it (made by hand, by an agent, or before `apply` existed). One query per row: the
    admin's pages are 100 rows, and an annotation would need each app's queryset to know this app."""
    described = BY_NAME[kind]

    @admin.display(description="applied from")
    def applied_from(model_admin: Any, obj: Any) -> str:
        if obj is None or obj.pk is None:
            return "-"
        return applied_source(kind=kind, key=described.key(described.ident_of(obj))) or "-"

    return applied_from


def _with_applied_from(base: type[admin.ModelAdmin], kind: str) -> type[admin.ModelAdmin]:
    """`base` with the "applied from" column last in its list and read-only on its page."""

    def get_readonly_fields(self: admin.ModelAdmin, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*base.get_readonly_fields(self, request, obj), "applied_from"]

    attrs = {
        "__module__": base.__module__,
        "__doc__": base.__doc__,
        "list_display": [*base.list_display, "applied_from"],
        "applied_from": applied_from_column(kind),
        "get_readonly_fields": get_readonly_fields,
    }
    return type(base.__name__, (base,), attrs)


# (model, its app's admin class, its kind in `apply`)
_APPLIED_KINDS: tuple[tuple[type[Any], type[admin.ModelAdmin], str], ...] = (
    (Tenant, TenantAdmin, "Tenant"),
    (Membership, MembershipAdmin, "Member"),
    (Cluster, ClusterAdmin, "Cluster"),
    (Pool, PoolAdmin, "Pool"),
    (Node, NodeAdmin, "Node"),
    (Quota, QuotaAdmin, "Quota"),
    (Queue, QueueAdmin, "Queue"),
    (Budget, BudgetAdmin, "Budget"),
)
for _model, _base, _kind in _APPLIED_KINDS:
    admin.site.unregister(_model)
    admin.site.register(_model, _with_applied_from(_base, _kind))


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AppliedObject)
class AppliedObjectAdmin(_ReadOnly):
    list_display = ["kind", "key", "source", "applied_by", "applied_at"]
    list_filter = ["kind"]
    search_fields = ["key", "source"]


@admin.register(GpuPrice)
class GpuPriceAdmin(_ReadOnly):
    """Prices are applied as GpuPrice documents (`whalegen apply`), so the file stays the truth."""

    list_display = ["model", "per_gpu_hour", "updated_by", "updated_at"]
