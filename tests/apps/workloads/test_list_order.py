"""Quota and queue lists come in name order even when PostgreSQL aggregates by hashing: Django leaves
Meta.ordering out of a GROUP BY query, so the order has to be named (the dashboard's quota rows swapped
in a CI run)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from apps.tenants.selectors import Access
from apps.workloads.selectors import queue_list_with_counts, quota_list
from apps.workloads.services import queue_create, quota_set


def _hash_aggregates_only() -> None:
    # For the rest of the test's transaction: no sort step, so a GROUP BY is a hash aggregate, whose rows
    # come in no particular order unless the query asks for one.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")


def test_quotas_come_by_tenant_then_pool_name(world: Any) -> None:
    from apps.inventory.services import pool_create

    # Made in reverse name order, so insertion order is not name order.
    for name in ("zz-pool", "mm-pool", "aa-pool"):
        pool = pool_create(name=name, runtime="process")
        quota_set(tenant=world.tenant_b, pool=pool, guaranteed_milli=1000)
    _hash_aggregates_only()
    rows = [(q.tenant.slug, q.pool.name) for q in quota_list(access=Access(platform_admin=True))]
    assert rows == sorted(rows), rows


def test_queues_with_counts_come_by_tenant_then_name(world: Any) -> None:
    for name in ("zz", "mm", "aa"):
        queue_create(tenant=world.tenant_b, pool=world.h100, name=name)
    _hash_aggregates_only()
    rows = [(q.tenant.slug, q.name) for q in queue_list_with_counts(access=Access(platform_admin=True))]
    assert rows == sorted(rows), rows
