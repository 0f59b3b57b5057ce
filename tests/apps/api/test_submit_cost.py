"""What one submission costs the database, pinned: a change that adds a query per submission (or per
task of a bulk submission) fails here rather than in production's throughput.

One task from a token used in the last WHALEGEN_AUTH_CACHE_S seconds (a pipeline's normal case): the
queue, the quota with whether some node of the pool could take the task (one read), the task INSERT and
its event INSERT = 4 (the test client's transaction adds a savepoint pair). A token this process does not
remember adds its lookup, the caller's memberships and the tenant tree = 7.
A bulk of any size: its queues (1), each pool's quota and node sizes (2), one INSERT for the tasks and
one for the events = 5 (8 with the token looked up), plus the savepoint pair around the task INSERT.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.tenants.callers import callers
from apps.workloads.models import Task, TaskEvent

TASK = {"queue": "train", "command": ["python", "train.py"], "gpu_milli": 10}


@pytest.fixture
def pipeline(world: Any) -> Any:
    from rest_framework.test import APIClient

    from apps.tenants.services import token_create

    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.post("/api/v1/tasks/", json.dumps(TASK), content_type="application/json")  # token's first use
    return client


def _queries(client: Any, path: str, body: Any) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.post(path, json.dumps(body), content_type="application/json")
    sql = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    return response, sql


@pytest.mark.parametrize(
    ("remembered", "queries"), [(True, 4), (False, 7)], ids=["token remembered", "token looked up"]
)
def test_one_submission_costs_four_queries_or_seven_with_the_token_lookup(
    world, pipeline, remembered, queries
) -> None:
    if not remembered:
        callers.clear()
    response, sql = _queries(pipeline, "/api/v1/tasks/", TASK)
    assert response.status_code == 201
    assert len(sql) == queries, "\n".join(q[:120] for q in sql)
    assert response.json()["forecast"] is None


@pytest.mark.parametrize(
    ("remembered", "queries"), [(True, 5), (False, 8)], ids=["token remembered", "token looked up"]
)
@pytest.mark.parametrize("size", [2, 50])
def test_a_bulk_submission_costs_five_queries_whatever_its_size(
    world, pipeline, size, remembered, queries
) -> None:
    if not remembered:
        callers.clear()
    response, sql = _queries(pipeline, "/api/v1/tasks/bulk/", {"tasks": [TASK] * size})
    assert response.status_code == 201 and len(response.json()) == size
    assert len(sql) == queries, "\n".join(q[:120] for q in sql)
    assert Task.objects.filter(pk__in=[t["id"] for t in response.json()], state="pending").count() == size
    ids = [t["id"] for t in response.json()]
    assert TaskEvent.objects.filter(task_id__in=ids, from_state="", to_state="pending").count() == size


def test_a_bulk_retry_with_its_keys_returns_the_same_tasks(world, pipeline) -> None:
    body = {"tasks": [{**TASK, "idempotency_key": f"ci-{n}"} for n in range(3)]}
    first = pipeline.post("/api/v1/tasks/bulk/", json.dumps(body), content_type="application/json")
    tasks = Task.objects.count()
    again = pipeline.post("/api/v1/tasks/bulk/", json.dumps(body), content_type="application/json")
    assert (first.status_code, again.status_code) == (201, 201)
    assert [t["id"] for t in first.json()] == [t["id"] for t in again.json()]
    assert Task.objects.count() == tasks


def test_a_key_repeated_within_a_batch_is_one_task(world, pipeline) -> None:
    body = {"tasks": [{**TASK, "idempotency_key": "same"}] * 2}
    response = pipeline.post("/api/v1/tasks/bulk/", json.dumps(body), content_type="application/json")
    assert response.status_code == 201
    assert response.json()[0]["id"] == response.json()[1]["id"]
    assert Task.objects.filter(idempotency_key="same").count() == 1
    other = {
        "tasks": [{**TASK, "idempotency_key": "twice"}, {**TASK, "idempotency_key": "twice", "name": "b"}]
    }
    refused = pipeline.post("/api/v1/tasks/bulk/", json.dumps(other), content_type="application/json")
    assert refused.status_code == 409 and not Task.objects.filter(idempotency_key="twice").exists()
