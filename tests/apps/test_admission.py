"""Admission semantics (docs/scheduling.md, "Admission"): a valid request the pool could run is accepted
and waits, holding no quota, whatever the tenant holds now; only a request that could never run there is
refused, in one sentence, with `code: cannot_run_here`; a cycle charges the quota when it admits a task.

The world: pool h100-train has one node (gpu-001: 2 H100s, 96 cores, 1 TiB); tenant vision (A) may hold
6 GPUs there (4 guaranteed + 2 borrowable); tenant speech (B) 2. Each tenant has one pending 1-GPU task.
"""

from __future__ import annotations

import pytest

from apps.scheduling.services import cycle_run
from apps.workloads.models import Task, TaskEvent
from apps.workloads.services import queue_create, quota_set
from tests.apps.factories import held_milli

TASK = {"tenant": "vision", "queue": "train", "command": ["python", "train.py"]}


def _submit(api, user, **fields):
    return api(user).post("/api/v1/tasks/", {**TASK, **fields}, format="json")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        (
            {"gpu_count": 7},
            "gpu_count",
            "the task asks 7 GPUs; tenant 'vision' may hold at most 6 GPUs in pool 'h100-train' "
            "(4 GPUs guaranteed + 2 GPUs borrowable), so it could never be admitted",
        ),
        (
            {"gpu_count": 4},
            "gpu_count",
            "no node of pool 'h100-train' (1 nodes) could ever take this task: it asks 4 GPUs (the largest "
            "node has 2); a gang of 2 tasks with 2 GPUs each would fit (gang_id, gang_size: 2)",
        ),
        ({"gpu_count": 3}, "gpu_count", "a gang of 3 tasks with 1 GPU each would fit"),
        (
            {"gpu_count": 2, "allowed_gpu_models": ["H100-80GB"], "cpu_milli": 200_000},
            "cpu_milli",
            "it asks 200 CPU cores (the largest node has 96)",
        ),
        (
            {"host_mem_mib": 2_000_000},
            "host_mem_mib",
            "2000000 MiB host memory (the largest node has 1048576)",
        ),
        ({"isolation": "mig", "allowed_gpu_models": ["L4"]}, "allowed_gpu_models", "has none of L4"),
        (
            {"queue": "infer", "isolation": "mig", "gpu_milli": 250},
            "isolation",
            "pool 'l4-infer' has no MIG-capable GPU",
        ),
    ],
    ids=[
        "above-limit",
        "larger-than-any-node",
        "gang-hint-uneven",
        "cpu",
        "host-memory",
        "model",
        "isolation",
    ],
)
def test_a_request_that_could_never_run_is_refused_in_one_sentence(world, api, fields, field, words) -> None:
    before = (Task.objects.count(), TaskEvent.objects.count())
    response = _submit(api, world.alice, **fields)
    body = response.json()
    assert response.status_code == 400, body
    assert body["code"] == "cannot_run_here"
    assert words in " ".join(body[field]), body
    assert (Task.objects.count(), TaskEvent.objects.count()) == before  # nothing stored


