"""Migration inventory 0008 drops the unit's holder column (the holder is the live assignment listing the
unit); going back fills the column again from the live assignments."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("inventory", "0007_node_fillfactor")
AFTER = ("inventory", "0008_unit_holder_from_assignments")


def _migrate(inventory: tuple[str, str] | None) -> Any:
    """Every other app at its latest migration, inventory at `inventory` (None: its latest too); the
    workloads migration after 0008 depends on it and goes back with it."""
    executor = MigrationExecutor(connection)
    target = [leaf for leaf in executor.loader.graph.leaf_nodes() if leaf[0] != "inventory"]
    if inventory is not None:
        before_0008 = ("workloads", "0010_unindexed_submitter_and_event_time")
        target = [before_0008 if app == "workloads" else (app, name) for app, name in target]
        target.append(inventory)
    else:
        target.append(("inventory", executor.loader.graph.leaf_nodes("inventory")[0][1]))
    executor.migrate(target)
    return MigrationExecutor(connection).loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)
def test_going_back_gives_each_unit_the_task_of_its_live_assignment() -> None:
    new = _migrate(AFTER)
    Pool, Cluster, Node = (new.get_model("inventory", m) for m in ("Pool", "Cluster", "Node"))
    Gpu, ComputeUnit = new.get_model("inventory", "Gpu"), new.get_model("inventory", "ComputeUnit")
    Tenant, Queue = new.get_model("tenants", "Tenant"), new.get_model("workloads", "Queue")
    Task, Assignment = new.get_model("workloads", "Task"), new.get_model("scheduling", "Assignment")
    pool = Pool.objects.create(name="holder-mig")
    node = Node.objects.create(
        cluster=Cluster.objects.create(name="holder-mig"), pool=pool, name="n", cpu_milli=1000, mem_mib=1024
    )
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-holder-mig", model="H100-80GB", mem_mib=81920)
    units = [ComputeUnit.objects.create(gpu=gpu, kind="mps", gpu_milli=250, mem_mib=20480) for _ in range(4)]
    tenant = Tenant.objects.create(slug="holder-mig", name="holder mig")
    queue = Queue.objects.create(tenant=tenant, pool=pool, name="q")
    live, done = (Task.objects.create(tenant=tenant, queue=queue, pool=pool, priority=0) for _ in range(2))
    Assignment.objects.create(task=live, node=node, unit_ids=[units[2].pk, units[0].pk])
    Assignment.objects.create(
        task=done,
        node=node,
        unit_ids=[units[1].pk],
        released_at="2026-12-01T00:00:00Z",
        release_reason="ended",
    )

    old = _migrate(BEFORE)
    held = dict(
        old.get_model("inventory", "ComputeUnit").objects.filter(gpu_id=gpu.pk).values_list("pk", "task_id")
    )
    assert held == {units[0].pk: live.pk, units[1].pk: None, units[2].pk: live.pk, units[3].pk: None}

    _migrate(None)  # the rest of the suite expects the latest schema
    with connection.cursor() as cursor:
        described = connection.introspection.get_table_description(cursor, "inventory_computeunit")
    columns = {column.name for column in described}
    assert not columns & {"task_id", "version"}
