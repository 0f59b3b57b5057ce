"""Joining: the agent's `POST JOIN_PATH` (a host trades a join token for its node credential), join tokens
for platform admins (`/api/v1/join-tokens/`), and approving a joined node. Thin: parse, call a service,
answer."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.fleet.api.views import NodeStateOutput
from apps.fleet.join import join_token_create, join_token_revoke, node_approve, node_join
from apps.fleet.models import JoinToken
from apps.fleet.selectors import join_token_list, join_token_target
from apps.inventory.selectors import node_get
from apps.tenants.access import request_access, require_platform_admin
from apps.workloads.services import user_actor
from whalegen import protocol as p


class JoinApi(APIView):
    """No credential in the header: the join token in the body is what this endpoint checks, and a
    session or API token is nothing here (a person joins no host)."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    # Wire format (`whalegen.protocol.Join`), documented in docs/agent.md like the other agent paths.
    schema = None

    def post(self, request: Request) -> Response:
        try:
            message = p.decode_checked(p.Join, request.data)
        except p.ProtocolError as error:
            return Response({"detail": str(error)}, status=status.HTTP_400_BAD_REQUEST)
        outcome = node_join(message=message)
        return Response(outcome.joined().to_dict(), status=status.HTTP_201_CREATED)


class JoinTokenOutput(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name")
    cluster = serializers.CharField(source="cluster.name")
    state = serializers.SerializerMethodField()
    # Declared, not derived from the model: a positive integer column's bound differs by database, and the
    # committed OpenAPI document must not.
    uses = serializers.IntegerField(read_only=True)
    max_uses = serializers.IntegerField(read_only=True, allow_null=True, help_text="null: unlimited")

    class Meta:
        model = JoinToken
        fields = [
            "id",
            "name",
            "pool",
            "cluster",
            "prefix",
            "state",
            "uses",
            "max_uses",
            "requires_approval",
            "created_at",
            "created_by",
            "expires_at",
            "revoked_at",
            "revoked_by",
        ]

    def get_state(self, token: JoinToken) -> str:
        """active, expired, revoked or used_up: what a host presenting it now would meet."""
        now: datetime = self.context.get("now") or timezone.now()
        if token.revoked_at is not None:
            return "revoked"
        if token.expires_at <= now:
            return "expired"
        if token.max_uses is not None and token.uses >= token.max_uses:
            return "used_up"
        return "active"


class JoinTokenCreateInput(serializers.Serializer):
    pool = serializers.CharField(max_length=64)
    cluster = serializers.CharField(
        max_length=64, required=False, allow_blank=True, help_text="default: the pool's only cluster"
    )
    ttl_s = serializers.IntegerField(min_value=1, default=3600, help_text="seconds until it expires")
    max_uses = serializers.IntegerField(
        min_value=1, allow_null=True, default=1, help_text="hosts it may join; null: unlimited until expiry"
    )
    requires_approval = serializers.BooleanField(
        default=False, help_text="nodes joined with it take no work until a platform admin approves them"
    )
    name = serializers.SlugField(max_length=64, required=False, allow_blank=True)


class JoinTokenCreatedOutput(JoinTokenOutput):
    token = serializers.CharField(help_text="the secret: shown once, never stored")

    class Meta(JoinTokenOutput.Meta):
        fields = [*JoinTokenOutput.Meta.fields, "token"]


class JoinTokenListCreateApi(APIView):
    @extend_schema(responses=JoinTokenOutput(many=True), summary="List join tokens (platform admins)")
    def get(self, request: Request) -> Response:
        require_platform_admin(request_access(request), "listing join tokens")
        return Response(JoinTokenOutput(join_token_list(), many=True).data)

    @extend_schema(
        request=JoinTokenCreateInput,
        responses={201: JoinTokenCreatedOutput},
        summary="Make a join token for a pool; its secret is in the answer, once (platform admins)",
    )
    def post(self, request: Request) -> Response:
        require_platform_admin(request_access(request), "making join tokens")
        data = JoinTokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        pool, cluster = join_token_target(
            pool_name=data.validated_data["pool"], cluster_name=data.validated_data.get("cluster") or None
        )
        token, raw = join_token_create(
            pool=pool,
            cluster=cluster,
            ttl_s=data.validated_data["ttl_s"],
            max_uses=data.validated_data["max_uses"],
            requires_approval=data.validated_data["requires_approval"],
            name=data.validated_data.get("name") or "",
            created_by=user_actor(request.user),
        )
        token.token = raw  # type: ignore[attr-defined]  # for the output only; never saved
        return Response(JoinTokenCreatedOutput(token).data, status=status.HTTP_201_CREATED)


class JoinTokenRevokeApi(APIView):
    @extend_schema(request=None, responses=JoinTokenOutput, summary="Revoke a join token (platform admins)")
    def post(self, request: Request, token_id: int) -> Response:
        require_platform_admin(request_access(request), "revoking join tokens")
        token = join_token_list().filter(pk=token_id).first()
        if token is None:
            return Response({"detail": f"no join token {token_id}"}, status=status.HTTP_404_NOT_FOUND)
        token = join_token_revoke(token=token, actor=user_actor(request.user))
        return Response(JoinTokenOutput(token).data)


@extend_schema(
    request=None,
    responses=NodeStateOutput,
    summary="Approve a node that joined with an approval token: it takes work (platform admins)",
)
class NodeApproveApi(APIView):
    def post(self, request: Request, node_id: int) -> Response:
        access = request_access(request)
        require_platform_admin(access, "approving a node")
        node = node_get(access=access, node_id=node_id)
        return Response(NodeStateOutput(node_approve(node=node, actor=user_actor(request.user))).data)
