"""Every endpoint against every persona: a member of tenant A (alice), a member of tenant B (bob), an
outsider with no membership (eve), a platform admin (root), and nobody signed in.

The resource in each row belongs to tenant A. What is not yours answers 404 (or, when named in a body,
"unknown" on its field), never 403: 403 is for things you can see but may not do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from apps.approvals.models import PriorityOverride
from tests.apps.factories import OverrideFactory


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: Callable[[Any], str]
    want: dict[str, int]  # persona → status
    body: Callable[[Any], dict] | None = None


def _override(w: Any) -> PriorityOverride:
    return OverrideFactory(task=w.task_a, requested_by=w.alice)


# What each persona gets, for the common shapes of endpoint.
LIST = {"alice": 200, "bob": 200, "eve": 200, "root": 200, "anon": 401}  # lists filter, they never refuse
OWN = {"alice": 200, "bob": 404, "eve": 404, "root": 200, "anon": 401}  # an object of tenant A
CREATE_IN_A = {"alice": 201, "bob": 400, "eve": 400, "root": 201, "anon": 401}  # tenant named in the body
ADMIN_OF_A = {"alice": 403, "ada": 200, "bob": 404, "eve": 404, "root": 200, "anon": 401}
PLATFORM = {"alice": 403, "ada": 403, "bob": 404, "eve": 404, "root": 200, "anon": 401}


def _a_l4_node(w: Any) -> Any:
    return w.l4.nodes.get()


CASES = [
    Case("list tasks", "get", lambda w: "/api/v1/tasks/", LIST),
    Case("read a task", "get", lambda w: f"/api/v1/tasks/{w.task_a.pk}/", OWN),
    Case("read task events", "get", lambda w: f"/api/v1/tasks/{w.task_a.pk}/events/", OWN),
    Case(
        "submit a task",
        "post",
        lambda w: "/api/v1/tasks/",
        CREATE_IN_A,
        lambda w: {"tenant": "vision", "queue": "train", "command": ["true"], "gpu_milli": 500},
    ),
    Case(
        "bulk submit",
        "post",
        lambda w: "/api/v1/tasks/bulk/",
        CREATE_IN_A,
        lambda w: {
            "tenant": "vision",
            "tasks": [{"queue": "train", "command": ["true"], "gpu_milli": 250}] * 2,
        },
    ),
    Case("cancel a task", "post", lambda w: f"/api/v1/tasks/{w.task_a.pk}/cancel/", OWN),
    Case("list queues", "get", lambda w: "/api/v1/queues/", LIST),
    Case("read a queue", "get", lambda w: f"/api/v1/queues/{w.queue_a.pk}/", OWN),
    Case(
        "create a queue",
        "post",
        lambda w: "/api/v1/queues/",
        {**CREATE_IN_A, "alice": 403, "ada": 201},
        lambda w: {"tenant": "vision", "pool": "h100-train", "name": "urgent"},
    ),
    Case(
        "change a queue",
        "patch",
        lambda w: f"/api/v1/queues/{w.queue_a.pk}/",
        ADMIN_OF_A,
        lambda w: {"weight": 3},
    ),
    Case(
        "delete a queue",
        "delete",
        lambda w: f"/api/v1/queues/{w.queue_a_l4.pk}/",
        {**ADMIN_OF_A, "ada": 204, "root": 204},
    ),
    Case("list quotas", "get", lambda w: "/api/v1/quotas/", LIST),
    Case("read a quota", "get", lambda w: f"/api/v1/quotas/{w.quota_a.pk}/", OWN),
    Case(
        "set a quota",
        "post",
        lambda w: "/api/v1/quotas/",
        {**PLATFORM, "bob": 403, "eve": 403, "root": 201},
        lambda w: {"tenant": "speech", "pool": "l4-infer", "guaranteed_milli": 1000},
    ),
    Case(
        "change a quota",
        "patch",
        lambda w: f"/api/v1/quotas/{w.quota_a.pk}/",
        PLATFORM,
        lambda w: {"borrow_limit_milli": 0},
    ),
    Case("list pools", "get", lambda w: "/api/v1/pools/", LIST),
    Case("read a pool only A uses", "get", lambda w: f"/api/v1/pools/{w.l4.pk}/", OWN),
    Case("list clusters", "get", lambda w: "/api/v1/clusters/", LIST),
    # The cluster holds pools of both tenants: bob sees it too, the outsider does not.
    Case("read a cluster", "get", lambda w: f"/api/v1/clusters/{w.node.cluster_id}/", {**OWN, "bob": 200}),
    Case("list nodes", "get", lambda w: "/api/v1/nodes/", LIST),
    Case("read a node in A's L4 pool", "get", lambda w: f"/api/v1/nodes/{_a_l4_node(w).pk}/", OWN),
    Case("list GPUs", "get", lambda w: "/api/v1/gpus/", LIST),
    Case("read a GPU in A's L4 pool", "get", lambda w: f"/api/v1/gpus/{_a_l4_node(w).gpus.get().pk}/", OWN),
    Case("list tenants", "get", lambda w: "/api/v1/tenants/", LIST),
    Case("list overrides", "get", lambda w: "/api/v1/overrides/", LIST),
    Case(
        "request an override",
        "post",
        lambda w: "/api/v1/overrides/",
        CREATE_IN_A,
        lambda w: {"task": w.task_a.pk, "wanted_priority": 50, "reason": "demo on Friday"},
    ),
    Case("read an override", "get", lambda w: f"/api/v1/overrides/{_override(w).pk}/", OWN),
    Case(
        "approve an override",
        "post",
        lambda w: f"/api/v1/overrides/{_override(w).pk}/approve/",
        PLATFORM,
        lambda w: {"comment": "ok"},
    ),
    Case(
        "reject an override",
        "post",
        lambda w: f"/api/v1/overrides/{_override(w).pk}/reject/",
        PLATFORM,
        lambda w: {"comment": "not now"},
    ),
]


@pytest.mark.parametrize(
    ("case", "persona"),
    [(case, persona) for case in CASES for persona in case.want],
    ids=[f"{persona} may {case.name}: {case.want[persona]}" for case in CASES for persona in case.want],
)
def test_every_endpoint_answers_each_persona_as_its_role_allows(world, api, case: Case, persona: str) -> None:
    client = api(None if persona == "anon" else getattr(world, persona))
    body = case.body(world) if case.body else None
    response = getattr(client, case.method)(case.path(world), body, format="json")
    assert response.status_code == case.want[persona], response.content


def _ids(response) -> set[int]:
    return {row["id"] for row in response.json()["results"]}


@pytest.mark.parametrize(
    ("persona", "want"),
    [("alice", {"task_a"}), ("bob", {"task_b"}), ("eve", set()), ("root", {"task_a", "task_b"})],
)
def test_task_lists_hold_only_the_tasks_a_persona_may_see(world, api, persona: str, want: set[str]) -> None:
    response = api(getattr(world, persona)).get("/api/v1/tasks/")
    assert _ids(response) == {getattr(world, name).pk for name in want}


@pytest.mark.parametrize(
    ("persona", "want"),
    [
        ("alice", {"h100-train", "l4-infer"}),
        ("bob", {"h100-train"}),
        ("eve", set()),
        ("root", {"h100-train", "l4-infer"}),
    ],
)
def test_pool_lists_hold_the_pools_a_personas_tenants_have_quota_in(
    world, api, persona: str, want: set[str]
) -> None:
    response = api(getattr(world, persona)).get("/api/v1/pools/")
    assert {row["name"] for row in response.json()["results"]} == want


@pytest.mark.parametrize(
    ("persona", "want"),
    [("alice", {"vision"}), ("bob", {"speech"}), ("eve", set()), ("root", {"acme", "vision", "speech"})],
)
def test_tenant_lists_hold_the_tenants_a_persona_belongs_to(world, api, persona: str, want: set[str]) -> None:
    response = api(getattr(world, persona)).get("/api/v1/tenants/")
    assert {row["slug"] for row in response.json()["results"]} == want


def test_viewer_reads_but_cannot_submit_or_cancel(world, api) -> None:
    client = api(world.vic)
    assert client.get(f"/api/v1/tasks/{world.task_a.pk}/").status_code == 200
    submit = client.post(
        "/api/v1/tasks/", {"tenant": "vision", "queue": "train", "command": ["true"]}, format="json"
    )
    assert submit.status_code == 403
    assert "member role" in submit.json()["detail"]
    assert client.post(f"/api/v1/tasks/{world.task_a.pk}/cancel/", {}, format="json").status_code == 403


def test_an_org_membership_reaches_the_teams_below_it(world, api) -> None:
    from apps.tenants.models import Membership
    from apps.tenants.services import membership_set

    membership_set(user=world.eve, tenant=world.tenant_a.parent, role=Membership.Role.VIEWER)
    response = api(world.eve).get("/api/v1/tasks/")
    assert _ids(response) == {world.task_a.pk, world.task_b.pk}
