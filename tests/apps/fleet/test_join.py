"""A node joins itself (issue #38, item 2): a host trades a join token for its node credential, its GPUs
come from its own description, every refused join says why in one sentence and spends nothing, a
single-use token joins one host however many race for it, and an approval token holds the node back
until a platform admin approves it. Join tokens are platform admins' alone."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from whalegen import protocol as p

pytestmark = pytest.mark.django_db

JOIN = p.JOIN_PATH
TOKENS = "/api/v1/join-tokens/"


def gpu(index: int, *, model: str = "H100-80GB", uuid: str = "", **fields: Any) -> p.GpuInventory:
    return p.GpuInventory(
        index=index,
        uuid=uuid or f"GPU-join-{index:04d}-0000-0000-000000000000",
        name=f"NVIDIA {model}",
        model=model,
        mem_mib=81_559,
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
        mig_capable=model.startswith("H100"),
        **fields,
    )


def host(token: str, *, pool: str = "h100-train", name: str = "gpu-new", **fields: Any) -> p.Join:
    defaults: dict[str, Any] = {
        "hostname": f"{name}.example",
        "agent_version": "0.1",
        "cpu_milli": 64_000,
        "mem_mib": 524_288,
        "inventory": (gpu(0), gpu(1)),
    }
    return p.Join(join_token=token, pool=pool, node_name=name, **{**defaults, **fields})


def join(client: Any, message: p.Join | dict[str, Any]) -> Any:
    body = message.to_dict() if isinstance(message, p.Join) else message
    return client.post(JOIN, body, format="json")


def make_token(world: Any, *, pool: Any = None, **fields: Any) -> tuple[Any, str]:
    from apps.fleet.join import join_token_create

    options: dict[str, Any] = {"ttl_s": 3600, "created_by": "user:root", **fields}
    return join_token_create(pool=pool or world.h100, cluster=world.node.cluster, **options)


# ---- a host joins ---------------------------------------------------------------------------------------


def test_a_host_joins_with_its_own_gpus_and_gets_its_credential_once(world: Any, api: Any) -> None:
    from apps.fleet.models import NodeJoin
    from apps.fleet.selectors import credential_hash
    from apps.inventory.models import Gpu, Node

    token, raw = make_token(world)
    mig = gpu(
        1,
        mig_current=True,
        instances=(p.MigInstance(gi_id=1, profile_id=9, profile="3g.40gb", start=4, size=4),),
    )
    answer = join(api(), host(raw, inventory=(gpu(0), mig, gpu(2, model="L40S"))))
    assert answer.status_code == 201, answer.json()
    joined = p.Joined.from_dict(answer.json())
    assert (joined.node_name, joined.cluster, joined.pool, joined.pending_approval) == (
        "gpu-new",
        "eu-1",
        "h100-train",
        False,
    )
    node = Node.objects.get(pk=int(joined.node_id))
    assert (node.state, node.cpu_milli, node.mem_mib) == ("ready", 64_000, 524_288)
    # The plane keeps the credential's hash, never the credential.
    assert joined.credential.startswith("wgn_") and node.agent_credential_hash == credential_hash(
        joined.credential
    )
    gpus = list(node.gpus.order_by("index"))
    assert [(g.index, g.uuid, g.model, g.partition_mode) for g in gpus] == [
        (0, "GPU-join-0000-0000-0000-000000000000", "H100-80GB", "whole"),
        (1, "GPU-join-0001-0000-0000-000000000000", "H100-80GB", "mig"),
        (2, "GPU-join-0002-0000-0000-000000000000", "L40S", "whole"),
    ]
    assert [(u.kind, u.mig_profile, u.mig_start) for u in gpus[1].units.all()] == [("mig", "3g.40gb", 4)]
    assert Gpu.objects.get(index=0, node=node).units.get().gpu_milli == 1000
    token.refresh_from_db()
    assert token.uses == 1
    record = NodeJoin.objects.get(node=node)
    assert (record.join_token_id, record.hostname, record.pending_approval) == (
        token.pk,
        "gpu-new.example",
        False,
    )


def test_the_inventory_of_the_simulated_example_host_joins_as_it_is(
    world: Any, api: Any, tmp_path: Any
) -> None:
    """What `whalegen agent inspect --backend sim` reads is what the node is made of."""
    from agents.sim.backend import from_spec_file
    from agents.sim.spec import EXAMPLE_HOST_SPEC

    _, backend = from_spec_file(EXAMPLE_HOST_SPEC, None, tmp_path)
    backend.open()
    try:
        inventory = tuple(backend.inventory())
    finally:
        backend.close()
    _, raw = make_token(world)
    answer = join(api(), host(raw, name="sim-host", inventory=inventory))
    assert answer.status_code == 201, answer.json()
    from apps.inventory.models import Node

    node = Node.objects.get(name="sim-host")
    assert [(g.uuid, g.model) for g in node.gpus.order_by("index")] == [(i.uuid, i.model) for i in inventory]


def test_the_credential_registers_and_heartbeats_afterwards(world: Any, api: Any, agent_client: Any) -> None:
    _, raw = make_token(world)
    joined = p.Joined.from_dict(join(api(), host(raw)).json())
    client = agent_client(joined.credential)
    register = p.Register(node_name="gpu-new", hostname="gpu-new.example", agent_version="0.1")
    registered = client.post(p.REGISTER_PATH, register.to_dict(), format="json")
    assert registered.status_code == 200
    assert p.Registered.from_dict(registered.json()).node_id == joined.node_id
    beat = p.Heartbeat(
        node_id=joined.node_id, agent_version="0.1", sent_at_s=time.time(), inventory=(gpu(0), gpu(1))
    )
    assert client.post(p.HEARTBEAT_PATH, beat.to_dict(), format="json").status_code == 200
    assert client.get(p.DESIRED_STATE_PATH, {"generation": 0, "wait_s": 0}).status_code == 200


# ---- refused joins: one sentence each, nothing spent ---------------------------------------------------


def _expired(world: Any) -> str:
    _, raw = make_token(world, now=timezone.now() - timedelta(hours=2))
    return raw


def _revoked(world: Any) -> str:
    from apps.fleet.join import join_token_revoke

    token, raw = make_token(world)
    join_token_revoke(token=token, actor="user:root")
    return raw


def _used(world: Any) -> str:
    from apps.fleet.join import node_join

    _, raw = make_token(world, max_uses=1)
    node_join(message=host(raw, name="first-host", inventory=(gpu(0, uuid="GPU-first-0"),)))
    return raw


@pytest.mark.parametrize(
    ("case", "pool", "name", "status", "sentence"),
    [
        (
            "expired",
            "h100-train",
            "gpu-new",
            403,
            "join token h100-train-\\w+ expired at .* ask an admin for a new one",
        ),
        ("revoked", "h100-train", "gpu-new", 403, "join token h100-train-\\w+ was revoked at .*ask an admin"),
        (
            "used",
            "h100-train",
            "gpu-new",
            403,
            "join token h100-train-\\w+ has been used up \\(its one use\\)",
        ),
        ("fresh", "l4-infer", "gpu-new", 403, "this join token is for pool 'h100-train', not 'l4-infer'"),
        (
            "fresh",
            "a100-nowhere",
            "gpu-new",
            403,
            "there is no pool 'a100-nowhere'; this join token is for pool",
        ),
        ("unknown", "h100-train", "gpu-new", 401, "unknown join token"),
        (
            "fresh",
            "h100-train",
            "gpu-001",
            409,
            "node eu-1/gpu-001 has already joined and holds a live credential",
        ),
    ],
    ids=[
        "an expired token is refused",
        "a revoked token is refused",
        "a single-use token is refused the second time",
        "a token of another pool is refused",
        "an unknown pool is refused",
        "an unknown token is refused",
        "a node name that holds a live credential is refused, not rotated",
    ],
)
def test_a_refused_join_says_why_and_spends_nothing(
    world: Any, api: Any, case: str, pool: str, name: str, status: int, sentence: str
) -> None:
    import re

    from apps.fleet.models import JoinToken
    from apps.inventory.models import Node

    raw = {
        "expired": _expired,
        "revoked": _revoked,
        "used": _used,
        "fresh": lambda w: make_token(w)[1],
        "unknown": lambda w: "wgj_" + "x" * 43,
    }[case](world)
    uses = {t.pk: t.uses for t in JoinToken.objects.all()}
    nodes = Node.objects.count()
    answer = join(api(), host(raw, pool=pool, name=name))
    assert answer.status_code == status
    detail = answer.json()["detail"]
    assert re.search(sentence, detail), detail
    assert detail.count(". ") == 0  # one sentence
    assert {t.pk: t.uses for t in JoinToken.objects.all()} == uses
    assert Node.objects.count() == nodes


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"inventory": ()}, "inventory", "reports no GPU"),
        ({"inventory": (gpu(0, model="B300-288GB"),)}, "inventory", "catalogue has no model 'B300-288GB'"),
        (
            {"inventory": (gpu(0), gpu(1, uuid="GPU-join-0000-0000-0000-000000000000"))},
            "inventory",
            "share a UUID",
        ),
        ({"inventory": (gpu(0, lost=True),)}, "inventory", "is lost"),
        ({"inventory": (gpu(0, model="L40S", mig_current=True),)}, "inventory", "has no MIG"),
        ({"name": "../etc"}, "node_name", "a host name"),
        ({"cpu_milli": 0}, "cpu_milli", "positive"),
    ],
    ids=[
        "a host without GPUs",
        "a GPU the catalogue does not know",
        "two GPUs with one UUID",
        "a lost GPU",
        "MIG on a model without MIG",
        "a node name that is no host name",
        "no CPUs",
    ],
)
def test_a_malformed_host_description_is_refused_field_by_field(
    world: Any, api: Any, change: dict[str, Any], field: str, words: str
) -> None:
    token, raw = make_token(world)
    answer = join(api(), host(raw, **change))
    assert answer.status_code == 400
    assert any(words in message for message in answer.json()[field]), answer.json()
    token.refresh_from_db()
    assert token.uses == 0


def test_a_message_that_is_not_a_join_is_refused_before_any_token_is_looked_at(world: Any, api: Any) -> None:
    _, raw = make_token(world)
    body = host(raw).to_dict()
    del body["cpu_milli"]
    answer = join(api(), body)
    assert answer.status_code == 400
    assert answer.json()["detail"] == "Join: missing cpu_milli"
    body = host(raw, inventory=(gpu(0),)).to_dict()
    body["inventory"][0]["mem_mib"] = "lots"
    assert join(api(), body).json()["detail"] == "Join.inventory[0].mem_mib: expected an integer"


def test_a_gpu_that_belongs_to_another_node_is_refused(world: Any, api: Any) -> None:
    taken = world.node.gpus.get(index=1).uuid
    token, raw = make_token(world)
    answer = join(api(), host(raw, inventory=(gpu(0, uuid=taken),)))
    assert answer.status_code == 409
    assert f"GPU {taken} already belongs to node eu-1/gpu-001" in answer.json()["detail"]
    token.refresh_from_db()
    assert token.uses == 0


# ---- uses ------------------------------------------------------------------------------------------------


def test_a_multi_use_token_joins_as_many_hosts_as_it_allows(world: Any, api: Any) -> None:
    token, raw = make_token(world, max_uses=3)
    for n in range(3):
        inventory = (gpu(0, uuid=f"GPU-multi-{n}"),)
        assert join(api(), host(raw, name=f"host-{n}", inventory=inventory)).status_code == 201
    fourth = join(api(), host(raw, name="host-3", inventory=(gpu(0, uuid="GPU-multi-3"),)))
    assert fourth.status_code == 403
    assert "has been used up (all 3 of its uses)" in fourth.json()["detail"]
    token.refresh_from_db()
    assert token.uses == 3


def test_an_unlimited_token_counts_its_uses_until_it_expires(world: Any, api: Any) -> None:
    token, raw = make_token(world, max_uses=None)
    for n in range(4):
        assert (
            join(api(), host(raw, name=f"host-{n}", inventory=(gpu(0, uuid=f"GPU-many-{n}"),))).status_code
            == 201
        )
    token.refresh_from_db()
    assert token.uses == 4


@pytest.mark.django_db(transaction=True)
def test_two_hosts_racing_for_a_single_use_token_one_wins(transactional_db: None) -> None:
    """On PostgreSQL, from two threads (two connections) at the same instant: exactly one join is made,
    the other is refused as used up, and the token counts one use."""
    from django.db import connection, connections

    from apps.common.errors import ApplicationError
    from apps.fleet.join import join_token_create, node_join
    from apps.inventory.models import Node
    from apps.inventory.services import cluster_create, pool_create

    assert connection.vendor == "postgresql"
    cluster = cluster_create(name="race")
    pool = pool_create(name="race-pool", runtime="process")
    token, raw = join_token_create(pool=pool, cluster=cluster, ttl_s=60, max_uses=1)
    start = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def attempt(name: str) -> None:
        try:
            start.wait()
            node_join(message=host(raw, pool="race-pool", name=name, inventory=(gpu(0, uuid=f"GPU-{name}"),)))
            outcomes[name] = "joined"
        except ApplicationError as error:
            outcomes[name] = error.message
        finally:
            connections.close_all()

    for _ in range(5):  # a few rounds: the race is won by either thread, never by both
        outcomes.clear()
        threads = [threading.Thread(target=attempt, args=(name,)) for name in ("racer-a", "racer-b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(o == "joined" for o in outcomes.values()) == [False, True], outcomes
        loser = next(o for o in outcomes.values() if o != "joined")
        assert "has been used up (its one use)" in loser
        token.refresh_from_db()
        assert token.uses == 1
        assert Node.objects.filter(pool=pool).count() == 1
        Node.objects.filter(pool=pool).delete()
        type(token).objects.filter(pk=token.pk).update(uses=0)


# ---- approval -------------------------------------------------------------------------------------------


def test_a_node_joined_with_an_approval_token_waits_for_a_platform_admin(
    world: Any, api: Any, agent_client: Any
) -> None:
    from apps.inventory.models import Node

    _, raw = make_token(world, requires_approval=True)
    answer = join(api(), host(raw))
    joined = p.Joined.from_dict(answer.json())
    assert joined.pending_approval is True
    node = Node.objects.get(pk=int(joined.node_id))
    assert node.state == "cordoned"  # the scheduler gives a cordoned node nothing
    # Its agent heartbeats meanwhile.
    beat = p.Heartbeat(node_id=joined.node_id, agent_version="0.1", sent_at_s=time.time())
    assert (
        agent_client(joined.credential).post(p.HEARTBEAT_PATH, beat.to_dict(), format="json").status_code
        == 200
    )
    # Uncordoning is not a way around the approval.
    uncordon = api(world.root).post(f"/api/v1/nodes/{node.pk}/uncordon/")
    assert uncordon.status_code == 409
    assert "needs approval and is not approved yet" in uncordon.json()["detail"]
    for who in ("alice", "bob", "eve", "ada"):
        refused = api(getattr(world, who)).post(f"/api/v1/nodes/{node.pk}/approve/")
        assert refused.status_code in (403, 404), who
    node.refresh_from_db()
    assert node.state == "cordoned"
    approved = api(world.root).post(f"/api/v1/nodes/{node.pk}/approve/")
    assert approved.status_code == 200
    assert approved.json()["state"] == "ready"
    # Approving again changes nothing.
    assert api(world.root).post(f"/api/v1/nodes/{node.pk}/approve/").json()["state"] == "ready"


def test_a_pool_that_requires_approval_holds_back_a_node_whose_token_did_not_ask_for_it(
    world: Any, api: Any
) -> None:
    from apps.inventory.models import Node

    type(world.h100).objects.filter(pk=world.h100.pk).update(join_requires_approval=True)
    _, raw = make_token(world)  # an ordinary token: no approval asked for
    joined = p.Joined.from_dict(join(api(), host(raw)).json())
    assert joined.pending_approval is True
    node = Node.objects.get(pk=int(joined.node_id))
    assert node.state == "cordoned"
    assert api(world.root).post(f"/api/v1/nodes/{node.pk}/approve/").json()["state"] == "ready"


def test_a_node_that_needed_no_approval_has_nothing_to_approve(world: Any, api: Any) -> None:
    answer = api(world.root).post(f"/api/v1/nodes/{world.node.pk}/approve/")
    assert answer.status_code == 409
    assert "did not join with a token that needs approval" in answer.json()["detail"]


def test_a_node_lost_while_waiting_for_approval_comes_back_cordoned(world: Any, api: Any) -> None:
    from apps.fleet.agents import node_seen
    from apps.inventory.models import Node

    _, raw = make_token(world, requires_approval=True)
    joined = p.Joined.from_dict(join(api(), host(raw)).json())
    Node.objects.filter(pk=int(joined.node_id)).update(state="lost", state_before_lost="cordoned")
    node = Node.objects.get(pk=int(joined.node_id))
    node_seen(node=node, now=timezone.now(), agent_version="0.1")
    node.refresh_from_db()
    assert node.state == "cordoned"


# ---- a declared node, a reinstalled host ---------------------------------------------------------------


def test_a_host_takes_over_a_declared_node_without_a_credential(world: Any, api: Any) -> None:
    from apps.fleet.join import node_credential_revoke

    node_credential_revoke(node=world.node, actor="user:root")
    _, raw = make_token(world)
    uuids = [g.uuid for g in world.node.gpus.order_by("index")]
    answer = join(api(), host(raw, name="gpu-001", inventory=(gpu(0, uuid=uuids[0]), gpu(1, uuid=uuids[1]))))
    assert answer.status_code == 201, answer.json()
    assert p.Joined.from_dict(answer.json()).node_id == str(world.node.pk)
    assert world.node.gpus.count() == 2  # the GPUs it had stay, with their compute units


def test_a_revoked_credential_is_refused_by_the_agent_endpoints(
    world: Any, api: Any, agent_client: Any
) -> None:
    from apps.fleet.join import node_credential_revoke
    from apps.fleet.nodes import node_token_issue

    credential = node_token_issue(node=world.node)
    node_credential_revoke(node=world.node, actor="user:root")
    register = p.Register(node_name="gpu-001", hostname="h", agent_version="0.1")
    assert (
        agent_client(credential).post(p.REGISTER_PATH, register.to_dict(), format="json").status_code == 401
    )


def test_a_declared_node_of_another_pool_is_refused(world: Any, api: Any) -> None:
    from apps.fleet.join import node_credential_revoke
    from apps.inventory.models import Node

    l4 = Node.objects.get(name="l4-001")
    node_credential_revoke(node=l4, actor="user:root")
    _, raw = make_token(world)
    answer = join(api(), host(raw, name="l4-001"))
    assert answer.status_code == 403
    assert answer.json()["detail"] == "node eu-1/l4-001 belongs to pool 'l4-infer', not 'h100-train'"


# ---- join tokens: platform admins only -----------------------------------------------------------------


@pytest.mark.parametrize(
    "who",
    ["alice", "bob", "ada", "eve"],
    ids=["tenant A's member", "tenant B's member", "tenant A's admin", "an outsider"],
)
def test_only_platform_admins_see_make_or_revoke_join_tokens(world: Any, api: Any, who: str) -> None:
    token, _ = make_token(world)
    client = api(getattr(world, who))
    listed = client.get(TOKENS)
    assert listed.status_code == 403
    assert listed.json()["detail"] == "listing join tokens is for platform admins"
    made = client.post(TOKENS, {"pool": "h100-train"}, format="json")
    assert made.status_code == 403
    assert client.post(f"{TOKENS}{token.pk}/revoke/").status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None
    assert api().get(TOKENS).status_code in (401, 403)


def test_a_platform_admin_makes_lists_and_revokes_join_tokens(world: Any, api: Any) -> None:
    client = api(world.root)
    made = client.post(
        TOKENS, {"pool": "h100-train", "ttl_s": 600, "max_uses": 2, "requires_approval": True}, format="json"
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body["token"].startswith("wgj_") and body["prefix"] == body["token"][:12]
    assert (body["pool"], body["cluster"], body["max_uses"], body["uses"], body["state"]) == (
        "h100-train",
        "eu-1",
        2,
        0,
        "active",
    )
    assert body["requires_approval"] is True and body["created_by"] == "user:root"
    listed = client.get(TOKENS).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [row["name"] for row in rows] == [body["name"]]
    assert "token" not in rows[0]  # the secret is shown once
    revoked = client.post(f"{TOKENS}{body['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    refused = join(api(), host(body["token"]))
    assert refused.status_code == 403


def test_a_join_token_needs_a_pool_that_exists_and_a_lifetime(world: Any, api: Any) -> None:
    client = api(world.root)
    answer = client.post(TOKENS, {"pool": "nowhere"}, format="json")
    assert answer.status_code == 400 and answer.json()["pool"] == ["there is no pool 'nowhere'"]
    assert client.post(TOKENS, {"pool": "h100-train", "ttl_s": 0}, format="json").status_code == 400
    assert client.post(TOKENS, {"pool": "h100-train", "max_uses": 0}, format="json").status_code == 400


def test_a_pool_spanning_clusters_asks_which_one_and_names_them(world: Any, api: Any) -> None:
    # The demo's h100-train has nodes in eu-west-1 and us-east-1: docs/operations.md's
    # `whalegen create join-token --pool h100-train` must say which clusters to choose from.
    from apps.inventory.services import cluster_create, node_register, pool_create

    us = cluster_create(name="us-1", region="us-east")
    node_register(cluster=us, pool=world.h100, name="gpu-us-001", cpu_milli=96_000, mem_mib=1_048_576)
    client = api(world.root)
    asked = client.post(TOKENS, {"pool": "h100-train"}, format="json")
    assert asked.status_code == 400
    assert asked.json()["cluster"] == [
        "pool 'h100-train' has nodes in eu-1, us-1: name the one the new nodes join"
    ]
    made = client.post(TOKENS, {"pool": "h100-train", "cluster": "us-1"}, format="json")
    assert made.status_code == 201 and made.json()["cluster"] == "us-1"
    pool_create(name="empty")
    bare = client.post(TOKENS, {"pool": "empty"}, format="json").json()["cluster"]
    assert bare == ["pool 'empty' has no nodes yet: name the cluster the new nodes join (eu-1, us-1)"]
    # One cluster among the pool's nodes is taken without asking, as before.
    assert client.post(TOKENS, {"pool": "l4-infer"}, format="json").json()["cluster"] == "eu-1"


# ---- the stack's bootstrap token ----------------------------------------------------------------------


def test_the_bootstrap_token_makes_its_pool_and_is_refreshed_not_duplicated(db: None) -> None:
    from apps.fleet.join import join_token_bootstrap, join_token_revoke, node_join
    from apps.inventory.models import Pool

    secret = "compose-bootstrap-secret-0123456789"
    now = timezone.now()
    token, made = join_token_bootstrap(
        secret=secret, pool_name="sim", cluster_name="local", ttl_s=3600, now=now
    )
    assert made and token.max_uses is None and Pool.objects.get(name="sim").runtime == "process"
    again, made = join_token_bootstrap(
        secret=secret, pool_name="sim", cluster_name="local", ttl_s=3600, now=now + timedelta(hours=5)
    )
    assert not made and again.pk == token.pk and again.expires_at == now + timedelta(hours=6)
    joined = node_join(message=host(secret, pool="sim", name="sim-host"))
    assert joined.node.pool.name == "sim"
    join_token_revoke(token=again, actor="user:root")
    kept, _ = join_token_bootstrap(secret=secret, pool_name="sim", cluster_name="local", ttl_s=3600)
    assert kept.revoked_at is not None  # a revoked bootstrap token stays revoked
