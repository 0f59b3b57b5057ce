"""A small fleet builder for cycle tests: pools over clusters, nodes with GPUs carved through the
inventory services, tenants with quotas and queues, and tasks submitted (and so charged) for real."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@dataclass
class Fleet:
    pool: Any
    clusters: dict[str, Any] = field(default_factory=dict)
    tenants: dict[str, Any] = field(default_factory=dict)
    user: Any = None
    _nodes: int = 0

    def cluster(self, name: str) -> Any:
        from apps.inventory.services import cluster_create

        if name not in self.clusters:
            self.clusters[name] = cluster_create(name=name)
        return self.clusters[name]

    def node(
        self,
        *,
        cluster: str = "eu-1",
        model: str = "A100-80GB",
        gpus: int = 1,
        mode: str = "whole",
        mig_layout: list[tuple[str, int]] | None = None,
        mps_shares: int = 0,
        cpu_milli: int = 64_000,
        mem_mib: int = 512 * 1024,
        name: str | None = None,
    ) -> Any:
        from apps.inventory.services import gpu_add, node_register

        self._nodes += 1
        node, _ = node_register(
            cluster=self.cluster(cluster),
            pool=self.pool,
            name=name or f"n{self._nodes:03d}",
            cpu_milli=cpu_milli,
            mem_mib=mem_mib,
        )
        for index in range(gpus):
            gpu_add(
                node=node,
                index=index,
                model=model,
                partition_mode=mode,
                mig_layout=mig_layout or (),
                mps_shares=mps_shares,
            )
        return node

    def tenant(self, slug: str, *, guaranteed: int, borrow: int = 0, priority: int = 0) -> Any:
        from apps.tenants.services import tenant_create
        from apps.workloads.services import queue_create, quota_set

        tenant = tenant_create(slug=slug, name=slug.title())
        quota_set(tenant=tenant, pool=self.pool, guaranteed_milli=guaranteed, borrow_limit_milli=borrow)
        queue_create(tenant=tenant, pool=self.pool, name="q", default_priority=priority)
        self.tenants[slug] = tenant
        return tenant

    def submit(self, slug: str, **request: Any) -> Any:
        from apps.workloads.services import TaskSubmission, task_submit

        task, _ = task_submit(
            tenant=self.tenants[slug], request=TaskSubmission(queue="q", **request), submitted_by=self.user
        )
        return task


@pytest.fixture
def fleet(db: None) -> Fleet:
    from apps.inventory.services import pool_create
    from tests.apps.factories import UserFactory

    return Fleet(pool=pool_create(name="train", runtime="process"), user=UserFactory(username="ci"))


def run(fleet: Fleet, *, minutes: float = 0, **kwargs: Any) -> Any:
    from apps.scheduling.services import cycle_run

    return cycle_run(pool_id=fleet.pool.pk, now=NOW + timedelta(minutes=minutes), **kwargs)


def start(task: Any) -> Any:
    """The agent's side, as far as these tests need it: an assigned task reports running."""
    from apps.workloads.services import task_transition

    task.refresh_from_db()
    return task_transition(task=task, to_state="running", actor="agent:test", reason="started", now=NOW)
