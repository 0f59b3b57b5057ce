"""`UnitIdsField`: a list of compute-unit ids kept in the row itself, portable between the databases.

Why not a many-to-many link table: a cycle binds tens of thousands of units, and each link row cost an
insert with three index entries plus two deferred foreign-key checks at COMMIT, a large part of a big
cycle's commit (docs/notes/cycle-speed.md, "Speed round 3"). The ids are a record of what the
assignment held, read back only as a whole; a unit a re-carve deletes keeps its history in
`accounting.HeldUnit`, as it did when the delete took the link row with it.

On PostgreSQL the column is `bigint[]` (readers `unnest` it); elsewhere (the embedded SQLite) it is the
JSON text of the list (readers use `json_each`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper


def _ids(value: Iterable[Any]) -> list[int]:
    return [int(v) for v in value]


class UnitIdsField(models.Field):  # type: ignore[type-arg]
    description = "compute-unit ids (bigint[] on PostgreSQL, JSON text elsewhere)"

    def db_type(self, connection: BaseDatabaseWrapper) -> str:
        return "bigint[]" if connection.vendor == "postgresql" else "text"

    def to_python(self, value: Any) -> list[int]:
        if value is None:
            return []
        if isinstance(value, str):
            return _ids(json.loads(value))
        return _ids(value)

    def from_db_value(self, value: Any, expression: Any, connection: BaseDatabaseWrapper) -> list[int]:
        return self.to_python(value)

    def get_db_prep_value(self, value: Any, connection: BaseDatabaseWrapper, prepared: bool = False) -> Any:
        ids = self.to_python(value)
        if connection.vendor == "postgresql":
            return ids  # psycopg sends a list of ints as an array
        return json.dumps(ids)

    def value_to_string(self, obj: models.Model) -> str:
        return json.dumps(self.value_from_object(obj))


def unit_ids_sql(column: str, vendor: str, alias: str = "l") -> tuple[str, str]:
    """(FROM-clause item, id expression): one row per id in `column`, for the database `vendor`."""
    if vendor == "postgresql":
        return f"LATERAL unnest({column}) AS {alias}(unit_id)", f"{alias}.unit_id"
    return f"json_each({column}) AS {alias}", f"{alias}.value"
