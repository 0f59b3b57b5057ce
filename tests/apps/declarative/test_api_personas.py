"""The apply and object endpoints against every persona (tests/conftest.py): alice (member of A =
vision), ada (admin of A), vic (viewer of A), bob (member of B = speech), eve (no tenant), root (platform
admin), nobody signed in. What is not yours to see answers 404 (or "unknown tenant" in an apply result),
never 403."""

from __future__ import annotations

import pytest

QUEUE_IN_A = {
    "kind": "Queue",
    "metadata": {"tenant": "vision", "name": "urgent"},
    "spec": {"pool": "h100-train"},
}
MEMBER_IN_A = {
    "kind": "Member",
    "metadata": {"tenant": "vision", "user": "newcomer"},
    "spec": {"role": "viewer"},
}
POOL = {"kind": "Pool", "metadata": {"name": "h200-new"}, "spec": {"runtime": "process"}}
QUOTA_IN_B = {
    "kind": "Quota",
    "metadata": {"tenant": "speech", "pool": "l4-infer"},
    "spec": {"guaranteed_gpus": 3},
}

TENANT_ADMIN_WRITES = {
    "ada": "created",
    "root": "created",
    "alice": "refused: writing queues in tenant 'vision' needs the admin role; you have member",
    "vic": "refused: writing queues in tenant 'vision' needs the admin role; you have viewer",
    "bob": "refused: unknown tenant 'vision'",
    "eve": "refused: unknown tenant 'vision'",
}
PLATFORM_WRITES = {
    "root": "created",
    "ada": "refused: writing pools is for platform admins",
    "alice": "refused: writing pools is for platform admins",
    "bob": "refused: writing pools is for platform admins",
    "eve": "refused: writing pools is for platform admins",
}


def _outcome(response) -> str:
    assert response.status_code == 200, response.content
    [result] = response.json()["results"]
    return result["outcome"] + (f": {result['reason']}" if result["reason"] else "")


@pytest.mark.parametrize(
    ("document", "persona", "want"),
    [(QUEUE_IN_A, p, w) for p, w in TENANT_ADMIN_WRITES.items()]
    + [(MEMBER_IN_A, p, w.replace("queues", "members")) for p, w in TENANT_ADMIN_WRITES.items()]
    + [(POOL, p, w) for p, w in PLATFORM_WRITES.items()]
    + [(QUOTA_IN_B, p, w.replace("pools", "quotas")) for p, w in PLATFORM_WRITES.items()],
    ids=lambda value: value["kind"] if isinstance(value, dict) else value,
)
def test_apply_writes_only_what_the_personas_role_allows(world, api, document, persona, want) -> None:
    response = api(getattr(world, persona)).post("/api/v1/apply/", {"documents": [document]}, format="json")
    assert _outcome(response) == want


def test_apply_needs_a_signed_in_caller(world, api) -> None:
    assert api(None).post("/api/v1/apply/", {"documents": [POOL]}, format="json").status_code == 401


def test_a_tenant_admins_prune_leaves_other_tenants_objects_alone(world, api) -> None:
    from apps.workloads.models import Queue

    root, ada = api(world.root), api(world.ada)
    speech = {
        "kind": "Queue",
        "metadata": {"tenant": "speech", "name": "extra"},
        "spec": {"pool": "h100-train"},
    }
    assert _outcome(root.post("/api/v1/apply/", {"documents": [speech]}, format="json")) == "created"
    assert _outcome(ada.post("/api/v1/apply/", {"documents": [QUEUE_IN_A]}, format="json")) == "created"
    other = {**QUEUE_IN_A, "metadata": {"tenant": "vision", "name": "other"}}
    response = ada.post("/api/v1/apply/", {"documents": [other], "prune": True}, format="json")
    outcomes = {r["key"]: r["outcome"] for r in response.json()["results"]}
    assert outcomes == {"vision/other": "created", "vision/urgent": "pruned"}
    assert Queue.objects.filter(tenant__slug="speech", name="extra").exists()


OWN = {"alice": 200, "ada": 200, "bob": 404, "eve": 404, "root": 200, None: 401}


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/api/v1/objects/queues/vision/train/", OWN),
        ("/api/v1/objects/quotas/vision/l4-infer/", OWN),
        ("/api/v1/objects/pools/l4-infer/", OWN),
        ("/api/v1/objects/members/vision/alice/", OWN),
        ("/api/v1/objects/tenants/vision/", OWN),
        ("/api/v1/objects/nodes/eu-1/l4-001/", OWN),
        ("/api/v1/objects/no-such-kind/", {"root": 404, None: 401}),
    ],
)
def test_reading_one_object_answers_each_persona(world, api, path: str, want: dict) -> None:
    for persona, status in want.items():
        user = getattr(world, persona) if persona else None
        assert api(user).get(path).status_code == status, (persona, path)


@pytest.mark.parametrize(
    ("persona", "want_members", "want_queues"),
    [
        ("alice", {"vision/ada", "vision/alice", "vision/vic"}, {"vision/train", "vision/infer"}),
        ("bob", {"speech/bob"}, {"speech/train"}),
        ("eve", set(), set()),
        (
            "root",
            {"vision/ada", "vision/alice", "vision/vic", "speech/bob"},
            {"vision/train", "vision/infer", "speech/train"},
        ),
    ],
)
def test_lists_hold_only_what_a_persona_may_see(world, api, persona, want_members, want_queues) -> None:
    client = api(getattr(world, persona))
    members = client.get("/api/v1/members/").json()["results"]
    assert {f"{m['tenant']}/{m['user']}" for m in members} == want_members
    queues = client.get("/api/v1/objects/queues/").json()["items"]
    assert {f"{q['metadata']['tenant']}/{q['metadata']['name']}" for q in queues} == want_queues


def test_prices_are_read_by_everyone_signed_in_and_applied_ones_win(world, api, settings) -> None:
    settings.WHALEGEN_GPU_PRICES = {"H100-80GB": 2.0, "L4": 0.5}
    price = {"kind": "GpuPrice", "metadata": {"name": "H100-80GB"}, "spec": {"per_gpu_hour": 2.75}}
    assert (
        _outcome(api(world.root).post("/api/v1/apply/", {"documents": [price]}, format="json")) == "created"
    )
    for persona in ("alice", "bob", "eve", "root"):
        rows = api(getattr(world, persona)).get("/api/v1/prices/").json()
        assert {(r["model"], r["per_gpu_hour"], r["source"]) for r in rows} == {
            ("H100-80GB", 2.75, "applied"),
            ("L4", 0.5, "environment"),
        }
    assert api(None).get("/api/v1/prices/").status_code == 401
    assert api(None).get("/api/v1/members/").status_code == 401
