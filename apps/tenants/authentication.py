"""`Authorization: Bearer <token>` for pipelines; the browser uses Django sessions."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.tenants.callers import callers
from apps.tenants.selectors import access_for
from apps.tenants.services import token_authenticate, token_hash
from whalegen.config.logging import log_context_add


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
        # A token used in the last few seconds is remembered with its access (apps.tenants.callers
        # says for how long and why that is safe); otherwise one lookup and the access resolution.
        digest = token_hash(raw)
        now = timezone.now()
        caller = callers.get(digest, now=now)
        if caller is None:
            generation = callers.generation
            token = token_authenticate(raw=raw, now=now)
            if token is None:
                raise exceptions.AuthenticationFailed("Token is unknown, revoked or expired.")
            caller = callers.put(
                digest,
                token=token,
                access=access_for(user=token.user, token=token),
                ttl_s=settings.WHALEGEN_AUTH_CACHE_S,
                generation=generation,
            )
        # apps.tenants.access.request_access reads it from here instead of resolving it again.
        request._whalegen_access = caller.access  # type: ignore[attr-defined]
        log_context_add(request, tenant=caller.token.tenant.slug)  # on this request's log lines
        return caller.token.user, caller.token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
