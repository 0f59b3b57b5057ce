"""A compute unit's holder is no longer stored on the unit: it is the task whose live assignment lists the
unit (`apps.scheduling.holders`). The holder and version columns go, and the table's pages are filled
again (0006 left half of each page free for the bind updates there are no more of).

Going back restores each unit's holder from the live assignments.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def _fillfactor(value: int):  # type: ignore[no-untyped-def]
    def apply(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        # PostgreSQL only, as in 0006.
        if schema_editor.connection.vendor == "postgresql":
            table = apps.get_model("inventory", "ComputeUnit")._meta.db_table
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {value})")

    return apply


def _holders_back(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    unit = apps.get_model("inventory", "ComputeUnit")
    live = apps.get_model("scheduling", "Assignment").objects.filter(released_at__isnull=True)
    for task_id, unit_ids in live.values_list("task_id", "unit_ids"):
        unit.objects.filter(pk__in=unit_ids).update(task_id=task_id)


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0007_node_fillfactor"),
        ("scheduling", "0008_assignment_live_by_node"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, _holders_back),
        migrations.RemoveField(model_name="computeunit", name="task"),
        migrations.RemoveField(model_name="computeunit", name="version"),
        migrations.RunPython(_fillfactor(100), _fillfactor(50)),
    ]
