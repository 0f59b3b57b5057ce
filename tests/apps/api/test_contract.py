"""The API's contract with bad input (issue #12): every input that used to be a 500 is a 4xx in the one
JSON error shape, naming what was wrong, and leaves nothing behind; every answer under /api/ is JSON."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest

from apps.workloads.models import Task, TaskEvent
from whalegen import protocol as p

GOOD = {"tenant": "vision", "queue": "train", "command": ["python", "train.py"]}


def _post(client: Any, path: str, body: Any, **extra: Any) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json", **extra)


def _is_error_shape(response: Any) -> None:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("detail"), str) and body["detail"], body


def _stored(world: Any) -> tuple[int, int]:
    return Task.objects.count(), TaskEvent.objects.count()


# 1-8: the issue's server errors, each now a 400 naming the field (or the place) at fault.
SUBMIT_500S = [
    ("priority above int32", {"priority": 2**31}, "priority"),
    ("priority below int32", {"priority": -(2**31) - 1}, "priority"),
    ("priority of 10^30", {"priority": 10**30}, "priority"),
    ("gpu_mem_mib of 2^31", {"gpu_mem_mib": 2**31}, "gpu_mem_mib"),
    ("cpu_milli of 2^31", {"cpu_milli": 2**31}, "cpu_milli"),
    ("max_runtime_s of 2^31", {"max_runtime_s": 2**31}, "max_runtime_s"),
    ("host_mem_mib of 2^63", {"host_mem_mib": 2**63}, "host_mem_mib"),
    ("NUL in an env value", {"env": {"A": "x\u0000y"}}, "env.A"),
    ("NUL in an env key", {"env": {"A\u0000": "x"}}, "env"),
    ("a lone surrogate in an env value", {"env": {"A": "\ud800"}}, "env.A"),
    ("a lone surrogate in the name", {"name": "\udfff"}, "name"),
]


@pytest.mark.parametrize(("fields", "where"), [c[1:] for c in SUBMIT_500S], ids=[c[0] for c in SUBMIT_500S])
@pytest.mark.parametrize("bulk", [False, True], ids=["single", "bulk"])
def test_input_that_was_a_server_error_is_a_400_naming_the_field(world, api, fields, where, bulk) -> None:
    before = _stored(world)
    if bulk:
        task = {k: v for k, v in {**GOOD, **fields}.items() if k != "tenant"}
        response = _post(api(world.alice), "/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [task]})
    else:
        response = _post(api(world.alice), "/api/v1/tasks/", {**GOOD, **fields})
    assert response.status_code == 400, response.content[:300]
    _is_error_shape(response)
    assert where.split(".")[0] in json.dumps(response.json()), response.json()
    assert _stored(world) == before


QUOTA_500S = [
    ("guaranteed_milli of 2^31", {"guaranteed_milli": 2**31}, "guaranteed_milli"),
    (
        "borrow_limit_milli of 2^31",
        {"guaranteed_milli": 1, "borrow_limit_milli": 2**31},
        "borrow_limit_milli",
    ),
    ("gpu_mem_limit_mib of 2^63", {"guaranteed_milli": 1, "gpu_mem_limit_mib": 2**63}, "gpu_mem_limit_mib"),
]


@pytest.mark.parametrize(("fields", "field"), [c[1:] for c in QUOTA_500S], ids=[c[0] for c in QUOTA_500S])
def test_quota_numbers_beyond_their_columns_are_a_400(world, api, fields, field) -> None:
    client = api(world.root)
    created = _post(client, "/api/v1/quotas/", {"tenant": "speech", "pool": "l4-infer", **fields})
    updated = client.patch(
        f"/api/v1/quotas/{world.quota_a.pk}/", json.dumps(fields), content_type="application/json"
    )
    for response in (created, updated):
        assert response.status_code == 400
        _is_error_shape(response)
        assert field in response.json()
    world.quota_a.refresh_from_db()
    assert world.quota_a.guaranteed_milli == 4000


LIST_PATHS = [
    "/api/v1/tasks/", "/api/v1/queues/", "/api/v1/quotas/", "/api/v1/pools/", "/api/v1/clusters/",
    "/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/overrides/", "/api/v1/tenants/", "/api/v1/forecast-models/",
    "/api/v1/profiles/",
]  # fmt: skip


@pytest.mark.parametrize("path", LIST_PATHS)
@pytest.mark.parametrize(
    "query",
    [
        {"limit": "99999999999999999999"},
        {"offset": "99999999999999999999"},
        {"limit": "abc"},
        {"limit": "-1"},
    ],
    ids=["a limit beyond bigint", "an offset beyond bigint", "a limit that is no number", "a negative limit"],
)
def test_a_page_parameter_out_of_range_is_a_400_on_every_list(world, api, path, query) -> None:
    response = api(world.alice).get(path, query)
    assert response.status_code == 400
    _is_error_shape(response)
    assert next(iter(query)) in response.json()


def test_a_big_limit_is_cut_to_the_largest_page(world, api) -> None:
    response = api(world.alice).get("/api/v1/tasks/", {"limit": "5000"})
    assert response.status_code == 200 and response.json()["count"] == 1


@pytest.mark.parametrize(
    "stamp",
    ["0001-01-01T00:00:00+01:00", "9999-12-31T23:00:00-02:00", "2026-01-01T00:00:00+24:00", "yesterday"],
    ids=["before year 1 in UTC", "after year 9999 in UTC", "an offset of 24 hours", "no timestamp"],
)
def test_a_timestamp_filter_that_is_no_instant_is_a_400(world, api, stamp) -> None:
    response = api(world.alice).get("/api/v1/tasks/", {"created_after": stamp})
    assert response.status_code == 400
    _is_error_shape(response)
    assert "created_after" in response.json()


@pytest.mark.parametrize("offset", ["+16:00", "-16:00", "+23:59"])
def test_a_timestamp_with_an_offset_postgresql_refuses_is_compared_as_the_instant_it_names(
    world, api, offset
) -> None:
    """Python (and ISO 8601) take offsets up to ±23:59, PostgreSQL only ±15:59: the filter converts
    to UTC, so the instant is compared, not refused (it was a 500)."""
    created = world.task_a.created_at
    hours, minutes = int(offset[1:3]), int(offset[4:6])
    sign = 1 if offset[0] == "+" else -1
    local = created + sign * timedelta(hours=hours, minutes=minutes)
    stamp = local.replace(tzinfo=None).isoformat(timespec="microseconds") + offset
    client = api(world.alice)
    at_or_after = client.get("/api/v1/tasks/", {"created_after": stamp})
    before = client.get("/api/v1/tasks/", {"created_before": stamp})
    assert (at_or_after.status_code, before.status_code) == (200, 200)
    assert [t["id"] for t in at_or_after.json()["results"]] == [world.task_a.pk]
    assert before.json()["count"] == 0


def test_an_idempotency_key_longer_than_its_column_is_a_400(world, api) -> None:
    before = _stored(world)
    response = _post(api(world.alice), "/api/v1/tasks/", GOOD, HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert response.status_code == 400
    assert "200 characters" in response.json()["Idempotency-Key"][0]
    assert _stored(world) == before


@pytest.mark.parametrize("length", [201, 400, 5000])
def test_a_cancel_reason_too_long_is_a_400_and_the_task_stays_pending(world, api, length) -> None:
    response = _post(api(world.alice), f"/api/v1/tasks/{world.task_a.pk}/cancel/", {"reason": "r" * length})
    assert response.status_code == 400 and "reason" in response.json()
    world.task_a.refresh_from_db()
    assert world.task_a.state == Task.State.PENDING


def test_the_longest_cancel_reason_allowed_is_stored(world, api) -> None:
    response = _post(api(world.alice), f"/api/v1/tasks/{world.task_a.pk}/cancel/", {"reason": "r" * 200})
    assert response.status_code == 200 and response.json()["state"] == "cancelled"


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_json_is_a_400(world, api, depth) -> None:
    body = "[" * depth + "]" * depth
    response = api(world.alice).post("/api/v1/tasks/", body, content_type="application/json")
    assert response.status_code == 400
    _is_error_shape(response)


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"protocol_version": "abc"}, "protocol_version"),
        ({"protocol_version": ""}, "protocol_version"),
        ({"protocol_version": "1x.0"}, "protocol_version"),
    ],
    ids=["a word", "empty", "a non-numeric major"],
)
def test_agent_register_with_a_non_numeric_protocol_version_is_a_400(world, api, message, words) -> None:
    from apps.fleet.nodes import node_token_issue

    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {node_token_issue(node=world.node)}")
    body = {"node_name": "gpu-001", "hostname": "h", "agent_version": "0.1", **message}
    response = _post(client, p.REGISTER_PATH, body)
    assert response.status_code == 400 and words in response.json()["detail"]


@pytest.mark.parametrize("seq", [2**63, 10**30, -1], ids=["2^63", "10^30", "negative"])
def test_an_agent_report_seq_beyond_its_column_is_a_400(world, api, seq) -> None:
    from apps.fleet.models import AgentReport
    from apps.fleet.nodes import node_token_issue

    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {node_token_issue(node=world.node)}")
    body = p.Report(
        node_id=str(world.node.pk), seq=1, sent_at_s=time.time(), tasks=(), partitions=()
    ).to_dict()
    response = _post(client, p.REPORT_PATH, {**body, "seq": seq})
    assert response.status_code == 400 and "seq" in response.json()["detail"]
    assert not AgentReport.objects.exists()


# ---- the contract: JSON everywhere, one shape ----------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tasks/abc/",
        "/api/v1/tasks/-1/",
        "/api/v1/queues/1.5/",
        "/api/v1/nope/",
        "/api/v1/tasks/999999/",
    ],
    ids=["a non-numeric id", "a negative id", "a fractional id", "no such resource", "no such task"],
)
def test_not_found_is_json(world, api, path) -> None:
    response = api(world.alice).get(path)
    assert response.status_code == 404
    _is_error_shape(response)


def test_an_oversized_body_is_a_json_413_and_stores_nothing(world, api) -> None:
    before = _stored(world)
    big = {**GOOD, "env": {"BLOB": "x" * 3_000_000}}
    response = _post(api(world.alice), "/api/v1/tasks/", big)
    assert response.status_code == 413
    _is_error_shape(response)
    assert _stored(world) == before


def test_a_method_not_allowed_is_a_json_405(world, api) -> None:
    response = api(world.alice).put("/api/v1/tasks/", "{}", content_type="application/json")
    assert response.status_code == 405
    _is_error_shape(response)


def test_a_form_encoded_submission_is_a_415_and_creates_nothing(world, api) -> None:
    before = _stored(world)
    response = api(world.alice).post("/api/v1/tasks/", {"tenant": "vision", "queue": "train"})  # multipart
    form = api(world.alice).post(
        "/api/v1/tasks/", "tenant=vision&queue=train", content_type="application/x-www-form-urlencoded"
    )
    for refused in (response, form):
        assert refused.status_code == 415
        _is_error_shape(refused)
    assert _stored(world) == before


def test_an_html_accept_header_still_gets_json(world, api) -> None:
    response = api(world.alice).get("/api/v1/tasks/", HTTP_ACCEPT="text/html")
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/tasks/", {**GOOD, "gpu_cont": 2}),
        ("/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [GOOD]}),  # `tenant` belongs to the batch
        ("/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [], "gang": "x"}),
        ("/api/v1/queues/", {"pool": "h100-train", "name": "q", "colour": "red"}),
        ("/api/v1/overrides/", {"task": 1, "wanted_priority": 1, "reason": "r", "urgent": True}),
    ],
    ids=[
        "a misspelt task field",
        "a tenant per bulk task",
        "an unknown bulk field",
        "a queue",
        "an override",
    ],
)
def test_an_unknown_field_is_refused_by_name(world, api, path, body) -> None:
    before = _stored(world)
    response = _post(api(world.ada if "queues" in path else world.alice), path, body)
    assert response.status_code == 400
    _is_error_shape(response)
    unknown = set(body) - set(GOOD) - {"tenant", "tasks", "pool", "name", "task", "wanted_priority", "reason"}
    text = json.dumps(response.json())
    assert all(name in text for name in unknown) and "unknown field" in text
    assert _stored(world) == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": [1, 2]}, "command"),
        ({"env": {"A": 1}}, "env"),
        ({"name": 123}, "name"),
        ({"gpu_count": "2"}, "gpu_count"),
        ({"gpu_count": 2.0}, "gpu_count"),
        ({"preemptible": "yes"}, "preemptible"),
        ({"preemptible": 1}, "preemptible"),
        ({"queue": 7}, "queue"),
        ({"kind": 1}, "kind"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_values_of_the_wrong_json_type_are_not_coerced(world, api, fields, field) -> None:
    before = _stored(world)
    response = _post(api(world.alice), "/api/v1/tasks/", {**GOOD, **fields})
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert _stored(world) == before


@pytest.mark.parametrize(
    "fields",
    [{"command": []}, {"command": [""]}, {"command": None}, {}],
    ids=["an empty argv", "a blank executable", "null", "no command at all"],
)
def test_a_task_without_a_command_is_refused_at_submission(world, api, fields) -> None:
    before = _stored(world)
    body = {k: v for k, v in {**GOOD, **fields}.items() if not (k == "command" and "command" not in fields)}
    response = _post(api(world.alice), "/api/v1/tasks/", body)
    assert response.status_code == 400
    assert "command" in response.json()
    assert _stored(world) == before


def test_bulk_errors_line_up_with_the_list_in_one_shape(world, api) -> None:
    """A field error (task 1) and a service refusal (task 2, above the quota's limit) read alike: a list
    as long as the submitted one, `{}` for the tasks that were fine."""
    good = {k: v for k, v in GOOD.items() if k != "tenant"}
    field_error = _post(
        api(world.alice),
        "/api/v1/tasks/bulk/",
        {"tenant": "vision", "tasks": [good, {**good, "gpu_milli": 0}, good]},
    )
    service_error = _post(
        api(world.alice),
        "/api/v1/tasks/bulk/",
        {"tenant": "vision", "tasks": [good, good, {**good, "gpu_count": 64}]},
    )
    assert service_error.json()["code"] == "cannot_run_here"
    for response, index, field in ((field_error, 1, "gpu_milli"), (service_error, 2, "gpu_count")):
        assert response.status_code == 400
        _is_error_shape(response)
        items = response.json()["tasks"]
        assert isinstance(items, list) and len(items) == 3
        assert [bool(item) for item in items] == [i == index for i in range(3)]
        assert isinstance(items[index][field], list)


def test_gpus_show_other_tenants_tasks_only_as_in_use(world, api) -> None:
    from apps.inventory.models import ComputeUnit
    from tests.apps.factories import hold

    unit_a, unit_b = ComputeUnit.objects.filter(gpu__node=world.node).order_by("pk")[:2]
    hold(world.task_a, [unit_a])
    hold(world.task_b, [unit_b])

    def units(user: Any) -> dict[int, dict[str, Any]]:
        listed = api(user).get("/api/v1/gpus/").json()["results"]
        detail = [api(user).get(f"/api/v1/gpus/{gpu['id']}/").json() for gpu in listed]
        shown = {u["id"]: u for gpu in listed for u in gpu["units"]}
        assert shown == {u["id"]: u for gpu in detail for u in gpu["units"]}
        return shown

    alice, bob, root = units(world.alice), units(world.bob), units(world.root)
    assert (
        alice[unit_a.pk]["task"] == world.task_a.pk and alice[unit_b.pk] | {"task": None} == alice[unit_b.pk]
    )
    assert bob[unit_a.pk]["task"] is None and bob[unit_b.pk]["task"] == world.task_b.pk
    assert all(u["in_use"] for u in (alice[unit_a.pk], alice[unit_b.pk], bob[unit_a.pk], bob[unit_b.pk]))
    assert root[unit_a.pk]["task"] == world.task_a.pk and root[unit_b.pk]["task"] == world.task_b.pk
    assert str(world.task_b.pk) not in json.dumps([alice[unit_b.pk]])


def test_the_api_root_answers_with_an_index_whose_links_work(world, api) -> None:
    client = api(world.alice)
    index = client.get("/api/v1/")
    assert index.status_code == 200
    resources = index.json()["resources"]
    assert {"tasks", "queues", "quotas", "gpus", "overrides"} <= set(resources)
    for resource in resources.values():
        assert client.get(resource["url"]).status_code == 200, resource


def test_swagger_ui_is_served_from_the_plane_without_a_cdn(world, client) -> None:
    from django.conf import settings
    from django.contrib.staticfiles import finders

    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html
    assets = [part.split('"')[0] for part in html.split('src="')[1:]]
    assets += [part.split('"')[0] for part in html.split('href="')[1:] if ".css" in part.split('"')[0]]
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets), assets
    for asset in assets:
        # Every asset is one of the plane's own static files (collectstatic ships it; the demo serves it).
        assert asset.startswith(settings.STATIC_URL), asset
        assert finders.find(asset.removeprefix(settings.STATIC_URL)) is not None, asset


def test_the_first_event_and_an_undecided_override_match_the_committed_schema(world, api) -> None:
    import yaml

    from tests.apps.test_schema_and_migrations import SCHEMA

    schemas = yaml.safe_load(SCHEMA.read_text())["components"]["schemas"]
    event = api(world.alice).get(f"/api/v1/tasks/{world.task_a.pk}/events/").json()["results"][0]
    assert event["from_state"] == ""
    from_state = schemas["TaskEventOutput"]["properties"]["from_state"]
    enums = [
        schemas[ref["$ref"].rsplit("/", 1)[1]] for ref in from_state.get("oneOf", from_state.get("allOf", []))
    ]
    assert any("" in enum.get("enum", []) for enum in [from_state, *enums])
    override = _post(
        api(world.alice), "/api/v1/overrides/", {"task": world.task_a.pk, "wanted_priority": 9, "reason": "r"}
    ).json()
    assert override["decided_by"] is None
    assert schemas["OverrideOutput"]["properties"]["decided_by"].get("nullable") is True


def test_a_refusal_that_can_never_run_matches_the_committed_error_schema(world, api) -> None:
    """The 400 for a request that could never run carries `code`; the committed schema must allow it,
    or a client generated from docs/openapi.yaml would reject the plane's own answer."""
    import jsonschema
    import yaml

    from tests.apps.test_schema_and_migrations import SCHEMA

    components = yaml.safe_load(SCHEMA.read_text())["components"]
    response = _post(api(world.alice), "/api/v1/tasks/", {**GOOD, "gpu_count": 64})
    assert response.status_code == 400
    assert response.json()["code"] == "cannot_run_here"
    schema = {"$ref": "#/components/schemas/ValidationError", "components": components}
    jsonschema.validate(response.json(), schema)
