"""Shared fixtures. Database fixtures import Django models lazily so pure-core tests never need them.

The personas follow healthchecks' fixed test users: `alice` (member of tenant A), `bob` (member of
tenant B), `eve` (signed in, member of nothing) and `root` (platform admin, member of nothing), plus
`vic` (viewer in A) and `ada` (admin of A) for role checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing() -> Iterator[None]:
    """Passwords set in tests are hashed with MD5, not PBKDF2's million rounds (~0.5 s of CPU per hash,
    paid again on every login check). Logins still fail on a wrong password and pass on the right one;
    the hash's strength is Django's, not what these tests check. Processes the tests start (the demo,
    the fault and ops stacks) keep the production hasher."""
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@dataclass
class World:
    tenant_a: Any
    tenant_b: Any
    alice: Any
    bob: Any
    eve: Any
    root: Any
    vic: Any
    ada: Any
    h100: Any  # pool with MIG-capable H100s
    l4: Any  # pool of L4s: no MIG
    queue_a: Any  # A's queue into h100
    queue_a_l4: Any
    queue_b: Any  # B's queue into h100
    quota_a: Any
    quota_b: Any
    node: Any
    task_a: Any  # a pending task of A (made through submission; pending, it holds no quota)
    task_b: Any


@pytest.fixture
def world(db: None) -> World:
    from apps.inventory.models import Gpu
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.tenants.models import Membership
    from apps.tenants.services import membership_set, tenant_create
    from apps.workloads.services import TaskSubmission, queue_create, quota_set, task_submit
    from tests.apps.factories import UserFactory

    org = tenant_create(slug="acme", name="Acme", kind="org")
    tenant_a = tenant_create(slug="vision", name="Vision", parent=org)
    tenant_b = tenant_create(slug="speech", name="Speech", parent=org)
    users = {name: UserFactory(username=name) for name in ["alice", "bob", "eve", "vic", "ada"]}
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    membership_set(user=users["alice"], tenant=tenant_a, role=Membership.Role.MEMBER)
    membership_set(user=users["vic"], tenant=tenant_a, role=Membership.Role.VIEWER)
    membership_set(user=users["ada"], tenant=tenant_a, role=Membership.Role.ADMIN)
    membership_set(user=users["bob"], tenant=tenant_b, role=Membership.Role.MEMBER)

    cluster = cluster_create(name="eu-1", region="eu-west")
    h100 = pool_create(name="h100-train", runtime="process")
    l4 = pool_create(name="l4-infer", runtime="process")
    node, _ = node_register(cluster=cluster, pool=h100, name="gpu-001", cpu_milli=96_000, mem_mib=1_048_576)
    gpu_add(
        node=node,
        index=0,
        model="H100-80GB",
        partition_mode=Gpu.PartitionMode.MIG,
        mig_layout=[("3g.40gb", 0)],
    )
    gpu_add(node=node, index=1, model="H100-80GB")
    l4_node, _ = node_register(cluster=cluster, pool=l4, name="l4-001", cpu_milli=32_000, mem_mib=262_144)
    gpu_add(node=l4_node, index=0, model="L4")

    quota_a = quota_set(tenant=tenant_a, pool=h100, guaranteed_milli=4000, borrow_limit_milli=2000)
    quota_set(tenant=tenant_a, pool=l4, guaranteed_milli=2000)
    quota_b = quota_set(tenant=tenant_b, pool=h100, guaranteed_milli=2000)
    queue_a = queue_create(tenant=tenant_a, pool=h100, name="train", default_priority=5)
    queue_a_l4 = queue_create(tenant=tenant_a, pool=l4, name="infer")
    queue_b = queue_create(tenant=tenant_b, pool=h100, name="train")
    task_a, _ = task_submit(
        tenant=tenant_a, request=TaskSubmission(queue="train"), submitted_by=users["alice"]
    )
    task_b, _ = task_submit(tenant=tenant_b, request=TaskSubmission(queue="train"), submitted_by=users["bob"])
    quota_a.refresh_from_db()
    quota_b.refresh_from_db()
    return World(
        tenant_a=tenant_a,
        tenant_b=tenant_b,
        root=root,
        h100=h100,
        l4=l4,
        queue_a=queue_a,
        queue_a_l4=queue_a_l4,
        queue_b=queue_b,
        quota_a=quota_a,
        quota_b=quota_b,
        node=node,
        task_a=task_a,
        task_b=task_b,
        **users,
    )


@pytest.fixture
def api():
    """`api(user)` → a DRF test client signed in as `user` (as a browser session would be)."""
    from rest_framework.test import APIClient

    def make(user: Any = None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user=user)
        return client

    return make
