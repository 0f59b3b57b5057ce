"""Agent endpoints (`whalegen.protocol` paths) and operator actions on nodes. Thin: parse, call a
service, answer. The heartbeat is answered without DRF (`heartbeat_view`, `apps.fleet.heartbeat`)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.fleet import heartbeat
from apps.fleet.agents import agent_register, desired_state_wait
from apps.fleet.authentication import IsNodeAgent, NodeTokenAuthentication
from apps.fleet.nodes import node_cordon, node_drain, node_uncordon
from apps.fleet.reports import agent_report
from apps.inventory.models import Node
from apps.inventory.selectors import node_get
from apps.tenants.access import request_access, require_platform_admin
from apps.workloads.services import user_actor
from whalegen import protocol as p


class _AgentApi(APIView):
    """Base of the agent endpoints: node credential only; wire messages, not serializers."""

    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNodeAgent]
    # The wire format is `whalegen.protocol`, documented in docs/agent.md; not part of the public API.
    schema = None

    def node(self, request: Request) -> Node:
        assert isinstance(request.auth, Node)
        return request.auth

    def message(self, request: Request, kind: type[p.T]) -> p.T | Response:
        try:
            return p.decode_checked(kind, request.data)
        except p.ProtocolError as error:
            return Response({"detail": str(error)}, status=status.HTTP_400_BAD_REQUEST)


class RegisterApi(_AgentApi):
    def post(self, request: Request) -> Response:
        message = self.message(request, p.Register)
        if isinstance(message, Response):
            return message
        return Response(agent_register(node=self.node(request), message=message).to_dict())


class ReportApi(_AgentApi):
    def post(self, request: Request) -> Response:
        message = self.message(request, p.Report)
        if isinstance(message, Response):
            return message
        return Response(agent_report(node=self.node(request), message=message).to_dict())


class DesiredStateApi(_AgentApi):
    def get(self, request: Request) -> Response:
        try:
            known = int(request.query_params.get("generation", "0"))
            wait_s = float(request.query_params.get("wait_s", "0"))
        except ValueError:
            return Response({"detail": "generation must be an integer and wait_s a number"}, status=400)
        desired = desired_state_wait(node=self.node(request), known_generation=known, wait_s=wait_s)
        if desired is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(desired.to_dict())


@csrf_exempt
def heartbeat_view(request: HttpRequest) -> HttpResponse:
    """`POST /api/v1/agent/heartbeat/` through Django's handler (what `whalegen.config.wsgi` does not
    answer itself): the same `apps.fleet.heartbeat.answer`, without the fast path."""
    if request.method != "POST":
        response = JsonResponse({"detail": f'Method "{request.method}" not allowed.'}, status=405)
        response["Allow"] = "POST, OPTIONS"
        return response
    status_code, body, headers = heartbeat.answer(
        authorization=request.headers.get("Authorization", ""),
        content_type=request.content_type or "",
        body=request.body,
        environ=request.META,
    )
    response = JsonResponse(body, status=status_code)
    for name, value in headers.items():
        response[name] = value
    return response


class NodeStateOutput(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = ["id", "name", "state", "last_heartbeat_at", "version"]


class _NodeActionApi(APIView):
    action_name = ""

    def act(self, node: Node, actor: str) -> Node:
        raise NotImplementedError

    def post(self, request: Request, node_id: int) -> Response:
        access = request_access(request)
        require_platform_admin(access, f"{self.action_name} a node")
        node = node_get(access=access, node_id=node_id)
        node = self.act(node, user_actor(request.user))
        return Response(NodeStateOutput(node).data)


@extend_schema(request=None, responses=NodeStateOutput, summary="Cordon a node: it takes no new task")
class NodeCordonApi(_NodeActionApi):
    action_name = "cordon"

    def act(self, node: Node, actor: str) -> Node:
        return node_cordon(node=node, actor=actor)


@extend_schema(request=None, responses=NodeStateOutput, summary="Uncordon a node: it takes tasks again")
class NodeUncordonApi(_NodeActionApi):
    action_name = "uncordon"

    def act(self, node: Node, actor: str) -> Node:
        return node_uncordon(node=node, actor=actor)


@extend_schema(
    request=None,
    responses=NodeStateOutput,
    summary="Drain a node: cordon it, requeue its preemptible tasks, let the others finish",
)
class NodeDrainApi(_NodeActionApi):
    action_name = "drain"

    def act(self, node: Node, actor: str) -> Node:
        return node_drain(node=node, actor=actor)
