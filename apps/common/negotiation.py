"""Content negotiation that never answers 406: the API speaks JSON, so a client that asks for something
else (a browser's `Accept: text/html`, `Accept: image/png`) gets JSON rather than an error page."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class JsonFirstContentNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request: Any, renderers: list[Any], format_suffix: str | None = None) -> Any:
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type
