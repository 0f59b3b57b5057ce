"""Migration 0005 moves every assignment's unit links into `Assignment.unit_ids`, and back."""

from __future__ import annotations

import pytest

from tests.apps.historical import historical_fleet, migrate_apps

# Inventory's migrations after 0007 build on scheduling's after 0005: they go back with it.
BEFORE = {"scheduling": "0004_pool_cycle_totals", "inventory": "0007_node_fillfactor"}
AFTER = {"scheduling": "0005_assignment_unit_ids", "inventory": "0007_node_fillfactor"}


@pytest.mark.django_db(transaction=True)
def test_links_become_unit_ids_and_come_back() -> None:
    old = migrate_apps(BEFORE)
    fleet = historical_fleet(old, "mig-test", units=3)
    units, node, Assignment = fleet.units, fleet.node, fleet.Assignment
    made = []
    for held in ([units[2], units[0]], [units[1]], []):
        assignment = Assignment.objects.create(task=fleet.task(), node=node)
        assignment.units.set(held)
        made.append((assignment.pk, sorted(u.pk for u in held)))

    new = migrate_apps(AFTER)
    Moved = new.get_model("scheduling", "Assignment")
    assert [(pk, sorted(Moved.objects.get(pk=pk).unit_ids)) for pk, _ in made] == made

    back = migrate_apps(BEFORE)
    Back = back.get_model("scheduling", "Assignment")
    assert [(pk, sorted(Back.objects.get(pk=pk).units.values_list("pk", flat=True))) for pk, _ in made] == (
        made
    )
    migrate_apps({})  # the rest of the suite expects the latest schema
