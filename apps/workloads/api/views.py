"""Workloads API: one class per operation; each parses input, calls one service or selector, and shapes
the answer. Permissions: viewers read, members submit and cancel, tenant admins manage queues,
platform admins write quotas."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import ValidationError as DrfValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.inventory.selectors import pool_get_by_name
from apps.tenants.access import request_access, require_platform_admin, require_role, resolve_tenant
from apps.tenants.models import Membership
from apps.tenants.selectors import tenant_get_by_slug
from apps.workloads import selectors, services
from apps.workloads.api import serializers as s
from apps.workloads.api.fast_input import FastInput
from apps.workloads.api.fast_output import FastOutput
from apps.workloads.filters import QueueFilter, QuotaFilter, TaskFilter
from apps.workloads.models import TaskEvent
from apps.workloads.services import TaskSubmission

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "maxLength": 200},
    OpenApiParameter.HEADER,
    description=(
        "A retry with the same key returns the task the first call created (200 instead of 201); "
        "the same key with a different request is refused (409)."
    ),
)


IDEMPOTENCY_KEY_MAX = 200  # Task.idempotency_key's column

# The submission path's serializers, built once per process: a serializer builds (deep-copies) its
# fields on every instantiation, which was a fifth of a submission's CPU. `run_validation` and
# `to_representation` keep nothing of a call on the serializer, so one instance serves every request.
_TASK_INPUT = s.TaskInputSerializer()
# And the answer is planned once from the output serializer's fields (apps/workloads/api/fast_output.py):
# DRF's field-by-field walk was a quarter of a bulk submission's CPU.
_TASK_OUTPUT = FastOutput(s.TaskOutputSerializer())
# Plainly valid bodies skip DRF's field machinery (a fifth of a bulk submission's CPU); anything else
# goes to the serializers, whose messages are the API's (apps/workloads/api/fast_input.py).
_TASK_INPUT_FAST = FastInput(_TASK_INPUT)
_BULK_INPUT_FAST = FastInput(s.BulkSubmitInputSerializer())


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and len(key) > IDEMPOTENCY_KEY_MAX:
        raise ValidationError(
            {"Idempotency-Key": [f"at most {IDEMPOTENCY_KEY_MAX} characters; this one has {len(key)}"]}
        )
    return key


def _bulk_errors_as_list(errors: dict[str, Any], body: Any) -> dict[str, Any]:
    """Per-task field errors as a list that lines up with the submitted one (`{}` for a task that was
    fine), the shape a refusal of the service has too; DRF keys them by index."""
    items = errors.get("tasks")
    submitted = body.get("tasks") if isinstance(body, dict) else None
    if isinstance(items, dict) and isinstance(submitted, list) and all(isinstance(k, int) for k in items):
        errors = {**errors, "tasks": [items.get(index, {}) for index in range(len(submitted))]}
    return errors


def _task_request(data: dict[str, Any]) -> TaskSubmission:
    fields = {k: v for k, v in data.items() if k not in {"tenant", "idempotency_key"}}
    return TaskSubmission(**fields)


class TaskListSubmitApi(generics.ListAPIView):
    serializer_class = s.TaskOutputSerializer
    filterset_class = TaskFilter

    def get_queryset(self):
        return selectors.task_list(access=request_access(self.request))

    @extend_schema(
        operation_id="tasks_submit",
        request=s.TaskInputSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.TaskOutputSerializer, 200: s.TaskOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        key = _idempotency_key(request)
        values = _TASK_INPUT_FAST.values(request.data)
        if values is None:
            values = _TASK_INPUT.run_validation(request.data)
        tenant = resolve_tenant(
            request, values.get("tenant"), role=Membership.Role.MEMBER, action="submitting tasks"
        )
        task, created = services.task_submit(
            tenant=tenant,
            request=_task_request(values),
            submitted_by=request.user,
            idempotency_key=key,
        )
        return Response(
            _TASK_OUTPUT.to_representation(task),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class TaskBulkSubmitApi(APIView):
    @extend_schema(
        operation_id="tasks_bulk_submit",
        request=s.BulkSubmitInputSerializer,
        responses={201: s.TaskOutputSerializer(many=True)},
    )
    def post(self, request: Request) -> Response:
        values = _BULK_INPUT_FAST.values(request.data)
        if values is None:
            data = s.BulkSubmitInputSerializer(data=request.data)
            if not data.is_valid():
                raise DrfValidationError(_bulk_errors_as_list(data.errors, request.data))
            values = data.validated_data
        tenant = resolve_tenant(
            request, values.get("tenant"), role=Membership.Role.MEMBER, action="submitting tasks"
        )
        items = [(_task_request(item), item.get("idempotency_key")) for item in values["tasks"]]
        tasks = services.tasks_submit_bulk(tenant=tenant, items=items, submitted_by=request.user)
        shown = [_TASK_OUTPUT.to_representation(task) for task in tasks]
        return Response(shown, status=status.HTTP_201_CREATED)


class TaskDetailApi(APIView):
    @extend_schema(responses=s.TaskOutputSerializer)
    def get(self, request: Request, task_id: int) -> Response:
        task = selectors.task_get(access=request_access(request), task_id=task_id)
        return Response(s.TaskOutputSerializer(task).data)


class TaskCancelApi(APIView):
    @extend_schema(
        operation_id="tasks_cancel", request=s.TaskCancelInputSerializer, responses=s.TaskOutputSerializer
    )
    def post(self, request: Request, task_id: int) -> Response:
        data = s.TaskCancelInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        access = request_access(request)
        task = selectors.task_get(access=access, task_id=task_id)
        require_role(access, task.tenant, Membership.Role.MEMBER, "cancelling tasks")
        task = services.task_cancel(task=task, by=request.user, reason=data.validated_data.get("reason", ""))
        return Response(s.TaskOutputSerializer(task).data)


class TaskEventListApi(generics.ListAPIView):
    serializer_class = s.TaskEventOutputSerializer
    filterset_class = None

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no task
            return TaskEvent.objects.none()
        task = selectors.task_get(access=request_access(self.request), task_id=self.kwargs["task_id"])
        return selectors.task_events(task=task)


class QueueListCreateApi(generics.ListAPIView):
    serializer_class = s.QueueOutputSerializer
    filterset_class = QueueFilter

    def get_queryset(self):
        return selectors.queue_list(access=request_access(self.request))

    @extend_schema(
        operation_id="queues_create", request=s.QueueInputSerializer, responses={201: s.QueueOutputSerializer}
    )
    def post(self, request: Request) -> Response:
        data = s.QueueInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tenant = resolve_tenant(
            request, values.get("tenant"), role=Membership.Role.ADMIN, action="managing queues"
        )
        pool = pool_get_by_name(name=values["pool"])
        if pool is None:
            raise ValidationError({"pool": [f"unknown pool {values['pool']!r}"]})
        queue = services.queue_create(
            tenant=tenant,
            pool=pool,
            name=values["name"],
            default_priority=values["default_priority"],
            weight=values["weight"],
            idle_reclaim=values["idle_reclaim"],
            default_image=values["default_image"],
        )
        return Response(s.QueueOutputSerializer(queue).data, status=status.HTTP_201_CREATED)


class QueueDetailApi(APIView):
    @extend_schema(responses=s.QueueOutputSerializer)
    def get(self, request: Request, queue_id: int) -> Response:
        queue = selectors.queue_get(access=request_access(request), queue_id=queue_id)
        return Response(s.QueueOutputSerializer(queue).data)

    @extend_schema(request=s.QueueUpdateInputSerializer, responses=s.QueueOutputSerializer)
    def patch(self, request: Request, queue_id: int) -> Response:
        data = s.QueueUpdateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        access = request_access(request)
        queue = selectors.queue_get(access=access, queue_id=queue_id)
        require_role(access, queue.tenant, Membership.Role.ADMIN, "managing queues")
        queue = services.queue_update(queue=queue, data=data.validated_data)
        return Response(s.QueueOutputSerializer(queue).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, queue_id: int) -> Response:
        access = request_access(request)
        queue = selectors.queue_get(access=access, queue_id=queue_id)
        require_role(access, queue.tenant, Membership.Role.ADMIN, "managing queues")
        services.queue_delete(queue=queue)
        return Response(status=status.HTTP_204_NO_CONTENT)


class QuotaListCreateApi(generics.ListAPIView):
    serializer_class = s.QuotaOutputSerializer
    filterset_class = QuotaFilter

    def get_queryset(self):
        return selectors.quota_list(access=request_access(self.request))

    @extend_schema(
        operation_id="quotas_set", request=s.QuotaInputSerializer, responses={201: s.QuotaOutputSerializer}
    )
    def post(self, request: Request) -> Response:
        access = request_access(request)
        require_platform_admin(access, "setting quotas")
        data = s.QuotaInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        tenant = tenant_get_by_slug(slug=values.pop("tenant"))
        pool = pool_get_by_name(name=values.pop("pool"))
        errors = {}
        if tenant is None:
            errors["tenant"] = [f"unknown tenant {request.data.get('tenant')!r}"]
        if pool is None:
            errors["pool"] = [f"unknown pool {request.data.get('pool')!r}"]
        if errors:
            raise ValidationError(errors)
        quota = services.quota_set(tenant=tenant, pool=pool, **values)
        return Response(
            s.QuotaOutputSerializer(selectors.quota_get(access=access, quota_id=quota.pk)).data,
            status=status.HTTP_201_CREATED,
        )


class QuotaDetailApi(APIView):
    @extend_schema(responses=s.QuotaOutputSerializer)
    def get(self, request: Request, quota_id: int) -> Response:
        quota = selectors.quota_get(access=request_access(request), quota_id=quota_id)
        return Response(s.QuotaOutputSerializer(quota).data)

    @extend_schema(request=s.QuotaUpdateInputSerializer, responses=s.QuotaOutputSerializer)
    def patch(self, request: Request, quota_id: int) -> Response:
        access = request_access(request)
        quota = selectors.quota_get(access=access, quota_id=quota_id)
        require_platform_admin(access, "setting quotas")
        data = s.QuotaUpdateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = {
            "guaranteed_milli": quota.guaranteed_milli,
            "borrow_limit_milli": quota.borrow_limit_milli,
            "gpu_mem_limit_mib": quota.gpu_mem_limit_mib,
            **data.validated_data,
        }
        services.quota_set(tenant=quota.tenant, pool=quota.pool, **values)
        return Response(s.QuotaOutputSerializer(selectors.quota_get(access=access, quota_id=quota.pk)).data)
