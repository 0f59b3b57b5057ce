"""Migration 0005 moves every assignment's unit links into `Assignment.unit_ids`, and back."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("scheduling", "0004_pool_cycle_totals")
AFTER = ("scheduling", "0005_assignment_unit_ids")


# Later migrations of other apps that build on scheduling's after 0005: they go back with it.
AFTER_SCHEDULING = {"inventory": ("inventory", "0007_node_fillfactor")}


def _migrate(scheduling: tuple[str, str] | None) -> Any:
    """Every other app at its latest migration, scheduling at `scheduling` (None: its latest too)."""
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    target = [leaf for leaf in leaves if leaf[0] != "scheduling" or scheduling is None]
    if scheduling is not None:
        target = [AFTER_SCHEDULING.get(app, (app, name)) for app, name in target]
        target.append(scheduling)
    executor.migrate(target)
    return MigrationExecutor(connection).loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)
def test_links_become_unit_ids_and_come_back() -> None:
    old = _migrate(BEFORE)
    Pool, Cluster, Node = (old.get_model("inventory", m) for m in ("Pool", "Cluster", "Node"))
    Gpu, ComputeUnit = old.get_model("inventory", "Gpu"), old.get_model("inventory", "ComputeUnit")
    Tenant, Queue = old.get_model("tenants", "Tenant"), old.get_model("workloads", "Queue")
    Task, Assignment = old.get_model("workloads", "Task"), old.get_model("scheduling", "Assignment")
    pool = Pool.objects.create(name="mig-test")
    node = Node.objects.create(
        cluster=Cluster.objects.create(name="mig-test"), pool=pool, name="n", cpu_milli=1000, mem_mib=1024
    )
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-mig-test", model="H100-80GB", mem_mib=81920)
    units = [ComputeUnit.objects.create(gpu=gpu, kind="mps", gpu_milli=250, mem_mib=20480) for _ in range(3)]
    tenant = Tenant.objects.create(slug="mig-test", name="mig test")
    queue = Queue.objects.create(tenant=tenant, pool=pool, name="q")
    made = []
    for held in ([units[2], units[0]], [units[1]], []):
        task = Task.objects.create(tenant=tenant, queue=queue, pool=pool, priority=0)
        assignment = Assignment.objects.create(task=task, node=node)
        assignment.units.set(held)
        made.append((assignment.pk, sorted(u.pk for u in held)))

    new = _migrate(AFTER)
    Moved = new.get_model("scheduling", "Assignment")
    assert [(pk, sorted(Moved.objects.get(pk=pk).unit_ids)) for pk, _ in made] == made

    back = _migrate(BEFORE)
    Back = back.get_model("scheduling", "Assignment")
    assert [(pk, sorted(Back.objects.get(pk=pk).units.values_list("pk", flat=True))) for pk, _ in made] == (
        made
    )
    _migrate(None)  # the rest of the suite expects the latest schema
