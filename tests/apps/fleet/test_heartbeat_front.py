"""The heartbeat answered in front of Django (`whalegen.config.wsgi`, docs/fleet.md "Heartbeat load"):
the same answers as the Django view at the protocol's path, refusals included, and the node-credential
memory that spares the token lookup."""

from __future__ import annotations

import io
import json
import sys
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from whalegen import protocol as p

pytestmark = pytest.mark.django_db


def front(token: str | None, body: bytes, *, method: str = "POST", **environ: str) -> tuple[int, dict, Any]:
    """One request to the WSGI application as gunicorn hands it over: (status, JSON body, headers)."""
    from whalegen.config.wsgi import application

    env = {
        "REQUEST_METHOD": method, "PATH_INFO": p.HEARTBEAT_PATH, "SERVER_NAME": "testserver",
        "SERVER_PORT": "80", "HTTP_HOST": "testserver", "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
        "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
        **({"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}), **environ,
    }  # fmt: skip
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    data = b"".join(application(env, start_response))
    return seen["status"], json.loads(data), seen["headers"]


def beat(node: Any, **fields: Any) -> bytes:
    message = p.Heartbeat(node_id=str(node.pk), agent_version="0.1", sent_at_s=time.time(), **fields)
    return json.dumps(message.to_dict()).encode()


def test_the_front_answers_a_heartbeat_as_the_django_view_does(fleet: Any, agent_client: Any) -> None:
    status, body, headers = front(fleet.token_a, beat(fleet.node), HTTP_X_REQUEST_ID="req-7")
    assert status == 200
    assert headers["X-Request-ID"] == "req-7"
    fleet.node.refresh_from_db()
    assert fleet.node.last_heartbeat_at is not None
    assert timezone.now() - fleet.node.last_heartbeat_at < timedelta(seconds=30)
    via_django = agent_client(fleet.token_a).post(
        p.HEARTBEAT_PATH, json.loads(beat(fleet.node)), format="json"
    )
    assert via_django.status_code == 200
    assert via_django.json() == body == p.HeartbeatAck(generation=body["generation"]).to_dict()


@pytest.mark.parametrize(
    ("case", "status", "detail"),
    [
        ("no credential", 401, "Bearer"),
        ("unknown credential", 401, "unknown node token"),
        ("another node's id", 403, "belongs to node"),
        ("not JSON", 400, "JSON parse error"),
        ("not a heartbeat", 400, "node_id"),
        ("plain text", 415, "Unsupported media type"),
        ("another major version", 409, "major"),
        ("too large", 413, "larger than"),
    ],
)
def test_the_front_refuses_what_the_django_view_refuses(
    fleet: Any, agent_client: Any, settings: Any, case: str, status: int, detail: str
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    token, body, environ = fleet.token_a, beat(fleet.node), {}
    if case == "no credential":
        token = None
    elif case == "unknown credential":
        token = "wgn_not-a-node"
    elif case == "another node's id":
        token = fleet.token_b
    elif case == "not JSON":
        body = b"{not json"
    elif case == "not a heartbeat":
        body = b'{"agent_version": "0.1"}'
    elif case == "plain text":
        environ = {"CONTENT_TYPE": "text/plain"}
    elif case == "another major version":
        body = beat(fleet.node, protocol_version="2.0")
    elif case == "too large":
        body = b" " * 20_000
    answered, answer, headers = front(token, body, **environ)
    assert (answered, set(answer)) == (status, {"detail"})
    assert detail in answer["detail"]
    if status == 401:
        assert headers["WWW-Authenticate"] == 'Bearer realm="agent"'
    # The Django view at the same path gives the same status (what the front does not answer, Django does).
    client = agent_client(token)
    kind = environ.get("CONTENT_TYPE", "application/json")
    assert client.post(p.HEARTBEAT_PATH, body, content_type=kind).status_code == status


def test_other_methods_at_the_heartbeat_path_go_to_django(fleet: Any) -> None:
    status, body, headers = front(fleet.token_a, b"", method="GET")
    assert status == 405
    assert "GET" in body["detail"]
    assert "POST" in headers["Allow"]


def test_a_replaced_credential_stops_working_at_once_in_the_process_that_replaced_it(fleet: Any) -> None:
    from apps.fleet.nodes import node_token_issue

    assert front(fleet.token_a, beat(fleet.node))[0] == 200  # remembered now
    fresh = node_token_issue(node=fleet.node)
    assert front(fleet.token_a, beat(fleet.node))[0] == 401
    assert front(fresh, beat(fleet.node))[0] == 200


def test_the_credential_memory_spares_the_lookup_for_its_lifetime_only(
    fleet: Any, settings: Any, django_assert_num_queries: Any
) -> None:
    from apps.fleet.credentials import NodeCredentials

    settings.WHALEGEN_AUTH_CACHE_S = 5.0
    clock = [100.0]
    memory = NodeCredentials(clock=lambda: clock[0])
    with django_assert_num_queries(1):
        assert memory.node_for(fleet.token_a).pk == fleet.node.pk  # type: ignore[union-attr]
    with django_assert_num_queries(0):
        assert memory.node_for(fleet.token_a).name == fleet.node.name  # type: ignore[union-attr]
    clock[0] += 5.0
    with django_assert_num_queries(1):
        assert memory.node_for(fleet.token_a) is not None
    with django_assert_num_queries(2):  # an unknown credential is looked up every time
        assert memory.node_for("wgn_not-a-node") is None
        assert memory.node_for("wgn_not-a-node") is None
    settings.WHALEGEN_AUTH_CACHE_S = 0.0
    memory.clear()
    with django_assert_num_queries(2):  # 0 turns the memory off
        memory.node_for(fleet.token_a)
        memory.node_for(fleet.token_a)


def test_a_node_deleted_while_its_credential_is_remembered_is_refused(fleet: Any) -> None:
    from apps.inventory.models import Gpu, Node

    assert front(fleet.token_b, beat(fleet.node_b))[0] == 200
    Gpu.objects.filter(node=fleet.node_b).delete()
    Node.objects.filter(pk=fleet.node_b.pk).delete()
    status, body, _ = front(fleet.token_b, beat(fleet.node_b))
    assert (status, body["detail"]) == (401, "unknown node token")


def test_telemetry_is_stored_once_per_sample_period_even_for_heartbeats_of_the_same_instant(
    fleet: Any,
) -> None:
    from apps.fleet.heartbeat import agent_heartbeat
    from apps.fleet.models import GpuSample

    gpu = fleet.node.gpus.order_by("index").first()
    sample = p.TelemetrySample(gpu.uuid, 0.0, 1024, 81_920, 37, 12, 140.0, 350.0, 55, 1800, 9000, 0)
    inventory = p.GpuInventory(gpu.index, gpu.uuid, "H100", "H100", 81_920, "0000:01:00.0", False)

    def heartbeat(at: Any) -> None:
        message = p.Heartbeat(node_id=str(fleet.node.pk), agent_version="0.1", sent_at_s=at.timestamp(),
                              inventory=(inventory,), telemetry=(sample,))  # fmt: skip
        agent_heartbeat(node=fleet.node, message=message, now=at)

    now = timezone.now()
    heartbeat(now)
    heartbeat(now)  # a second heartbeat at the very same instant: not due again
    heartbeat(now + timedelta(seconds=10))
    assert GpuSample.objects.filter(gpu=gpu).count() == 1
    heartbeat(now + timedelta(seconds=31))
    assert list(GpuSample.objects.filter(gpu=gpu).order_by("at").values_list("mem_used_mib", flat=True)) == [
        1024,
        1024,
    ]
