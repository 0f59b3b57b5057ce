"""Log lines in both formats (`WHALEGEN_LOG_FORMAT=plain|json`): their fields, the request id, the plane's
context fields, and no credential in either — checked on records the plane itself emits while serving a
request that carries a bearer token and a node token, and on records that put those tokens in their text."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from tests.apps.fleet.conftest import fleet  # noqa: F401  (the world with node credentials)
from whalegen import logformat
from whalegen import protocol as p
from whalegen.config.logging import (
    REDACTED,
    JsonFormatter,
    PlainFormatter,
    RedactFilter,
    RequestContextFilter,
    logging_config,
    redact,
)

# Imported here, not in a test: importing the front sets Django up again, which replaces the root
# logger's handlers (the `captured` fixture's among them).
from whalegen.config.wsgi import application
from whalegen.logformat import ENVIRON_FIELDS_KEY

FORMATS = {"plain": PlainFormatter, "json": JsonFormatter}


class Captured:
    """A handler built as `logging_config` builds the console one, on the root logger, into a buffer."""

    def __init__(self, fmt: str) -> None:
        console = logging_config(fmt=fmt, level="DEBUG", access_level="DEBUG")["handlers"]["console"]
        assert console["filters"] == ["request", "redact"] and console["formatter"] == fmt
        self.buffer = io.StringIO()
        self.handler = logging.StreamHandler(self.buffer)
        self.handler.setFormatter(FORMATS[fmt]())
        self.handler.addFilter(RequestContextFilter())
        self.handler.addFilter(RedactFilter())

    def text(self) -> str:
        return self.buffer.getvalue()

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines() if line.startswith("{")]


@pytest.fixture(params=["plain", "json"])
def captured(request: pytest.FixtureRequest) -> Iterator[Captured]:
    made = Captured(request.param)
    root = logging.getLogger()
    level, component = root.level, logformat._component
    root.addHandler(made.handler)
    root.setLevel(logging.DEBUG)
    logformat._component = None  # a process nobody named: an in-process test may have named this one
    try:
        yield made
    finally:
        root.removeHandler(made.handler)
        root.setLevel(level)
        logformat._component = component


def test_a_request_with_a_bearer_header_and_a_node_token_leaves_neither_in_the_logs(
    captured: Captured,
    fleet: Any,  # noqa: F811
    client: Client,
) -> None:
    node_token = fleet.token_a
    bearer = "eyJhbGciOiJIUzI1NiJ9.not-a-real-jwt.signature0123"
    # 1. A real request: an unknown bearer on the agent API is refused, and Django logs the refusal.
    response = client.post(
        f"/api/v1/agent/heartbeat/?token={node_token}",
        data="{}",
        content_type="application/json",
        headers={"Authorization": f"Bearer {bearer}", "X-Request-ID": "req-logs-1"},
    )
    assert response.status_code in (400, 401, 403)
    # 2. Code that logs what it should not: a header dict, a URL with a token, a settings dump, a traceback.
    log = logging.getLogger("apps.fleet.services")
    log.warning("agent call failed: headers=%s", {"Authorization": f"Bearer {bearer}"})
    log.info("retrying %s", f"https://plane.example/api/v1/agent/poll/?node=3&token={node_token}&x=1")
    log.info("node token %s issued", node_token, extra={"node": "gpu-001", "task_id": 42})
    log.error('config: SECRET_KEY=s3cr3t-key-value password="hunter2hunter2" "api_key": "k-123456"')
    try:
        raise RuntimeError(f"refused Authorization: Bearer {bearer}")
    except RuntimeError:
        log.exception("agent request failed")

    text = captured.text()
    for secret in (node_token, bearer, "s3cr3t-key-value", "hunter2hunter2", "k-123456"):
        assert secret not in text
    assert text.count(REDACTED) >= 7
    assert "Unauthorized" in text or "Forbidden" in text or "Bad Request" in text  # Django's own line
    assert "node=3" in text and "&x=1" in text  # only the secret goes, the rest of the line stays


def test_json_lines_carry_the_fields_and_the_context(captured: Captured, client: Client) -> None:
    if isinstance(captured.handler.formatter, PlainFormatter):
        logging.getLogger("whalegen.fleet").info("cycle done", extra={"pool": "h100", "cycle_id": 7})
        assert captured.text().rstrip().endswith("cycle done [pool=h100 cycle_id=7]")
        return
    logging.getLogger("whalegen.fleet").info(
        "task %s started on %s", 42, "gpu-001", extra={"task_id": 42, "node": "gpu-001", "pool": "h100"}
    )
    (line,) = captured.json_lines()
    assert list(line) == ["time", "level", "component", "logger", "message", "node", "task_id", "pool"]
    assert line["level"] == "INFO" and line["logger"] == "whalegen.fleet"
    assert line["message"] == "task 42 started on gpu-001" and line["task_id"] == 42
    assert line["time"].endswith("+00:00") and line["component"] == "plane"  # no process named it


@pytest.mark.django_db
def test_records_logged_while_serving_a_request_carry_its_id(captured: Captured, client: Client) -> None:
    response = client.get("/api/v1/tasks/", headers={"X-Request-ID": "req-abc-123"})
    assert response.status_code == 401
    assert response["X-Request-ID"] == "req-abc-123"
    if isinstance(captured.handler.formatter, JsonFormatter):
        assert [
            line["request_id"] for line in captured.json_lines() if line["logger"] == "django.request"
        ] == ["req-abc-123"]
    else:
        assert "request_id=req-abc-123" in captured.text()


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("Authorization: Bearer abc.def", f"Authorization: Bearer {REDACTED}"),
        ("basic dXNlcjpwYXNz", f"basic {REDACTED}"),
        ("GET /x?token=abc&y=2", f"GET /x?token={REDACTED}&y=2"),
        ("{'password': 'pw1'}", f"{{'password': '{REDACTED}'}}"),
        ("SECRET_KEY=abc123", f"SECRET_KEY={REDACTED}"),
        ("node_token: wgn_xyz", f"node_token: {REDACTED}"),
        ("issued wg_abcdefghijklmnopqrstuv", f"issued {REDACTED}"),
        ("pool h100 has 3 tokens of advice", "pool h100 has 3 tokens of advice"),
        # Redacting twice (the filter, then the formatter) leaves the first result alone.
        (f"GET /x?access_token={REDACTED}&y=2", f"GET /x?access_token={REDACTED}&y=2"),
        (f"{{'password': '{REDACTED}'}}", f"{{'password': '{REDACTED}'}}"),
    ],
    ids=lambda value: value if isinstance(value, str) and REDACTED not in value else "",
)
def test_redact_replaces_credentials_and_leaves_the_rest(line: str, want: str) -> None:
    assert redact(line) == want


def test_the_settings_choose_the_format_from_the_environment() -> None:
    assert (
        logging_config(fmt="json", level="INFO", access_level="INFO")["handlers"]["console"]["formatter"]
        == "json"
    )
    assert (
        logging_config(fmt="JSON ", level="INFO", access_level="INFO")["handlers"]["console"]["formatter"]
        == "json"
    )
    assert (
        logging_config(fmt="plain", level="INFO", access_level="INFO")["handlers"]["console"]["formatter"]
        == "plain"
    )
    unset = logging_config(fmt="", level="INFO", access_level="INFO")
    assert unset["handlers"]["console"]["formatter"] == "json"  # JSON unless plain is asked for
    from django.conf import settings

    assert settings.LOGGING["handlers"]["console"]["filters"] == ["request", "redact"]
    assert settings.MIDDLEWARE[0] == "apps.metrics.middleware.RequestIdMiddleware"


def test_a_requests_tenant_and_node_are_on_its_lines_and_not_on_the_next_requests(
    captured: Captured,
    fleet: Any,  # noqa: F811
    client: Client,
) -> None:
    from apps.tenants.services import token_create

    _, api_token = token_create(user=fleet.alice, tenant=fleet.tenant_a, name="logs")
    # 1. A tenant's token on a task that does not exist, a node's credential with a bad generation, and
    #    then a request with no credential at all, served after them.
    tenant = {"Authorization": f"Bearer {api_token}", "X-Request-ID": "req-tenant"}
    assert client.get("/api/v1/tasks/999999/", headers=tenant).status_code == 404
    node = {"Authorization": f"Bearer {fleet.token_a}", "X-Request-ID": "req-node"}
    agent = client.get("/api/v1/agent/desired-state/?generation=x", headers=node)
    assert agent.status_code == 400, agent.content
    logging.getLogger("apps.fleet.services").info("after them")
    assert client.get("/api/v1/tasks/", headers={"X-Request-ID": "req-anonymous"}).status_code == 401
    logging.getLogger("apps.fleet.services").info("between requests")
    # 2. Django's line about each request names who sent it; the anonymous one and the one between none.
    if isinstance(captured.handler.formatter, PlainFormatter):
        text = captured.text()
        assert "request_id=req-tenant tenant=vision]" in text and "request_id=req-node node=gpu-001]" in text
        assert "tenant=vision" not in text.split("req-node")[1] and text.rstrip().endswith("between requests")
        assert "after them\n" in text  # no bracket of fields: the request it followed is over
        return
    lines = {line.get("request_id", "none"): line for line in captured.json_lines()}
    assert (lines["req-tenant"]["tenant"], lines["req-tenant"]["message"]) == (
        "vision",
        "Not Found: /api/v1/tasks/999999/",
    )
    assert lines["req-node"]["node"] == "gpu-001" and "tenant" not in lines["req-node"]
    assert "tenant" not in lines["req-anonymous"] and "node" not in lines["req-anonymous"]
    outside = [line for line in captured.json_lines() if line["logger"] == "apps.fleet.services"]
    assert [(line["message"], {"request_id", "tenant", "node"} & line.keys()) for line in outside] == [
        ("after them", set()),
        ("between requests", set()),
    ]


def test_a_heartbeats_node_is_on_its_lines_through_the_front_and_through_the_view(
    captured: Captured,
    fleet: Any,  # noqa: F811
    client: Client,
) -> None:
    """The heartbeat authenticates in front of DRF: it names its node for the log lines itself, in the
    WSGI environ gunicorn's access line reads and on the plane's lines about the request."""
    node = {"Authorization": f"Bearer {fleet.token_a}"}
    # 1. Django's view (the embedded default): a body that is not JSON, refused after the credential.
    view = client.post(p.HEARTBEAT_PATH, data="x", content_type="text/plain",
                       headers={**node, "X-Request-ID": "req-hb-view"})  # fmt: skip
    assert view.status_code == 415
    # 2. The front gunicorn calls: the same refusal, and the environ the access line is written from.
    base = {
        "REQUEST_METHOD": "POST", "PATH_INFO": p.HEARTBEAT_PATH, "SERVER_NAME": "testserver",
        "SERVER_PORT": "80", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(b"x"), "CONTENT_LENGTH": "1",
        "CONTENT_TYPE": "text/plain", "HTTP_AUTHORIZATION": node["Authorization"],
    }  # fmt: skip
    environ = dict(base, HTTP_X_REQUEST_ID="req-hb-front")
    statuses: list[str] = []
    b"".join(application(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses == ["415 Unsupported Media Type"]
    assert environ[ENVIRON_FIELDS_KEY] == {"node": "gpu-001"}
    # 3. A credential nobody holds names no node.
    unknown = dict(base, HTTP_AUTHORIZATION="Bearer wgn_" + "x" * 40, HTTP_X_REQUEST_ID="req-hb-unknown")
    unknown["wsgi.input"] = io.BytesIO(b"x")
    b"".join(application(unknown, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses[-1].startswith("401") and ENVIRON_FIELDS_KEY not in unknown
    if isinstance(captured.handler.formatter, PlainFormatter):
        text = captured.text()
        assert "request_id=req-hb-view node=gpu-001]" in text
        assert "request_id=req-hb-front node=gpu-001]" in text
        assert "request_id=req-hb-unknown]" in text
        return
    lines = {line.get("request_id"): line for line in captured.json_lines()}
    assert lines["req-hb-view"]["node"] == lines["req-hb-front"]["node"] == "gpu-001"
    assert "node" not in lines["req-hb-unknown"]
