"""Inventory API: read-only. The fleet is written by operators (admin) and by agents."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.inventory import selectors
from apps.inventory.api import serializers as s
from apps.inventory.filters import GpuFilter, NodeFilter
from apps.tenants.access import request_access


class PoolListApi(generics.ListAPIView):
    serializer_class = s.PoolOutputSerializer
    filterset_class = None

    def get_queryset(self):
        return selectors.pool_list(access=request_access(self.request))


class PoolDetailApi(APIView):
    @extend_schema(responses=s.PoolOutputSerializer)
    def get(self, request: Request, pool_id: int) -> Response:
        return Response(
            s.PoolOutputSerializer(selectors.pool_get(access=request_access(request), pool_id=pool_id)).data
        )


class ClusterListApi(generics.ListAPIView):
    serializer_class = s.ClusterOutputSerializer
    filterset_class = None

    def get_queryset(self):
        return selectors.cluster_list(access=request_access(self.request))


class ClusterDetailApi(APIView):
    @extend_schema(responses=s.ClusterOutputSerializer)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = selectors.cluster_get(access=request_access(request), cluster_id=cluster_id)
        return Response(s.ClusterOutputSerializer(cluster).data)


class NodeListApi(generics.ListAPIView):
    serializer_class = s.NodeOutputSerializer
    filterset_class = NodeFilter

    def get_queryset(self):
        return selectors.node_list(access=request_access(self.request))


class NodeDetailApi(APIView):
    @extend_schema(responses=s.NodeOutputSerializer)
    def get(self, request: Request, node_id: int) -> Response:
        return Response(
            s.NodeOutputSerializer(selectors.node_get(access=request_access(request), node_id=node_id)).data
        )


class GpuListApi(generics.ListAPIView):
    serializer_class = s.GpuOutputSerializer
    filterset_class = GpuFilter

    def get_queryset(self):
        return selectors.gpu_list(access=request_access(self.request))

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "access": request_access(self.request)}


class GpuDetailApi(APIView):
    @extend_schema(responses=s.GpuOutputSerializer)
    def get(self, request: Request, gpu_id: int) -> Response:
        access = request_access(request)
        gpu = selectors.gpu_get(access=access, gpu_id=gpu_id)
        return Response(s.GpuOutputSerializer(gpu, context={"access": access}).data)
