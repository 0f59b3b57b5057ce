"""Rows made through historical models (a migration test's `apps` at some state): one node with one GPU
of MPS units, and a tenant's queue into its pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@dataclass
class HistoricalFleet:
    pool: Any
    node: Any
    gpu: Any
    units: list[Any]
    queue: Any
    Task: Any
    Assignment: Any

    def task(self) -> Any:
        return self.Task.objects.create(
            tenant=self.queue.tenant, queue=self.queue, pool=self.pool, priority=0
        )


def historical_fleet(apps: Any, name: str, *, units: int) -> HistoricalFleet:
    Pool, Cluster, Node = (apps.get_model("inventory", m) for m in ("Pool", "Cluster", "Node"))
    Gpu, ComputeUnit = apps.get_model("inventory", "Gpu"), apps.get_model("inventory", "ComputeUnit")
    Tenant, Queue = apps.get_model("tenants", "Tenant"), apps.get_model("workloads", "Queue")
    pool = Pool.objects.create(name=name)
    node = Node.objects.create(
        cluster=Cluster.objects.create(name=name), pool=pool, name="n", cpu_milli=1000, mem_mib=1024
    )
    gpu = Gpu.objects.create(node=node, index=0, uuid=f"GPU-{name}", model="H100-80GB", mem_mib=81920)
    made = [
        ComputeUnit.objects.create(gpu=gpu, kind="mps", gpu_milli=250, mem_mib=20480) for _ in range(units)
    ]
    queue = Queue.objects.create(tenant=Tenant.objects.create(slug=name, name=name), pool=pool, name="q")
    return HistoricalFleet(
        pool=pool,
        node=node,
        gpu=gpu,
        units=made,
        queue=queue,
        Task=apps.get_model("workloads", "Task"),
        Assignment=apps.get_model("scheduling", "Assignment"),
    )


def migrate_apps(at: Mapping[str, str]) -> Any:
    """Every app at its latest migration but those named in `at` (app → migration name), which go there;
    returns the historical models at that state. An app whose latest migration needs a later one of a
    named app (a newer app built on today's inventory) goes back to its last migration that does not."""
    executor = MigrationExecutor(connection)
    graph = executor.loader.graph
    named = {(app, name) for app, name in at.items()}
    # The migrations of the named apps after their targets: no other app's target may need them.
    later = {
        node
        for app, name in at.items()
        for node in graph.forwards_plan(graph.leaf_nodes(app)[0])
        if node[0] == app and node not in graph.forwards_plan((app, name))
    }
    target = []
    for app, leaf in graph.leaf_nodes():
        if app in at:
            continue
        node: tuple[str, str] | None = (app, leaf)
        while node is not None and later & set(graph.forwards_plan(node)):
            parents = [p for p in graph.node_map[node].parents if p.key[0] == app]
            node = parents[0].key if parents else None
        target.append(node if node is not None else (app, None))
    target += sorted(named)
    executor.migrate(target)
    return MigrationExecutor(connection).loader.project_state(target).apps
