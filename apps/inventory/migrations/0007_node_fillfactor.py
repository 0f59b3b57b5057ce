"""Raising a node's version becomes a heap-only (HOT) update: half of each page of the node table is
left free for the new row versions.

Every cycle raises the version of each node it places on (the benchmark's: all 1,213 nodes), and heartbeats
and drains write node rows too. None of those columns is indexed, but with full pages (the default
fillfactor 100) every new version went to another page with an entry in each of the table's ten indexes:
11 WAL records per node per cycle. The table is small (a row per host), so the room costs little.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

FILLFACTOR = 50


def _fillfactor(value: int):  # type: ignore[no-untyped-def]
    def apply(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        # PostgreSQL only, as for the unit table (0006).
        if schema_editor.connection.vendor == "postgresql":
            table = apps.get_model("inventory", "Node")._meta.db_table
            # Pages written from now on keep the room; existing ones gain it as vacuum frees space.
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {value})")

    return apply


class Migration(migrations.Migration):
    dependencies = [("inventory", "0006_unit_holder_hot_update")]

    operations = [migrations.RunPython(_fillfactor(FILLFACTOR), _fillfactor(100))]
