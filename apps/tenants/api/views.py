"""Tenants API: which tenants the caller may act in, with what role; and the caller's own API tokens.

Tokens (docs/api.md, "API tokens"): a member makes, lists and revokes their own; a tenant admin also
sees and revokes every token of the tenants they administer; a platform admin sees and revokes all.
Another's token the caller may not see is a 404. Revocation is `POST tokens/{id}/revoke/`, an action
sub-path like `tasks/{id}/cancel/`: the token stays listed (revoked) with its audit trail.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.tenants import selectors, services
from apps.tenants.access import request_access, request_token, resolve_tenant
from apps.tenants.api import serializers as s
from apps.tenants.models import ApiToken, Membership


class TenantListApi(generics.ListAPIView):
    serializer_class = s.TenantOutputSerializer
    filterset_class = None

    def get_queryset(self):
        return selectors.tenant_list(access=request_access(self.request))

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "access": request_access(self.request)}


def _token_get(request: Request, token_id: int) -> ApiToken:
    return selectors.token_get(
        access=request_access(request),
        user=request.user,
        token_id=token_id,
        scope_token=request_token(request),
    )


class TokenListCreateApi(generics.ListAPIView):
    serializer_class = s.TokenOutputSerializer
    filterset_class = None

    def get_queryset(self):
        return selectors.token_list(
            access=request_access(self.request),
            user=self.request.user,
            scope_token=request_token(self.request),
        )

    @extend_schema(
        operation_id="tokens_create",
        request=s.TokenCreateInputSerializer,
        responses={201: s.TokenCreatedOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        data = s.TokenCreateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        # Any role will do to make a token (a viewer may want a read-only one); the service keeps the
        # token's role at or below the caller's.
        tenant = resolve_tenant(
            request, values.get("tenant"), role=Membership.Role.VIEWER, action="making API tokens"
        )
        token, raw = services.token_create(
            user=request.user,
            tenant=tenant,
            name=values["name"],
            role=values.get("role"),
            ttl_days=values.get("ttl_days"),
            expires_at=values.get("expires_at"),
            access=request_access(request),
            by=request.user,
            via=services.Via.API,
            via_token=request_token(request),
        )
        body = s.TokenCreatedOutputSerializer(token, context={"secret": raw}).data
        # The secret is in this answer only: no cache on the way may keep it.
        return Response(body, status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})


class TokenDetailApi(APIView):
    @extend_schema(responses=s.TokenDetailOutputSerializer)
    def get(self, request: Request, token_id: int) -> Response:
        return Response(s.TokenDetailOutputSerializer(_token_get(request, token_id)).data)


class TokenRevokeApi(APIView):
    @extend_schema(operation_id="tokens_revoke", request=None, responses=s.TokenDetailOutputSerializer)
    def post(self, request: Request, token_id: int) -> Response:
        token = _token_get(request, token_id)
        services.token_revoke(
            token=token, by=request.user, via=services.Via.API, via_token=request_token(request)
        )
        return Response(s.TokenDetailOutputSerializer(_token_get(request, token_id)).data)
