"""Reads for priority overrides: members see their tenants' requests, platform admins see all."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404

from apps.approvals.models import OverrideAuditEntry, PriorityOverride, ReclaimRequest
from apps.tenants.selectors import Access


def override_list(*, access: Access) -> QuerySet[PriorityOverride]:
    queryset = PriorityOverride.objects.select_related(
        "tenant", "task", "queue", "requested_by", "decided_by"
    )
    if access.platform_admin:
        return queryset
    return queryset.filter(tenant_id__in=access.tenant_ids)


def override_get(*, access: Access, override_id: int) -> PriorityOverride:
    override = override_list(access=access).filter(pk=override_id).first()
    if override is None:
        raise Http404(f"no override {override_id}")
    return override


def override_audit(*, override: PriorityOverride) -> QuerySet[OverrideAuditEntry]:
    return OverrideAuditEntry.objects.filter(override=override)


def reclaim_list(*, access: Access) -> QuerySet[ReclaimRequest]:
    queryset = ReclaimRequest.objects.select_related("task", "task__tenant", "decided_by")
    if access.platform_admin:
        return queryset
    return queryset.filter(task__tenant_id__in=access.tenant_ids)


def reclaim_get(*, access: Access, reclaim_id: int) -> ReclaimRequest:
    request = reclaim_list(access=access).filter(pk=reclaim_id).first()
    if request is None:
        raise Http404(f"no reclaim request {reclaim_id}")
    return request
