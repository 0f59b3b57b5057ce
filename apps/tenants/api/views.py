"""Tenants API: which tenants the caller may act in, and with what role."""

from __future__ import annotations

from rest_framework import generics

from apps.common.api import request_access
from apps.tenants import selectors
from apps.tenants.api import serializers as s


class TenantListApi(generics.ListAPIView):
    serializer_class = s.TenantOutputSerializer
    filterset_class = None

    def get_queryset(self):
        return selectors.tenant_list(access=request_access(self.request))

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "access": request_access(self.request)}
