"""`GET /api/v1/`: an index of the API's resources, so the URL the demo prints answers with a map."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

# (name, URL name, what it holds): the public resources; agent endpoints are documented in docs/agent.md.
RESOURCES = [
    ("tasks", "tasks", "submit, list and cancel tasks; `tasks/bulk/` submits many at once"),
    ("queues", "queues", "your tenants' queues"),
    ("quotas", "quotas", "quotas with their usage"),
    ("pools", "pools", "the pools your tenants hold quota in"),
    ("clusters", "clusters", "clusters behind those pools"),
    ("nodes", "nodes", "nodes behind those pools"),
    ("gpus", "gpus", "GPUs and their compute units"),
    ("overrides", "overrides", "priority override requests and decisions"),
    ("tenants", "tenants", "the tenants you may act in, with your role"),
    ("forecast_models", "forecast-models", "the forecasting model registry"),
    ("profiles", "profiles", "task profiles with right-sizing advice"),
    ("accounting", "accounting", "GPU-hours (and money) per tenant, queue, pool and GPU model; CSV too"),
    ("budgets", "budgets", "monthly GPU-hour budgets per tenant and pool, with their audit trail"),
]


class ApiIndexApi(APIView):
    # The index says what exists, not what is in it: open to anyone (the schema is too).
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="api_index",
        responses=inline_serializer(
            "ApiIndex",
            {
                "version": serializers.CharField(),
                "schema": serializers.URLField(),
                "docs": serializers.URLField(),
                "resources": serializers.DictField(
                    child=inline_serializer(
                        "ApiIndexResource",
                        {"url": serializers.URLField(), "description": serializers.CharField()},
                    )
                ),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "version": "1",
                "schema": reverse("schema", request=request),
                "docs": reverse("swagger-ui", request=request),
                "resources": {
                    name: {"url": reverse(url_name, request=request), "description": description}
                    for name, url_name, description in RESOURCES
                },
            }
        )
