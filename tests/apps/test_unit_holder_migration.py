"""Migration inventory 0008 drops the unit's holder column (the holder is the live assignment listing the
unit); going back fills the column again from the live assignments."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.apps.historical import historical_fleet, migrate_apps

BEFORE = {"inventory": "0007_node_fillfactor"}
AFTER = {"inventory": "0008_unit_holder_from_assignments"}


@pytest.mark.django_db(transaction=True)
def test_going_back_gives_each_unit_the_task_of_its_live_assignment() -> None:
    new = migrate_apps(AFTER)
    fleet = historical_fleet(new, "holder-mig", units=4)
    units, node, gpu, Assignment = fleet.units, fleet.node, fleet.gpu, fleet.Assignment
    live, done = fleet.task(), fleet.task()
    Assignment.objects.create(task=live, node=node, unit_ids=[units[2].pk, units[0].pk])
    Assignment.objects.create(
        task=done,
        node=node,
        unit_ids=[units[1].pk],
        released_at="2026-12-01T00:00:00Z",
        release_reason="ended",
    )

    old = migrate_apps(BEFORE)
    held = dict(
        old.get_model("inventory", "ComputeUnit").objects.filter(gpu_id=gpu.pk).values_list("pk", "task_id")
    )
    assert held == {units[0].pk: live.pk, units[1].pk: None, units[2].pk: live.pk, units[3].pk: None}

    migrate_apps({})  # the rest of the suite expects the latest schema
    with connection.cursor() as cursor:
        described = connection.introspection.get_table_description(cursor, "inventory_computeunit")
    columns = {column.name for column in described}
    assert not columns & {"task_id", "version"}
