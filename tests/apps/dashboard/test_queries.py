"""Every dashboard page's exact number of SQL queries, pinned, on a pool of several nodes with placed,
pending, cancelled tasks and overrides — and the same number when there are three times as many of each,
so an N+1 (a query per row) fails here at once."""

from __future__ import annotations

from typing import Any

import pytest

from apps.approvals.services import override_request
from apps.fleet.nodes import node_cordon
from apps.inventory.services import gpu_add, node_register, pool_create
from apps.scheduling.services import cycle_run
from apps.workloads.services import TaskSubmission, queue_create, quota_set, task_cancel, task_submit

pytestmark = pytest.mark.django_db


@pytest.fixture(params=[2, 6], ids=["a few of each", "three times as many"])
def crowd(request: Any, scene: Any) -> Any:
    """`n` more nodes of two whole H100s and a cordoned one of eight, per tenant `n` one-GPU tasks (some
    fit, some wait) and an eight-GPU task that waits for the cordoned node, a cancelled task each, `n`
    pending overrides, `n / 2` more pools; then one more cycle per pool."""
    w = scene.world
    n = request.param
    for i in range(n):
        node, _ = node_register(
            cluster=w.node.cluster, pool=w.h100, name=f"gpu-1{i:02d}", cpu_milli=96_000, mem_mib=1_048_576
        )
        gpu_add(node=node, index=0, model="H100-80GB")
        gpu_add(node=node, index=1, model="H100-80GB")
    # An eight-GPU node, cordoned: eight-GPU tasks are accepted (a node of the pool could take them;
    # submission refuses only what never could) and wait, since it takes nothing new.
    big, _ = node_register(
        cluster=w.node.cluster, pool=w.h100, name="gpu-big", cpu_milli=96_000, mem_mib=1_048_576
    )
    for index in range(8):
        gpu_add(node=big, index=index, model="H100-80GB")
    node_cordon(node=big, actor="user:ops")
    for tenant, user in ((w.tenant_a, w.alice), (w.tenant_b, w.bob)):
        quota_set(tenant=tenant, pool=w.h100, guaranteed_milli=200_000)  # room for every request below
        for i in range(n):
            task_submit(tenant=tenant, request=TaskSubmission(queue="train", name=f"t{i}"), submitted_by=user)
        task_submit(
            tenant=tenant, request=TaskSubmission(queue="train", name="huge", gpu_count=8), submitted_by=user
        )
        gone, _ = task_submit(
            tenant=tenant, request=TaskSubmission(queue="train", name="gone"), submitted_by=user
        )
        task_cancel(task=gone, by=user, reason="not needed")
        for i in range(n):
            pending, _ = task_submit(
                tenant=tenant,
                request=TaskSubmission(queue="train", name=f"o{i}", gpu_count=8),
                submitted_by=user,
            )
            override_request(
                tenant=tenant, task=pending, wanted_priority=40, reason="deadline", requested_by=user
            )
    # More pools (one, then three), each with a node, A's quota and queue and a task: the lists of
    # pools and the fleet overview read them all at once.
    for i in range(n // 2):
        pool = pool_create(name=f"extra-{i}", runtime="process")
        node, _ = node_register(
            cluster=w.node.cluster, pool=pool, name=f"x-{i}", cpu_milli=32_000, mem_mib=262_144
        )
        gpu_add(node=node, index=0, model="L4")
        quota_set(tenant=w.tenant_a, pool=pool, guaranteed_milli=1000)
        queue_create(tenant=w.tenant_a, pool=pool, name=f"q{i}")
        task_submit(tenant=w.tenant_a, request=TaskSubmission(queue=f"q{i}"), submitted_by=w.alice)
        cycle_run(pool_id=pool.pk)
    cycle_run(pool_id=w.h100.pk)
    return scene


def pages(scene: Any) -> dict[str, str]:
    w = scene.world
    return {
        "overview": "/",
        "tasks": "/tasks/",
        "tasks pending": "/tasks/?state=pending",
        "task": f"/tasks/{scene.placed.pk}/",
        "overrides": "/overrides/",
        "pools": "/pools/",
        "pool": f"/pools/{w.h100.pk}/",
        "history": f"/pools/{w.h100.pk}/history/?hours=6",
        "whatif": f"/pools/{w.h100.pk}/whatif/?policy=fgd",
        "accounting": "/accounting/",
    }


# (persona, page) → queries of one request with a warm session; pinned, so a change shows here.
EXPECTED: dict[tuple[str, str], int] = {
    ("root", "overview"): 15,
    ("alice", "overview"): 9,
    ("root", "tasks"): 8,
    ("alice", "tasks"): 8,
    ("root", "tasks pending"): 7,
    ("alice", "tasks pending"): 7,
    ("root", "task"): 9,
    ("alice", "task"): 9,
    ("root", "overrides"): 8,
    ("alice", "overrides"): 8,
    ("root", "pools"): 6,
    ("alice", "pools"): 6,
    ("root", "pool"): 12,  # the heat-map's holders come from the live assignments (a unit stores none)
    ("alice", "pool"): 12,
    ("root", "history"): 16,  # 15 and the idle chart's "history still needed" note (no model here)
    ("alice", "history"): 16,
    ("root", "whatif"): 6,  # the decision stored for the newest cycle; its computation is off the page
    ("alice", "whatif"): 6,
    ("root", "accounting"): 8,  # 7 and the GPU prices applied as documents (read once for both months)
    ("alice", "accounting"): 8,
}


@pytest.mark.parametrize("persona", ["root", "alice"])
@pytest.mark.parametrize(
    "name",
    [
        "overview",
        "tasks",
        "tasks pending",
        "task",
        "overrides",
        "pools",
        "pool",
        "history",
        "whatif",
        "accounting",
    ],
)
def test_page_query_count_is_pinned(
    crowd: Any, page: Any, persona: str, name: str, django_assert_num_queries: Any, whatif_jobs: Any
) -> None:
    client = page(getattr(crowd.world, persona))
    client.get("/login/")  # a first request reads the session and the user: count a warm one
    path = pages(crowd)[name]
    if name == "whatif":  # the page as it reads once the cycle's decision is stored
        client.get(path)
        assert whatif_jobs.run() == 1
    with django_assert_num_queries(EXPECTED[(persona, name)]):
        assert client.get(path).status_code == 200


WHATIF_COMPUTING = {"root": 6, "alice": 6}  # the first request after a cycle: the decision is started


@pytest.mark.parametrize("persona", ["root", "alice"])
def test_whatif_answers_at_once_while_its_decision_is_computed(
    crowd: Any, page: Any, persona: str, django_assert_num_queries: Any, whatif_jobs: Any
) -> None:
    """The first request after a cycle starts the decision and answers without it: the same few
    queries however many tasks the pool has."""
    client = page(getattr(crowd.world, persona))
    client.get("/login/")
    with django_assert_num_queries(WHATIF_COMPUTING[persona]):
        assert "Computing…" in client.get(pages(crowd)["whatif"]).content.decode()
    assert len(whatif_jobs.started) == 1