def test_a_tenant_without_quota_in_the_pool_is_refused_as_never_running(world, api) -> None:
    queue_create(tenant=world.tenant_b, pool=world.l4, name="infer")  # a queue, but no quota in l4
    response = api(world.bob).post(
        "/api/v1/tasks/", {"tenant": "speech", "queue": "infer", "command": ["true"]}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "cannot_run_here"
    assert "tenant 'speech' has no quota in pool 'l4-infer'" in response.json()["queue"][0]


def test_a_gpu_memory_bound_refuses_only_a_task_above_it(world, api) -> None:
    quota_set(tenant=world.tenant_a, pool=world.h100, guaranteed_milli=4000, borrow_limit_milli=2000,
              gpu_mem_limit_mib=100_000)  # fmt: skip
    unstated = _submit(api, world.alice)
    assert unstated.status_code == 400 and "code" not in unstated.json()  # fix the file: state it
    assert "state gpu_mem_mib" in unstated.json()["gpu_mem_mib"][0]
    above = _submit(api, world.alice, gpu_count=2, gpu_mem_mib=60_000)
    assert above.status_code == 400 and above.json()["code"] == "cannot_run_here"
    assert "asks 120000 MiB of GPU memory in all" in above.json()["gpu_mem_mib"][0]
    assert _submit(api, world.alice, gpu_mem_mib=60_000).status_code == 201


def test_a_gang_above_the_limit_in_all_is_refused_at_the_member_that_passes_it(world, api) -> None:
    member = {"queue": "train", "command": ["true"], "gpu_count": 2, "gang_id": "big", "gang_size": 4}
    response = api(world.alice).post(
        "/api/v1/tasks/bulk/", {"tenant": "vision", "tasks": [member] * 4}, format="json"
    )
    body = response.json()
    assert response.status_code == 400 and body["code"] == "cannot_run_here"
    assert (
        "gang 'big' asks 8 GPUs; tenant 'vision' may hold at most 6 GPUs" in body["tasks"][3]["gpu_count"][0]
    )
    assert body["tasks"][:3] == [{}, {}, {}]
    assert not Task.objects.filter(gang_id="big").exists()


def test_a_valid_request_of_a_busy_team_is_accepted_waits_for_quota_and_runs_in_turn(world, api) -> None:
    # Vision may hold 1 GPU; its pending task takes it at the first cycle.
    quota_set(tenant=world.tenant_a, pool=world.h100, guaranteed_milli=1000)
    cycle_run(pool_id=world.h100.pk)
    world.task_a.refresh_from_db()
    assert world.task_a.state == "assigned"
    assert held_milli(world.quota_a) == 1000

    response = _submit(api, world.alice, gpu_count=1)  # the quota is full: yesterday a 400, now a wait
    assert response.status_code == 201, response.json()
    waiting = Task.objects.get(pk=response.json()["id"])
    assert held_milli(world.quota_a) == 1000  # pending: it holds nothing

    cycle_run(pool_id=world.h100.pk)
    shown = api(world.alice).get(f"/api/v1/tasks/{waiting.pk}/").json()
    assert shown["state"] == "pending" and shown["why_pending_code"] == "quota_exceeded"
    assert shown["why_pending"].startswith(
        "quota: tenant vision holds 1 GPU in this pool, its limit is 1 GPU (1 GPU guaranteed + 0 GPUs "
        "borrowable), and this task asks 1 GPU; it fits once 1 GPU of the tenant's work ends"
    )
    quota = api(world.alice).get(f"/api/v1/quotas/{world.quota_a.pk}/").json()
    assert (quota["held_milli"], quota["waiting_milli"], quota["tasks_admitted"]) == (1000, 1000, 1)

    # The admitted task ends: its quota comes back and the waiting one is admitted by the next cycle.
    api(world.alice).post(f"/api/v1/tasks/{world.task_a.pk}/cancel/", {}, format="json")
    assert held_milli(world.quota_a) == 0
    cycle_run(pool_id=world.h100.pk)
    waiting.refresh_from_db()
    assert waiting.state == "assigned"
    assert held_milli(world.quota_a) == 1000


def test_a_priority_override_shows_why_its_task_waits_in_the_tasks_words(world, api) -> None:
    quota_set(tenant=world.tenant_a, pool=world.h100, guaranteed_milli=1000)
    cycle_run(pool_id=world.h100.pk)  # task_a takes vision's one GPU
    second = _submit(api, world.alice).json()["id"]
    cycle_run(pool_id=world.h100.pk)
    requested = api(world.alice).post(
        "/api/v1/overrides/", {"task": second, "wanted_priority": 50, "reason": "release"}, format="json"
    )
    assert requested.status_code == 201, requested.json()
    approved = api(world.root).post(f"/api/v1/overrides/{requested.json()['id']}/approve/", {}, format="json")
    assert approved.status_code == 200, approved.json()
    waits = approved.json()["task_waits"]
    assert waits["code"] == "quota_exceeded"
    assert waits["why"] == api(world.alice).get(f"/api/v1/tasks/{second}/").json()["why_pending"]
    assert waits["why"].startswith("quota: tenant vision holds 1 GPU in this pool")


@pytest.mark.parametrize(
    ("count", "largest", "hint"),
    [
        (9, 8, "a gang of 3 tasks with 3 GPUs each would fit (gang_id, gang_size: 3)"),
        (16, 8, "a gang of 2 tasks with 8 GPUs each would fit (gang_id, gang_size: 2)"),
        (11, 8, "a gang of 2 tasks with up to 8 GPUs each, 11 in all would fit (gang_id, gang_size: 2)"),
        (8, 8, ""),
    ],
)
def test_the_gang_hint_splits_into_equal_members_where_it_can(count: int, largest: int, hint: str) -> None:
    from apps.workloads.services import _gang_hint

    assert _gang_hint(Task(gpu_count=count), largest).removeprefix("; ") == hint
