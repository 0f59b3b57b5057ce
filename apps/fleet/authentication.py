"""Agents authenticate with their node's credential (`Authorization: Bearer <node token>`).

Only the agent endpoints use this class, and only this class: a user's API token is not a node
credential and is refused there (401), and a node credential is nothing anywhere else.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from apps.fleet.selectors import node_for_token
from apps.inventory.models import Node
from whalegen.config.logging import log_context_add


class NodeTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode() or len(header) != 2:
            raise exceptions.AuthenticationFailed("agent endpoints need `Authorization: Bearer <node token>`")
        try:
            raw = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("token contains invalid characters") from exc
        node = node_for_token(raw=raw)
        if node is None:
            raise exceptions.AuthenticationFailed("unknown node token")
        log_context_add(request, node=node.name)  # on this request's log lines
        return AnonymousUser(), node

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="agent"'


class IsNodeAgent(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Node)
