"""Forecasting API (read-only): the model registry and task profiles with right-sizing advice.
Task forecasts are shown on the task itself (`GET /api/v1/tasks/{id}/`, field `forecast`)."""

from __future__ import annotations

from django.db.models.functions import Length
from drf_spectacular.utils import extend_schema
from rest_framework import generics

from apps.forecasting import selectors
from apps.forecasting.api import serializers as s
from apps.tenants.access import request_access


class ForecastModelListApi(generics.ListAPIView):
    """Platform admins see every model with its envelope size; a tenant member sees the plane-wide
    models and those of their tenants (kinds, versions, metrics, decisions), never the bytes; a caller
    in no tenant sees none."""

    serializer_class = s.ForecastModelOutputSerializer
    filterset_class = None

    def get_queryset(self):
        access = request_access(self.request)
        queryset = selectors.forecast_model_list()
        if access.platform_admin:
            return queryset.annotate(blob_size_bytes=Length("blob"))
        if not access.tenant_ids:
            return queryset.none()
        return queryset.filter(tenant__isnull=True) | queryset.filter(tenant_id__in=access.tenant_ids)

    def get_serializer_class(self):
        if request_access(self.request).platform_admin:
            return s.ForecastModelAdminOutputSerializer
        return s.ForecastModelOutputSerializer

    @extend_schema(responses=s.ForecastModelAdminOutputSerializer(many=True))
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class TaskProfileListApi(generics.ListAPIView):
    """Profiles of the caller's tenants (all of them for platform admins)."""

    serializer_class = s.TaskProfileOutputSerializer
    filterset_class = None

    def get_queryset(self):
        return selectors.profile_list(access=request_access(self.request))

    def get_serializer_context(self):
        context = super().get_serializer_context()
        access = request_access(self.request)
        if access.platform_admin:
            tenant_ids = list(selectors.profile_list(access=access).values_list("tenant_id", flat=True))
        else:
            tenant_ids = access.tenant_ids
        context["gpu_models"] = selectors.gpu_models_by_tenant(tenant_ids=sorted(set(tenant_ids)))
        return context
