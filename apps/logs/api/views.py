"""`GET /api/v1/tasks/{id}/logs/`: a run's captured output, paged by line number, optionally followed."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.logs import selectors
from apps.logs.api import serializers as s
from apps.tenants.access import request_access
from apps.workloads.selectors import task_get


class TaskLogsApi(APIView):
    @extend_schema(
        operation_id="tasks_logs",
        parameters=[s.LogQuerySerializer],
        responses=s.LogPageSerializer,
        description=(
            "Lines `offset`… of one attempt's output (stdout, stderr and the launcher's own lines, in the "
            "order the agent read them). With `follow=true` the call waits up to `wait_s` for lines after "
            "`offset`; read on from `next_offset` until `complete` is true (the attempt ended and all "
            "its output is here). Who may see the task may read its output; others get 404."
        ),
    )
    def get(self, request: Request, task_id: int) -> Response:
        query = s.LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        task = task_get(access=request_access(request), task_id=task_id)
        if q["follow"]:
            page = selectors.task_log_wait(
                task=task, attempt=q.get("attempt"), offset=q["offset"], limit=q["limit"], wait_s=q["wait_s"]
            )
        else:
            page = selectors.task_log_page(
                task=task, attempt=q.get("attempt"), offset=q["offset"], limit=q["limit"], tail=q.get("tail")
            )
        return Response(s.LogPageSerializer(page).data)
