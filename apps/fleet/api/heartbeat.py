"""The heartbeat endpoint without DRF (docs/fleet.md, "Heartbeat load"): 2,000 nodes beating every 10 s
are 200 requests a second, and the framework's per-request work cost more than the heartbeat itself.

`answer` takes the request's `Authorization` header, `Content-Type` and body and returns the status,
the JSON body and extra headers. Two callers: the Django view at the protocol's path (tests, the
embedded default, anything served through Django's handler), and `whalegen.config.wsgi`, which answers
`POST` at that path before Django's middleware and URL resolution. The answers are the ones the DRF
view gave: 401 with `WWW-Authenticate` for a missing or unknown credential, 415 for a body that is not
JSON, 400 for a message that does not decode, 403 for another node's id, 409 for another major protocol
version, 200 with the `HeartbeatAck`.

With `shortcut` (the WSGI front's heartbeats), a heartbeat that changes nothing since the node's last
full one is recorded in Redis only (`apps.fleet.liveness`): same decoding and checks, then one Lua
script instead of a transaction; its answer carries the generation last served. A node whose desired
state was marked changed since (`apps.fleet.changes`) takes the full way, which answers the new
generation: an agent holding an older one fetches.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from apps.common.errors import ApplicationError
from apps.fleet import changes, liveness
from apps.fleet.api.views import _wire_problem
from apps.fleet.credentials import credentials
from apps.fleet.selectors import credential_hash
from apps.fleet.services import agent_heartbeat_outcome
from apps.inventory.models import Node
from whalegen import protocol as p

log = logging.getLogger("whalegen.fleet")

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="agent"'}
_NEEDS_BEARER = "agent endpoints need `Authorization: Bearer <node token>`"

Answer = tuple[int, dict[str, Any], dict[str, str]]


@functools.lru_cache(maxsize=4096)
def _ack(generation: int) -> dict[str, Any]:
    return p.HeartbeatAck(generation=generation).to_dict()


def _refused(status: int, detail: str, headers: dict[str, str] | None = None) -> Answer:
    return status, {"detail": detail}, headers or {}


def answer(*, authorization: str, content_type: str, body: bytes, shortcut: bool = False) -> Answer:
    """One heartbeat request, authenticated first (as DRF did), then decoded, then recorded."""
    parts = authorization.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return _refused(401, _NEEDS_BEARER, CHALLENGE)
    # The shortcut's credential check is the fingerprint in Redis, which holds the credential's hash;
    # a credential this process has not seen yet (each web process has its own memory) is looked up
    # once (one indexed query) and may take the shortcut too.
    known = credentials.known(parts[1], within_s=liveness.FINGERPRINT_TTL_S) if shortcut else None
    node = None if known is not None else credentials.node_for(parts[1])
    if known is None and node is None:
        return _refused(401, "unknown node token", CHALLENGE)
    if shortcut and known is None:
        known = credentials.known(parts[1], within_s=liveness.FINGERPRINT_TTL_S)
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return _refused(415, f'Unsupported media type "{content_type}" in request.')
    try:
        data = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError) as error:
        return _refused(400, f"JSON parse error - {error}")
    now = timezone.now()
    if known is not None:
        generation = liveness.beat(
            node_id=known.node_id, data=data, body=body, now=now, credential=known.digest
        )
        if generation is not None:
            # The protocol's encoding, remembered per generation (a copy: the caller owns its answer).
            return 200, dict(_ack(generation)), {}
        node = node or credentials.node_for(parts[1])
        if node is None:
            return _refused(401, "unknown node token", CHALLENGE)
    try:
        message = p.Heartbeat.from_dict(data)
    except p.ProtocolError as error:
        return _refused(400, str(error))
    problem = _wire_problem(data, message)
    if problem is not None:
        return _refused(400, f"Heartbeat: {problem}")
    assert node is not None
    # Read before the desired state is built: a writer committing meanwhile moves the mark past this one,
    # so the next beat takes the full way and answers the generation with that change.
    mark = changes.read(node.pk) if shortcut else None
    try:
        outcome = agent_heartbeat_outcome(node=node, message=message, now=now)
    except ApplicationError as error:
        return _refused(error.status, error.message)
    except Node.DoesNotExist:  # deleted since its credential was remembered
        credentials.forget(node.pk)
        return _refused(401, "unknown node token", CHALLENGE)
    if shortcut and outcome.quiet:
        digest = credential_hash(parts[1])
        # Checked against the row, not the memory: a credential replaced in another process within
        # WHALEGEN_AUTH_CACHE_S must not be remembered as the node's (its fingerprint would outlive it).
        if Node.objects.filter(pk=node.pk, agent_credential_hash=digest).exists():
            liveness.remember(
                node_id=node.pk,
                data=data,
                message=message,
                credential=digest,
                generation=outcome.ack.generation,
                telemetry_at=outcome.telemetry_at,
                mark=mark,
            )
    return 200, outcome.ack.to_dict(), {}


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
