"""`Authorization: Bearer <token>` for pipelines; the browser uses Django sessions."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.tenants.services import token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be `Bearer <token>`.")
        try:
            raw = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Token contains invalid characters.") from exc
        token = token_authenticate(raw=raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Token is unknown, revoked or expired.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
