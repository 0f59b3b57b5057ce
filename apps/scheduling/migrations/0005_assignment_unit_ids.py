"""Assignment.units (a link table) → Assignment.unit_ids (the ids in the row): the links are copied over."""

from django.db import migrations

import apps.scheduling.fields


def copy_links(apps, schema_editor):
    Assignment = apps.get_model("scheduling", "Assignment")
    through = Assignment.units.through
    if schema_editor.connection.vendor == "postgresql":
        # One statement: a fleet's history can hold millions of links.
        schema_editor.execute(
            f"UPDATE {Assignment._meta.db_table} AS a SET unit_ids = l.ids FROM ("
            f" SELECT assignment_id, array_agg(computeunit_id ORDER BY computeunit_id) AS ids"
            f" FROM {through._meta.db_table} GROUP BY assignment_id) AS l WHERE a.id = l.assignment_id"
        )
        return
    ids: dict[int, list[int]] = {}
    for assignment_id, unit_id in through.objects.order_by("computeunit_id").values_list(
        "assignment_id", "computeunit_id"
    ):
        ids.setdefault(assignment_id, []).append(unit_id)
    for assignment_id, unit_ids in ids.items():
        Assignment.objects.filter(pk=assignment_id).update(unit_ids=unit_ids)


def copy_back(apps, schema_editor):
    Assignment = apps.get_model("scheduling", "Assignment")
    ComputeUnit = apps.get_model("inventory", "ComputeUnit")
    through = Assignment.units.through
    present = set(ComputeUnit.objects.values_list("pk", flat=True))
    through.objects.bulk_create(
        through(assignment_id=pk, computeunit_id=unit_id)
        for pk, unit_ids in Assignment.objects.values_list("pk", "unit_ids")
        for unit_id in unit_ids
        if unit_id in present  # the link table held only units that still exist
    )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0004_pool_cycle_totals"),
    ]

    operations = [
        migrations.AddField(
            model_name="assignment",
            name="unit_ids",
            field=apps.scheduling.fields.UnitIdsField(blank=True, default=list),
        ),
        migrations.RunPython(copy_links, copy_back),
        migrations.RemoveField(model_name="assignment", name="units"),
    ]
