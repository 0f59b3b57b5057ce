"""Agent endpoints (`whalegen.protocol` paths) and operator actions on nodes. Thin: parse, call a
service, answer. The heartbeat is answered without DRF (`apps.fleet.api.heartbeat`)."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.common.api import request_access, require_platform_admin
from apps.fleet.authentication import IsNodeAgent, NodeTokenAuthentication
from apps.fleet.services import (
    agent_register,
    agent_report,
    desired_state_wait,
    node_cordon,
    node_drain,
    node_uncordon,
)
from apps.inventory.models import Node
from apps.inventory.selectors import node_get
from apps.workloads.services import user_actor
from whalegen import protocol as p

_VERSION = re.compile(r"\d{1,9}(\.[0-9A-Za-z.+-]*)?")
_INT64_MAX = 2**63 - 1


def _wire_problem(data: Any, message: p.Message) -> str | None:
    """What the plane could not store or compare although the message decoded: an integer beyond the
    64-bit columns (a report's `seq`, a generation), or a protocol version without a numeric major."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{where}.{key}" if where else str(key), value) for key, value in item.items())
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", value) for index, value in enumerate(item))
        elif (
            isinstance(item, int) and not isinstance(item, bool) and not -_INT64_MAX - 1 <= item <= _INT64_MAX
        ):
            return f"{where}: {item} is outside the 64-bit range the plane stores"
    if isinstance(message, p.Report) and message.seq < 0:
        return f"seq {message.seq} is negative"
    version = getattr(message, "protocol_version", None)
    if isinstance(version, str) and not _VERSION.fullmatch(version):
        return f"protocol_version {version[:40]!r} is not MAJOR.MINOR (e.g. {p.PROTOCOL_VERSION!r})"
    return None


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
            message = kind.from_dict(request.data)
        except p.ProtocolError as error:
            return Response({"detail": str(error)}, status=status.HTTP_400_BAD_REQUEST)
        problem = _wire_problem(request.data, message)
        if problem is not None:
            return Response({"detail": f"{kind.__name__}: {problem}"}, status=status.HTTP_400_BAD_REQUEST)
        return message


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
