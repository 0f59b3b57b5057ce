"""`GET /api/v1/accounting/` (GPU-hours and money, JSON or CSV) and `/api/v1/budgets/` (list; set: admins)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounting import selectors, services
from apps.accounting.api import serializers as s
from apps.accounting.api.renderers import UsageCsvRenderer
from apps.inventory.models import Pool
from apps.tenants.access import request_access, require_platform_admin
from apps.tenants.selectors import tenant_get_by_slug


def report_data(report: selectors.UsageReport) -> dict[str, Any]:
    """The report as the API answers it (rounded to the millisecond-GPU-hour; sums are of unrounded rows)."""

    def row(r: selectors.UsageRow) -> dict[str, Any]:
        return {
            **r.keys,
            "gpu_hours": round(r.gpu_hours, 4),
            "tasks": r.tasks,
            "cost": None if r.cost is None else round(r.cost, 4),
            "unpriced_gpu_hours": round(r.unpriced_gpu_hours, 4),
        }

    return {
        "start": report.start,
        "end": report.end,
        "group_by": list(report.group_by),
        "currency": report.currency,
        "rows": [row(r) for r in report.rows],
        "total": row(report.total),
    }


class AccountingApi(APIView):
    renderer_classes = [JSONRenderer, UsageCsvRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        fmt = request.query_params.get("format")
        if fmt is not None and fmt not in {"json", "csv"}:
            raise ValidationError({"format": [f"unknown format {fmt!r}; choose json or csv"]})
        return super().perform_content_negotiation(request, force)

    def handle_exception(self, exc: Exception) -> Response:
        # Refusals are JSON in the project's one error shape, whichever format the report was asked in.
        self.request.accepted_renderer = JSONRenderer()  # type: ignore[attr-defined]
        self.request.accepted_media_type = JSONRenderer.media_type  # type: ignore[attr-defined]
        return super().handle_exception(exc)

    @extend_schema(
        operation_id="accounting_report",
        parameters=[s.AccountingQuerySerializer],
        responses={
            (200, "application/json"): s.UsageReportSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="the rows as CSV"),
        },
        description=(
            "GPU-hours held in [from, to) per group, fractions counted at what was held (a whole GPU 1, a "
            "MIG instance its compute slices / 7, an MPS share or time slice its milli / 1000), from each "
            "assignment's start to its release or now. With prices configured, `cost` is GPU-hours × the "
            "model's price. Members see their tenants (and those below), platform admins all."
        ),
    )
    def get(self, request: Request) -> Response:
        query = s.AccountingQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        access = request_access(request)
        now = timezone.now()
        for slug in q.get("tenant", []):
            tenant = tenant_get_by_slug(slug=slug)
            if tenant is None or not access.can_see(tenant.pk):
                raise ValidationError({"tenant": [f"unknown tenant {slug!r}"]})
        pools = q.get("pool", [])
        known = set(Pool.objects.filter(name__in=pools).values_list("name", flat=True))
        if unknown := [p for p in pools if p not in known]:
            raise ValidationError({"pool": [f"unknown pool {', '.join(unknown)}"]})
        start, end = q.get("start") or selectors.month_start(now), q.get("end") or now
        if start >= end:  # one of them defaulted (both given are checked by the serializer)
            raise ValidationError({"to": [f"must be after from ({start.isoformat()})"]})
        report = selectors.usage_report(
            access=access,
            start=start,
            end=end,
            now=now,
            group_by=q.get("group_by", []),
            tenants=q.get("tenant", []),
            queues=q.get("queue", []),
            pools=pools,
            gpu_models=q.get("gpu_model", []),
        )
        data = report_data(report)
        if request.accepted_renderer.format == "csv":
            return Response(data)
        return Response(s.UsageReportSerializer(data).data)


class BudgetListSetApi(APIView):
    @extend_schema(operation_id="budgets_list", responses=s.BudgetOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        statuses = selectors.budget_list(access=request_access(request), now=timezone.now())
        return Response(s.BudgetOutputSerializer(statuses, many=True).data)

    @extend_schema(
        operation_id="budgets_set",
        request=s.BudgetSetInputSerializer,
        responses={200: s.BudgetOutputSerializer},
        description="Set (raise or lower) a tenant's monthly GPU-hour budget in a pool (platform admins).",
    )
    def post(self, request: Request) -> Response:
        access = request_access(request)
        require_platform_admin(access, "setting GPU-hour budgets")
        data = s.BudgetSetInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tenant = tenant_get_by_slug(slug=values["tenant"])
        if tenant is None:
            raise ValidationError({"tenant": [f"unknown tenant {values['tenant']!r}"]})
        pool = Pool.objects.filter(name=values["pool"]).first()
        if pool is None:
            raise ValidationError({"pool": [f"unknown pool {values['pool']!r}"]})
        budget = services.budget_set(
            tenant=tenant, pool=pool, gpu_hours=values["gpu_hours"], reason=values["reason"], by=request.user
        )
        now = timezone.now()
        found = [b for b in selectors.budget_list(access=access, now=now) if b.budget.pk == budget.pk]
        return Response(s.BudgetOutputSerializer(found[0]).data, status=status.HTTP_200_OK)
