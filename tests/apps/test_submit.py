"""Submitting tasks through the API: field-level messages for bad input, idempotent retries, bulk
all-or-nothing, quota limits, and nothing half-written on error."""

from __future__ import annotations

import pytest

from apps.workloads.models import Task, TaskEvent
from tests.apps.factories import held_milli


def _submit(api, user, **fields):
    body = {"tenant": "vision", "queue": "train", "command": ["python", "train.py"], **fields}
    return api(user).post("/api/v1/tasks/", body, format="json")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"allowed_gpu_models": ["H900"]}, "allowed_gpu_models", "unknown GPU model 'H900'"),
        ({"gpu_milli": 0}, "gpu_milli", "greater than or equal to 1"),
        ({"gpu_milli": 1001}, "gpu_milli", "less than or equal to 1000"),
        ({"gpu_count": 2, "gpu_milli": 500}, "gpu_milli", "is for one GPU; gpu_count is 2"),
        ({"gang_size": 0}, "gang_size", "greater than or equal to 1"),
        ({"gang_size": 4}, "gang_id", "needs a gang_id"),
        ({"cpu_milli": -1}, "cpu_milli", "greater than or equal to 0"),
        ({"host_mem_mib": -5}, "host_mem_mib", "greater than or equal to 0"),
        ({"gpu_mem_mib": -1}, "gpu_mem_mib", "greater than or equal to 1"),
        ({"queue": "nope"}, "queue", "no queue named 'nope'"),
        ({"isolation": "exclusive", "gpu_milli": 500}, "isolation", "exclusive isolation takes whole GPUs"),
        ({"isolation": "mps", "gpu_count": 2}, "isolation", "gpu_count must be 1"),
        ({"isolation": "teleport"}, "isolation", "is not a valid choice"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_a_bad_request_is_refused_with_a_message_on_its_field(world, api, fields, field, words) -> None:
    tasks_before, events_before = Task.objects.count(), TaskEvent.objects.count()
    response = _submit(api, world.alice, **fields)
    assert response.status_code == 400
    assert words in " ".join(response.json()[field]), response.json()
    assert "code" not in response.json()  # a mistake to fix, not a request the pool could never run
    # Nothing half-written: no task, no event.
    assert (Task.objects.count(), TaskEvent.objects.count()) == (tasks_before, events_before)


def test_a_good_request_is_stored_pending_holding_no_quota_and_explained(world, api) -> None:
    response = _submit(
        api,
        world.alice,
        gpu_milli=300,
        isolation="mig",
        allowed_gpu_models=["h100"],
        command=["python", "x.py"],
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "pending"
    assert body["allowed_gpu_models"] == ["H100-80GB"]  # aliases are stored canonical
    assert body["priority"] == 5  # the queue's default
    assert body["why_pending"]
    assert held_milli(world.quota_a) == 0  # pending: only admission charges the quota
    events = api(world.alice).get(f"/api/v1/tasks/{body['id']}/events/").json()["results"]
    assert [(e["from_state"], e["to_state"], e["actor"]) for e in events] == [("", "pending", "user:alice")]


def test_a_retry_with_the_same_idempotency_key_returns_the_same_task(world, api) -> None:
    client = api(world.alice)
    body = {"tenant": "vision", "queue": "train", "command": ["true"], "gpu_count": 2}
    first = client.post("/api/v1/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="ci-run-77")
    again = client.post("/api/v1/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="ci-run-77")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Task.objects.filter(idempotency_key="ci-run-77").count() == 1


def test_a_retry_may_spell_models_differently_and_leave_the_priority_to_the_queue(world, api) -> None:
    client = api(world.alice)
    first = client.post(
        "/api/v1/tasks/",
        {"tenant": "vision", "queue": "train", "command": ["true"], "allowed_gpu_models": ["H100-80GB"]},
        format="json",
        HTTP_IDEMPOTENCY_KEY="ci-run-78",
    )
    again = client.post(
        "/api/v1/tasks/",
        {"tenant": "vision", "queue": "train", "command": ["true"], "allowed_gpu_models": ["h100"]},
        format="json",
        HTTP_IDEMPOTENCY_KEY="ci-run-78",
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]


def test_the_same_idempotency_key_with_another_request_is_a_409_and_stores_nothing(world, api) -> None:
    client = api(world.alice)
    body = {"tenant": "vision", "queue": "train", "command": ["true"], "gpu_count": 2}
    first = client.post("/api/v1/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="ci-run-79")
    tasks = Task.objects.count()
    other = client.post(
        "/api/v1/tasks/",
        {**body, "gpu_count": 1, "name": "other"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="ci-run-79",
    )
    assert first.status_code == 201
    assert other.status_code == 409
    message = str(other.json())
    assert "ci-run-79" in message and f"task {first.json()['id']}" in message
    assert "name" in message and "gpu_count" in message
    assert Task.objects.count() == tasks


def test_idempotency_keys_belong_to_their_tenant(world, api) -> None:
    key = {"HTTP_IDEMPOTENCY_KEY": "shared"}
    a = api(world.alice).post(
        "/api/v1/tasks/", {"tenant": "vision", "queue": "train", "command": ["true"]}, format="json", **key
    )
    b = api(world.bob).post(
        "/api/v1/tasks/", {"tenant": "speech", "queue": "train", "command": ["true"]}, format="json", **key
    )
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


def test_bulk_submit_stores_all_or_nothing(world, api) -> None:
    client = api(world.alice)
    good = {"queue": "train", "command": ["true"], "gpu_milli": 100, "gang_id": "g1", "gang_size": 2}
    bad = {**good, "allowed_gpu_models": ["H900"]}
    before = Task.objects.count()
    refused = client.post("/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [good, bad]}, format="json")
    assert refused.status_code == 400
    errors = refused.json()["tasks"]
    assert errors[0] == {} and "unknown GPU model" in errors[1]["allowed_gpu_models"][0]
    assert Task.objects.count() == before
    accepted = client.post("/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [good, good]}, format="json")
    assert accepted.status_code == 201
    assert [t["gang_id"] for t in accepted.json()] == ["g1", "g1"]


def test_bulk_submit_above_what_the_quota_has_left_now_is_accepted_and_waits(world, api) -> None:
    # A's limit in h100 is 6 GPUs: eight whole-GPU tasks cannot all run at once, but each can in turn.
    one = {"queue": "train", "command": ["true"], "gpu_count": 1}
    response = api(world.alice).post(
        "/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [one] * 8}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert Task.objects.filter(tenant=world.tenant_a, state="pending").count() == 9
    assert held_milli(world.quota_a) == 0


def test_a_token_submits_into_its_own_tenant_without_naming_it(world, api) -> None:
    from rest_framework.test import APIClient

    from apps.tenants.services import token_create

    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = APIClient()
    response = client.post(
        "/api/v1/tasks/",
        {"queue": "train", "command": ["true"]},
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 201
    assert response.json()["tenant"] == "vision"


def test_cancelling_twice_is_a_conflict_with_a_clear_message(world, api) -> None:
    client = api(world.alice)
    assert client.post(f"/api/v1/tasks/{world.task_a.pk}/cancel/", {}, format="json").status_code == 200
    again = client.post(f"/api/v1/tasks/{world.task_a.pk}/cancel/", {}, format="json")
    assert again.status_code == 409
    assert "a cancelled task cannot become cancelled" in again.json()["detail"]


def test_task_lists_filter_by_state_and_queue(world, api) -> None:
    client = api(world.alice)
    _submit(api, world.alice, queue="infer")
    client.post(f"/api/v1/tasks/{world.task_a.pk}/cancel/", {}, format="json")
    pending = client.get("/api/v1/tasks/", {"state": "pending"}).json()
    assert [t["queue"] for t in pending["results"]] == ["infer"]
    in_train = client.get("/api/v1/tasks/", {"queue": "train", "command": ["true"]}).json()
    assert [t["id"] for t in in_train["results"]] == [world.task_a.pk]
    bad = client.get("/api/v1/tasks/", {"state": "sleeping"})
    assert bad.status_code == 400 and "state" in bad.json()


def test_lists_are_paginated(world, api) -> None:
    for _ in range(3):
        _submit(api, world.alice, gpu_milli=100)
    page = api(world.alice).get("/api/v1/tasks/", {"limit": 2}).json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]


def test_queue_crud_inside_a_tenant(world, api) -> None:
    client = api(world.ada)
    body = {"tenant": "vision", "pool": "h100-train", "name": "urgent", "default_priority": 20}
    created = client.post("/api/v1/queues/", body, format="json")
    assert created.status_code == 201
    queue_id = created.json()["id"]
    duplicate = client.post(
        "/api/v1/queues/", {"tenant": "vision", "pool": "l4-infer", "name": "urgent"}, format="json"
    )
    assert duplicate.status_code == 400 and "already has a queue" in duplicate.json()["name"][0]
    unknown_pool = client.post(
        "/api/v1/queues/", {"tenant": "vision", "pool": "tpu", "name": "x"}, format="json"
    )
    assert unknown_pool.status_code == 400 and "unknown pool" in unknown_pool.json()["pool"][0]
    assert client.patch(f"/api/v1/queues/{queue_id}/", {"weight": 4}, format="json").json()["weight"] == 4
    busy = client.delete(f"/api/v1/queues/{world.queue_a.pk}/")
    assert busy.status_code == 409 and "unfinished tasks" in busy.json()["detail"]
    assert client.delete(f"/api/v1/queues/{queue_id}/").status_code == 204


def test_quota_reads_show_usage_and_platform_admins_write_them(world, api) -> None:
    quota = api(world.alice).get(f"/api/v1/quotas/{world.quota_a.pk}/").json()
    assert (quota["held_milli"], quota["waiting_milli"], quota["tasks_pending"]) == (0, 1000, 1)
    assert quota["tasks_admitted"] == 0 and quota["limit_milli"] == 6000
    changed = api(world.root).patch(
        f"/api/v1/quotas/{world.quota_a.pk}/", {"borrow_limit_milli": 0}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["limit_milli"] == 4000
    unknown = api(world.root).post(
        "/api/v1/quotas/", {"tenant": "nobody", "pool": "h100-train", "guaranteed_milli": 1}, format="json"
    )
    assert unknown.status_code == 400 and "unknown tenant" in unknown.json()["tenant"][0]
