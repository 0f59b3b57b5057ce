"""Store new tasks and their first events in two statements, whatever the batch's size; read a
submission's queue in one fixed statement.

Why not `Model.save` / `bulk_create`: Django prepares every value of every row through its field
machinery (`pre_save`, `get_db_prep_save`) and compiles the INSERT each time; for a bulk submission of
100 tasks × 38 columns that was half of the request's CPU (docs/api.md, "Submission speed"). Here each
column is one Python list, sent as one array parameter, and PostgreSQL unnests the arrays into rows;
the statement text is built once per process from the model's own fields, so a column added to `Task`
is stored here without a change.

What the ORM would have done and is done here too: `created_at` / `updated_at` set (one instant for
the batch), ids read back into the objects (RETURNING, in insertion order, which PostgreSQL keeps for
INSERT … SELECT FROM unnest; Django's own bulk_create relies on the same), the objects marked saved.
Constraint violations surface as Django's `IntegrityError` (the cursor is Django's). No signal is sent,
as with bulk_create; nothing listens for Task or TaskEvent saves. On SQLite (the embedded default)
the same rows are stored through `bulk_create`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection, models
from django.utils import timezone

from apps.inventory.models import Pool
from apps.workloads.models import Queue, Task, TaskEvent


def _as_text(value: Any) -> Any:
    # TextChoices members are str subclasses; send their plain value.
    return value if value is None or type(value) is str else str(value)


@cache
def _task_statement() -> tuple[str, list[tuple[str, Callable[[Any], Any] | None]]]:
    """The INSERT for `Task` and, per column, the attribute it reads and how its value is sent."""
    columns, arrays, picks = [], [], []
    for field in Task._meta.concrete_fields:
        if field.primary_key:
            continue
        cast = field.cast_db_type(connection)
        convert: Callable[[Any], Any] | None = None
        if isinstance(field, models.JSONField):
            # Sent as text and parsed by PostgreSQL: the same JSON Django would have sent.
            convert, cast = json.dumps, "text"
        elif isinstance(field, models.CharField):
            convert = _as_text
        columns.append(connection.ops.quote_name(field.column))
        arrays.append(f"%s::{cast}[]")
        picks.append((field.attname, convert))
    select = ", ".join(f"c{i}::jsonb" if picks[i][1] is json.dumps else f"c{i}" for i in range(len(columns)))
    names = ", ".join(f"c{i}" for i in range(len(columns)))
    sql = (
        f"INSERT INTO {connection.ops.quote_name(Task._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {select} FROM unnest({', '.join(arrays)}) AS t({names}) RETURNING id"
    )
    return sql, picks


def _event_statement() -> str:
    table = connection.ops.quote_name(TaskEvent._meta.db_table)
    return (
        f"INSERT INTO {table} (task_id, created_at, from_state, to_state, actor, reason) "
        "SELECT t, %s, '', %s, %s, %s FROM unnest(%s::bigint[]) AS t"
    )


def tasks_insert(tasks: Sequence[Task], *, actor: str, reason: str, now: datetime | None = None) -> None:
    """INSERT `tasks` (unsaved) and one `"" → pending` event each (by `actor`, saying `reason`); set
    their ids, timestamps and saved state. Must run inside the submission's transaction."""
    if not tasks:
        return
    now = now or timezone.now()
    if connection.vendor != "postgresql":  # the embedded default (SQLite) has no arrays to unnest
        _orm_insert(tasks, actor=actor, reason=reason)
        return
    for task in tasks:
        task.created_at = task.updated_at = now
    sql, picks = _task_statement()
    params = []
    for attname, convert in picks:
        values = [getattr(task, attname) for task in tasks]
        params.append(values if convert is None else [convert(v) for v in values])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
        for task, pk in zip(tasks, ids, strict=True):
            task.pk = pk
            task._state.adding = False
            task._state.db = connection.alias
        cursor.execute(_event_statement(), [now, Task.State.PENDING.value, actor, reason, ids])


def _orm_insert(tasks: Sequence[Task], *, actor: str, reason: str) -> None:
    Task.objects.bulk_create(tasks)
    TaskEvent.objects.bulk_create(
        [
            TaskEvent(task=task, from_state="", to_state=Task.State.PENDING, actor=actor, reason=reason)
            for task in tasks
        ]
    )


@cache
def _queue_statement() -> tuple[str, list[str], list[str]]:
    queue_fields = [f.attname for f in Queue._meta.concrete_fields]
    pool_fields = [f.attname for f in Pool._meta.concrete_fields]
    quote = connection.ops.quote_name
    columns = [f"q.{quote(f.column)}" for f in Queue._meta.concrete_fields] + [
        f"p.{quote(f.column)}" for f in Pool._meta.concrete_fields
    ]
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(Queue._meta.db_table)} q "
        f"JOIN {quote(Pool._meta.db_table)} p ON p.id = q.pool_id WHERE q.tenant_id = %s AND q.name = %s"
    )
    return sql, queue_fields, pool_fields


def queue_get_for_submission(*, tenant_id: int, name: str) -> Queue | None:
    """The tenant's queue called `name` with its pool loaded, or None: one fixed statement, written
    once instead of compiled by the ORM on every submission. (tenant, name) is unique."""
    if connection.vendor != "postgresql":  # SQLite's values need Django's converters: use the ORM
        return Queue.objects.select_related("pool").filter(tenant_id=tenant_id, name=name).first()
    sql, queue_fields, pool_fields = _queue_statement()
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant_id, name])
        row = cursor.fetchone()
    if row is None:
        return None
    queue = Queue.from_db(connection.alias, queue_fields, row[: len(queue_fields)])
    pool_values = [
        _decoded(field, value)
        for field, value in zip(Pool._meta.concrete_fields, row[len(queue_fields) :], strict=True)
    ]
    queue._state.fields_cache["pool"] = Pool.from_db(connection.alias, pool_fields, pool_values)
    return queue


def _decoded(field: models.Field, value: Any) -> Any:
    """A raw column value as the ORM would give it: psycopg hands Django's jsonb columns over as text,
    which JSONField's converter (not run on raw rows) parses (the pool's allowed image prefixes)."""
    if isinstance(field, models.JSONField) and isinstance(value, str):
        return json.loads(value)
    return value
