"""`GET /metrics`: the Prometheus text exposition format (0.0.4), outside the versioned API; `GET /healthz`
and `GET /readyz`: liveness and readiness for a supervisor or a load balancer (docs/logs-and-metrics.md).

Access (decision, docs/metrics.md): with `WHALEGEN_METRICS_TOKEN` set, a scraper must send
`Authorization: Bearer <that token>` and nothing else gets in; unset, only platform admins do (a signed-in
staff session or a staff user's API token). Never open: the figures name tenants and their quotas.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client.exposition import generate_latest

from apps.metrics.collector import registry_for
from apps.metrics.selectors import readiness
from apps.tenants.services import token_authenticate

# The classic text format every Prometheus reads; prometheus_client's CONTENT_TYPE_LATEST moved to 1.0.0.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _refuse(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _denied(request: HttpRequest) -> HttpResponse | None:
    """The refusal for this request, or None when it may read the metrics."""
    expected = settings.WHALEGEN_METRICS_TOKEN
    sent = _bearer(request)
    if expected:
        if sent is None:
            return _refuse(401, "metrics need `Authorization: Bearer <WHALEGEN_METRICS_TOKEN>`")
        if not hmac.compare_digest(sent.encode(), expected.encode()):
            return _refuse(401, "the bearer token is not this plane's WHALEGEN_METRICS_TOKEN")
        return None
    if sent is not None:
        token = token_authenticate(raw=sent)
        if token is None:
            return _refuse(401, "the bearer token is unknown, revoked or expired")
        user = token.user
    else:
        user = request.user
    if not user.is_authenticated:
        return _refuse(
            401,
            "metrics are for platform admins: sign in, send a staff user's API token as "
            "`Authorization: Bearer <token>`, or set WHALEGEN_METRICS_TOKEN for the scraper",
        )
    if not user.is_staff:
        return _refuse(403, "metrics are for platform admins (staff users)")
    return None


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _denied(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(registry_for(now=timezone.now())), content_type=CONTENT_TYPE)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serves requests; nothing else is asked (no database)."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when every check passes, else 503 naming the failing ones. Unauthenticated: it says whether the
    plane works, not what it holds."""
    try:
        result = readiness(now=timezone.now())
    except Exception as error:  # the checks guard themselves; this is the last line, never a 500
        return JsonResponse({"status": "fail", "failing": ["readiness"], "error": str(error)}, status=503)
    body = {
        "status": "ok" if result.ok else "fail",
        "failing": result.failing,
        "checks": {check.name: {"ok": check.ok, "detail": check.detail} for check in result.checks},
    }
    return JsonResponse(body, status=200 if result.ok else 503)
