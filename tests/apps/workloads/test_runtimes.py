"""Runtimes and images at submission (issue 37): a container pool needs an image (the task's or its
queue's default), a plausible reference its operator allows; a process pool takes none. What a task got
is stored on it, so later changes to the queue or pool move no submitted task."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from apps.inventory.models import Pool
from apps.workloads.models import Task
from apps.workloads.services import TaskSubmission, image_reference_refusal, queue_update, task_submit

pytestmark = pytest.mark.django_db

IMAGE = "registry.example.org/ml/trainer:1.4"


@pytest.fixture
def containers(world: Any) -> Any:
    """The world's H100 pool turned into a container pool (tenant A's queue `train` goes into it)."""
    Pool.objects.filter(pk=world.h100.pk).update(runtime=Pool.Runtime.CONTAINER)
    world.h100.refresh_from_db()
    world.queue_a.refresh_from_db()
    return world


def _submit(world: Any, **fields: Any) -> Task:
    request = TaskSubmission(queue=fields.pop("queue", "train"), command=["python", "train.py"], **fields)
    task, _ = task_submit(tenant=world.tenant_a, request=request, submitted_by=world.alice)
    return task


def _refusal(world: Any, **fields: Any) -> str:
    before = Task.objects.count()
    with pytest.raises(ValidationError) as caught:
        _submit(world, **fields)
    assert Task.objects.count() == before  # nothing stored
    return " ".join(caught.value.message_dict["image"])


def test_a_task_in_a_container_pool_runs_its_own_image(containers: Any) -> None:
    task = _submit(containers, image=IMAGE)
    task.refresh_from_db()
    assert (task.runtime, task.image) == ("container", IMAGE)


def test_a_task_naming_no_image_gets_its_queues_default_and_keeps_it(containers: Any) -> None:
    queue_update(queue=containers.queue_a, data={"default_image": "ghcr.io/acme/base:2"})
    task = _submit(containers)
    queue_update(queue=containers.queue_a, data={"default_image": "ghcr.io/acme/base:3"})
    task.refresh_from_db()
    assert task.image == "ghcr.io/acme/base:2"


def test_a_container_pool_without_any_image_says_what_to_do(containers: Any) -> None:
    message = _refusal(containers)
    assert message == (
        "pool 'h100-train' runs containers: name an image (image: …) or ask a tenant admin to set "
        "queue 'train''s default image"
    )


@pytest.mark.parametrize(
    "image",
    ["has space:1", "ml/Trainer:1", "trainer:", "a" * 513, "ghcr.io//x", "x@sha256:short"],
    ids=["a space", "an uppercase name", "an empty tag", "too long", "an empty component", "a short digest"],
)
def test_an_implausible_image_reference_is_refused(containers: Any, image: str) -> None:
    assert "image reference" in _refusal(containers, image=image)


@pytest.mark.parametrize(
    "image",
    [
        "busybox",
        "my-ai-model:latest",
        "localhost:5000/team/model:v1.2",
        "ghcr.io/acme/base@sha256:" + "ab" * 32,
        "registry.example.org/ml/trainer:1.4@sha256:" + "0f" * 32,
    ],
)
def test_plausible_image_references_pass(image: str) -> None:
    assert image_reference_refusal(image) == ""


def test_an_image_outside_the_pools_allowed_prefixes_is_refused_naming_them(containers: Any) -> None:
    Pool.objects.filter(pk=containers.h100.pk).update(
        allowed_image_prefixes=["registry.example.org/ml/", "ghcr.io/acme/"]
    )
    assert _submit(containers, image=IMAGE).image == IMAGE
    message = _refusal(containers, image="docker.io/evil/miner:1")
    assert message == (
        "image 'docker.io/evil/miner:1' is not allowed in pool 'h100-train': it must start with "
        "'registry.example.org/ml/' or 'ghcr.io/acme/'"
    )


def test_a_process_pool_refuses_an_image(world: Any) -> None:
    assert (
        _refusal(world, image=IMAGE) == "pool 'h100-train' runs host processes, not images; leave image out"
    )
    task = _submit(world)
    assert (task.runtime, task.image) == ("process", "")


def test_a_task_keeps_the_runtime_it_got_when_the_pool_changes(world: Any) -> None:
    task = _submit(world)
    Pool.objects.filter(pk=world.h100.pk).update(runtime=Pool.Runtime.CONTAINER)
    task.refresh_from_db()
    assert task.runtime == "process"


def test_a_new_pool_runs_containers_by_default() -> None:
    from apps.inventory.services import pool_create

    assert pool_create(name="fresh").runtime == "container"


def test_the_api_takes_an_image_and_shows_runtime_and_image(containers: Any, api: Any) -> None:
    body = {"queue": "train", "command": ["python", "train.py"], "image": IMAGE}
    answer = api(containers.alice).post("/api/v1/tasks/", body, format="json")
    assert answer.status_code == 201, answer.json()
    shown = api(containers.alice).get(f"/api/v1/tasks/{answer.json()['id']}/").json()
    assert (shown["runtime"], shown["image"]) == ("container", IMAGE)


def test_the_api_refuses_a_missing_image_with_one_sentence_and_stores_nothing(
    containers: Any, api: Any
) -> None:
    before = Task.objects.count()
    answer = api(containers.alice).post(
        "/api/v1/tasks/", {"queue": "train", "command": ["true"]}, format="json"
    )
    assert answer.status_code == 400
    assert answer.json()["image"] == [
        "pool 'h100-train' runs containers: name an image (image: …) or ask a tenant admin to set "
        "queue 'train''s default image"
    ]
    assert Task.objects.count() == before


def test_a_bulk_submission_refuses_the_item_without_an_image(containers: Any, api: Any) -> None:
    body = {
        "tasks": [
            {"queue": "train", "command": ["true"], "image": IMAGE},
            {"queue": "train", "command": ["true"]},
        ]
    }
    before = Task.objects.count()
    answer = api(containers.alice).post("/api/v1/tasks/bulk/", body, format="json")
    assert answer.status_code == 400, answer.json()
    assert "runs containers" in str(answer.json())
    assert Task.objects.count() == before


def test_a_tenant_admin_sets_their_queues_default_image_and_others_cannot(containers: Any, api: Any) -> None:
    url = f"/api/v1/queues/{containers.queue_a.pk}/"
    assert api(containers.alice).patch(url, {"default_image": IMAGE}, format="json").status_code == 403
    assert api(containers.bob).patch(url, {"default_image": IMAGE}, format="json").status_code == 404
    answer = api(containers.ada).patch(url, {"default_image": IMAGE}, format="json")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["default_image"] == IMAGE
    bad = api(containers.ada).patch(url, {"default_image": "Not An Image"}, format="json")
    assert bad.status_code == 400
    assert "image reference" in bad.json()["default_image"][0]


def test_the_pool_api_shows_the_operator_settings(world: Any, api: Any) -> None:
    shown = api(world.alice).get(f"/api/v1/pools/{world.h100.pk}/").json()
    assert (shown["runtime"], shown["allowed_image_prefixes"], shown["image_pull_policy"]) == (
        "process",
        [],
        "missing",
    )


# ---- the tenant's uid --------------------------------------------------------------------------------


def test_a_tenant_without_its_own_uid_takes_the_base_plus_its_id(world: Any, settings: Any) -> None:
    settings.WHALEGEN_TASK_UID_BASE = 300_000
    assert world.tenant_a.run_uid_effective == 300_000 + world.tenant_a.pk
    world.tenant_a.run_uid = 300_123
    assert world.tenant_a.run_uid_effective == 300_123


@pytest.mark.parametrize(
    ("uid", "words"),
    [(0, "system account"), (999, "system account"), (199_999, "outside"), (300_000, "outside")],
    ids=["root", "a system account", "just below the range", "just above the range"],
)
def test_a_tenant_uid_outside_the_range_is_refused(world: Any, uid: int, words: str) -> None:
    world.tenant_a.run_uid = uid
    with pytest.raises(ValidationError) as caught:
        world.tenant_a.full_clean()
    assert words in caught.value.message_dict["run_uid"][0]


def test_a_tenant_whose_uid_fell_outside_the_range_cannot_submit(world: Any, settings: Any) -> None:
    settings.WHALEGEN_TASK_UID_COUNT = 1  # only base + 0: every tenant's base + id is outside
    with pytest.raises(ValidationError) as caught:
        _submit(world)
    assert "has no usable run uid" in caught.value.message_dict["queue"][0]
