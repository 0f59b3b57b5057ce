"""Approvals API: members ask for a priority raise; platform admins approve or reject it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.approvals import selectors, services
from apps.approvals.api import serializers as s
from apps.approvals.filters import OverrideFilter
from apps.tenants.access import request_access, require_platform_admin, require_role
from apps.tenants.models import Membership
from apps.workloads.selectors import queue_get, task_get


def _decide(
    request: Request,
    *,
    read: Callable[[Any], Any],
    what: str,
    inputs: type[serializers.Serializer],
    act: Callable[[Any, Any, str], Any],
    outputs: type[serializers.Serializer],
) -> Response:
    """What every approve and reject shares: read the item as the caller may see it (another tenant's
    is a 404), platform admins only, validate the comment, decide, answer with the item as it is now."""
    access = request_access(request)
    item = read(access)
    require_platform_admin(access, f"deciding {what}")
    data = inputs(data=request.data)
    data.is_valid(raise_exception=True)
    return Response(outputs(act(item, request.user, data.validated_data.get("comment", ""))).data)


class OverrideListRequestApi(generics.ListAPIView):
    serializer_class = s.OverrideOutputSerializer
    filterset_class = OverrideFilter

    def get_queryset(self):
        return selectors.override_list(access=request_access(self.request))

    @extend_schema(
        operation_id="overrides_request",
        request=s.OverrideRequestInputSerializer,
        responses={201: s.OverrideOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        data = s.OverrideRequestInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        access = request_access(request)
        # A target the caller cannot see is "unknown", like a 404, but reported on its field.
        task = queue = None
        try:
            if "task" in values:
                task = task_get(access=access, task_id=values["task"])
            else:
                queue = queue_get(access=access, queue_id=values["queue"])
        except Http404 as exc:
            field = "task" if "task" in values else "queue"
            raise ValidationError({field: [f"unknown {field} {values[field]}"]}) from exc
        tenant = (task or queue).tenant  # type: ignore[union-attr]
        require_role(access, tenant, Membership.Role.MEMBER, "requesting a priority override")
        override = services.override_request(
            tenant=tenant,
            task=task,
            queue=queue,
            wanted_priority=values["wanted_priority"],
            reason=values["reason"],
            requested_by=request.user,
            ttl_hours=values.get("ttl_hours"),
        )
        return Response(s.OverrideOutputSerializer(override).data, status=status.HTTP_201_CREATED)


class OverrideDetailApi(APIView):
    @extend_schema(responses=s.OverrideDetailOutputSerializer)
    def get(self, request: Request, override_id: int) -> Response:
        override = selectors.override_get(access=request_access(request), override_id=override_id)
        return Response(s.OverrideDetailOutputSerializer(override).data)


class OverrideApproveApi(APIView):
    @extend_schema(
        operation_id="overrides_approve",
        request=s.OverrideDecisionInputSerializer,
        responses=s.OverrideDetailOutputSerializer,
    )
    def post(self, request: Request, override_id: int) -> Response:
        return _decide(
            request,
            read=lambda access: selectors.override_get(access=access, override_id=override_id),
            what="overrides",
            inputs=s.OverrideDecisionInputSerializer,
            act=lambda item, by, comment: services.override_approve(override=item, by=by, comment=comment),
            outputs=s.OverrideDetailOutputSerializer,
        )


class OverrideRejectApi(APIView):
    @extend_schema(
        operation_id="overrides_reject",
        request=s.OverrideDecisionInputSerializer,
        responses=s.OverrideDetailOutputSerializer,
    )
    def post(self, request: Request, override_id: int) -> Response:
        return _decide(
            request,
            read=lambda access: selectors.override_get(access=access, override_id=override_id),
            what="overrides",
            inputs=s.OverrideDecisionInputSerializer,
            act=lambda item, by, comment: services.override_reject(override=item, by=by, comment=comment),
            outputs=s.OverrideDetailOutputSerializer,
        )


class ReclaimListApi(generics.ListAPIView):
    """Reclaim requests the idle check raised for idle online-SLA tasks (docs/idle-reclaim.md)."""

    serializer_class = s.ReclaimOutputSerializer

    def get_queryset(self):
        return selectors.reclaim_list(access=request_access(self.request))


class ReclaimDetailApi(APIView):
    @extend_schema(responses=s.ReclaimOutputSerializer)
    def get(self, request: Request, reclaim_id: int) -> Response:
        reclaim = selectors.reclaim_get(access=request_access(request), reclaim_id=reclaim_id)
        return Response(s.ReclaimOutputSerializer(reclaim).data)


class ReclaimApproveApi(APIView):
    @extend_schema(
        operation_id="reclaims_approve",
        request=s.ReclaimDecisionInputSerializer,
        responses=s.ReclaimOutputSerializer,
    )
    def post(self, request: Request, reclaim_id: int) -> Response:
        return _decide(
            request,
            read=lambda access: selectors.reclaim_get(access=access, reclaim_id=reclaim_id),
            what="reclaim requests",
            inputs=s.ReclaimDecisionInputSerializer,
            act=lambda item, by, comment: services.reclaim_approve(request=item, by=by, comment=comment),
            outputs=s.ReclaimOutputSerializer,
        )


class ReclaimRejectApi(APIView):
    @extend_schema(
        operation_id="reclaims_reject",
        request=s.ReclaimDecisionInputSerializer,
        responses=s.ReclaimOutputSerializer,
    )
    def post(self, request: Request, reclaim_id: int) -> Response:
        return _decide(
            request,
            read=lambda access: selectors.reclaim_get(access=access, reclaim_id=reclaim_id),
            what="reclaim requests",
            inputs=s.ReclaimDecisionInputSerializer,
            act=lambda item, by, comment: services.reclaim_reject(request=item, by=by, comment=comment),
            outputs=s.ReclaimOutputSerializer,
        )
