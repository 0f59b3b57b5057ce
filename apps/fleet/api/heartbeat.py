"""The heartbeat endpoint without DRF (docs/fleet.md, "Heartbeat load"): 2,000 nodes beating every 10 s
are 200 requests a second, and the framework's per-request work cost more than the heartbeat itself.

`answer` takes the request's `Authorization` header, `Content-Type` and body and returns the status,
the JSON body and extra headers. Two callers: the Django view at the protocol's path (tests, the
embedded default, anything served through Django's handler), and `whalegen.config.wsgi`, which answers
`POST` at that path before Django's middleware and URL resolution. The answers are the ones the DRF
view gave: 401 with `WWW-Authenticate` for a missing or unknown credential, 415 for a body that is not
JSON, 400 for a message that does not decode, 403 for another node's id, 409 for another major protocol
version, 200 with the `HeartbeatAck`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.common.errors import ApplicationError
from apps.fleet.api.views import _wire_problem
from apps.fleet.credentials import credentials
from apps.fleet.services import agent_heartbeat
from apps.inventory.models import Node
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="agent"'}
_NEEDS_BEARER = "agent endpoints need `Authorization: Bearer <node token>`"

Answer = tuple[int, dict[str, Any], dict[str, str]]


def _refused(status: int, detail: str, headers: dict[str, str] | None = None) -> Answer:
    return status, {"detail": detail}, headers or {}


def answer(*, authorization: str, content_type: str, body: bytes) -> Answer:
    """One heartbeat request, authenticated first (as DRF did), then decoded, then recorded."""
    parts = authorization.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return _refused(401, _NEEDS_BEARER, CHALLENGE)
    node = credentials.node_for(parts[1])
    if node is None:
        return _refused(401, "unknown node token", CHALLENGE)
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return _refused(415, f'Unsupported media type "{content_type}" in request.')
    try:
        data = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError) as error:
        return _refused(400, f"JSON parse error - {error}")
    try:
        message = p.Heartbeat.from_dict(data)
    except p.ProtocolError as error:
        return _refused(400, str(error))
    problem = _wire_problem(data, message)
    if problem is not None:
        return _refused(400, f"Heartbeat: {problem}")
    try:
        ack = agent_heartbeat(node=node, message=message)
    except ApplicationError as error:
        return _refused(error.status, error.message)
    except Node.DoesNotExist:  # deleted since its credential was remembered
        credentials.forget(node.pk)
        return _refused(401, "unknown node token", CHALLENGE)
    return 200, ack.to_dict(), {}


@csrf_exempt
def heartbeat_view(request: HttpRequest) -> HttpResponse:
    """`POST /api/v1/agent/heartbeat/` through Django's handler (what `whalegen.config.wsgi` does not
    answer itself)."""
    if request.method != "POST":
        response = JsonResponse({"detail": f'Method "{request.method}" not allowed.'}, status=405)
        response["Allow"] = "POST, OPTIONS"
        return response
    status, body, headers = answer(
        authorization=request.headers.get("Authorization", ""),
        content_type=request.content_type or "",
        body=request.body,
    )
    response = JsonResponse(body, status=status)
    for name, value in headers.items():
        response[name] = value
    return response
