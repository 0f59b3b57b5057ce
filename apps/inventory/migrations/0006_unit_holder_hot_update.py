"""Binding a compute unit becomes a heap-only (HOT) update: no index and no constraint on the holder, and
half of each page of the table left free for the new row versions (see `ComputeUnit.task`)."""

import django.db.models.deletion
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# Every unit may flip free → held once between two prunings of its page, even when a cycle binds nearly
# every unit at once (the benchmark binds 98 %): that needs as much free room on a page as its rows take.
FILLFACTOR = 50


def _fillfactor(value: int):  # type: ignore[no-untyped-def]
    def apply(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        # PostgreSQL only: SQLite has no fillfactor, and its one writer makes no HOT question.
        if schema_editor.connection.vendor == "postgresql":
            table = apps.get_model("inventory", "ComputeUnit")._meta.db_table
            # Pages written from now on keep the room; existing ones gain it as vacuum frees space.
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {value})")

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0005_node_state_before_lost"),
        ("workloads", "0006_idle_reclaim"),
    ]

    operations = [
        migrations.AlterField(
            model_name="computeunit",
            name="task",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="compute_units",
                to="workloads.task",
            ),
        ),
        migrations.RunPython(_fillfactor(FILLFACTOR), _fillfactor(100)),
    ]
