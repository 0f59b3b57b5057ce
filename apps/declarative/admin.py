"""The admin's view of `apply`: where each applied object came from (a column other apps' admins add with
`applied_from_column`), and the records and prices themselves, read-only: `whalegen apply` writes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.declarative.kinds import BY_NAME
from apps.declarative.models import AppliedObject, GpuPrice
from apps.declarative.selectors import applied_source


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
