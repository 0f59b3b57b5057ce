"""Who holds a compute unit: the task whose live (unreleased) assignment lists it.

The holder is not stored on the unit. A task's assignment already names its units (`unit_ids`), and a
second copy on each unit row cost the cycle one UPDATE per unit bound (60,884 in the benchmark's cycle,
a third of its database time) and could drift from the first. Binding is guarded by the node instead:
the cycle binds units only on nodes it has locked and found at the version its snapshot saw, and every
writer that binds, deletes or re-carves units raises that version under the same lock
(docs/notes/cycle-speed.md, "Speed round 8").

Readers that show or count held units ask here; the snapshot joins the same rows in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection
from django.db.models import BooleanField, QuerySet
from django.db.models.expressions import RawSQL

from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.fields import unit_ids_sql
from apps.scheduling.models import Assignment
from apps.workloads.models import Task


def unit_holders(*, node_ids: Iterable[int] | None = None, pool_id: int | None = None) -> dict[int, int]:
    """Unit id → the task holding it, for the live assignments of `node_ids` or of `pool_id`'s nodes (of
    every node when neither is given). Ids of units deleted since (a re-carve) may appear; look units up
    by id, never iterate this to find units."""
    live = Assignment.objects.filter(released_at__isnull=True)
    if node_ids is not None:
        live = live.filter(node_id__in=list(node_ids))
    if pool_id is not None:
        live = live.filter(node__pool_id=pool_id)
    rows = live.values_list("task_id", "unit_ids")
    return {unit_id: task_id for task_id, unit_ids in rows for unit_id in unit_ids}


def live_holders_sql(*, of_pool: bool = False) -> str:
    """A subquery of (unit_id, task_id): one row per unit a live assignment lists, for joining to the units
    table in raw SQL (`LEFT JOIN (…) h ON h.unit_id = u.id`). With `of_pool`, only the assignments of one
    pool's nodes, the pool's id as the query's `%(pool)s` parameter. On PostgreSQL it unnests each
    assignment's `bigint[]`; on the embedded SQLite it walks the JSON text."""
    table = Assignment._meta.db_table
    item, unit_id = unit_ids_sql("a.unit_ids", connection.vendor, alias="held")
    where = "a.released_at IS NULL"
    if of_pool:
        where += f" AND a.node_id IN (SELECT n.id FROM {Node._meta.db_table} n WHERE n.pool_id = %(pool)s)"
    return f"SELECT {unit_id} AS unit_id, a.task_id AS task_id FROM {table} a, {item} WHERE {where}"


def holder_sql(*, unit: str, gpu: str, select: str = "a.task_id") -> str:
    """A scalar subquery for an ORM `RawSQL` annotation or a raw query: `select` (over the live assignment
    `a` and its task `t`, e.g. `t.tenant_id`) of the task holding the unit whose id and GPU id are the outer
    query's SQL expressions `unit` and `gpu`; NULL when the unit is free. It looks only at the live
    assignments of the GPU's node (the partial index `assignment_live_by_node`)."""
    assignments, tasks = Assignment._meta.db_table, Task._meta.db_table
    if connection.vendor == "postgresql":
        listed = f"{unit} = ANY(a.unit_ids)"
    else:
        listed = f"EXISTS (SELECT 1 FROM json_each(a.unit_ids) AS l WHERE l.value = {unit})"
    node = f"(SELECT g.node_id FROM {Gpu._meta.db_table} g WHERE g.id = {gpu})"
    return (
        f"(SELECT {select} FROM {assignments} a JOIN {tasks} t ON t.id = a.task_id"
        f" WHERE a.released_at IS NULL AND a.node_id = {node} AND {listed} LIMIT 1)"
    )


def gpu_units_held(*, gpu_id: int) -> bool:
    """Whether a live assignment holds any unit of the GPU (checked before re-carving it, under its node's
    lock): one query, the holder subquery of each of the GPU's units."""
    table = connection.ops.quote_name(ComputeUnit._meta.db_table)
    holder = holder_sql(unit=f"{table}.id", gpu=f"{table}.gpu_id")
    held = RawSQL(f"{holder} IS NOT NULL", (), output_field=BooleanField())
    return ComputeUnit.objects.filter(gpu_id=gpu_id).filter(held).exists()


def with_holders(units: QuerySet[ComputeUnit]) -> QuerySet[ComputeUnit]:
    """`units` annotated with `holder_id` and `holder_tenant_id` (NULL when free): two subqueries per unit
    over the live assignments of its node, in the same query."""
    table = connection.ops.quote_name(ComputeUnit._meta.db_table)
    unit, gpu = f"{table}.id", f"{table}.gpu_id"
    return units.annotate(
        holder_id=RawSQL(holder_sql(unit=unit, gpu=gpu), ()),
        holder_tenant_id=RawSQL(holder_sql(unit=unit, gpu=gpu, select="t.tenant_id"), ()),
    )
