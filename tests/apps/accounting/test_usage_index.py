"""A pool's budget read (`budgets_spent`, run by every cycle of a pool with a budget) reads the assignments
of its month through the `assignment_released_at` index, not the whole assignment history (issue #42).

Real PostgreSQL, with a history large enough that the planner's choice is the one production makes:
20,000 finished tasks with 60,000 assignments released in earlier years beside the hand-computed month
of `conftest.py`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounting.selectors import budgets_spent
from apps.scheduling.models import Assignment
from apps.workloads.models import Task
from tests.apps.accounting.conftest import NOW, VISION_DEC, Month

pytestmark = pytest.mark.django_db

HISTORY_TASKS, RUNS_PER_TASK = 20_000, 3


def _old_history(tasks: int, runs: int) -> None:
    """`tasks` finished tasks in the month's pool (copies of its first task), each with `runs`
    assignments held for an hour and released before 2026: a pool's history as years of work leave it."""
    tasks_table, table = Task._meta.db_table, Assignment._meta.db_table
    columns = ", ".join(f.column for f in Task._meta.concrete_fields if not f.primary_key)
    first = Assignment.objects.order_by("created_at").values_list("pk", "task_id")[0]
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE old_task AS WITH made AS (INSERT INTO {tasks_table} ({columns})"
            f" SELECT {columns} FROM {tasks_table}, generate_series(1, %s) WHERE id = %s RETURNING id)"
            " SELECT id, row_number() OVER (ORDER BY id) AS n FROM made",
            [tasks, first[1]],
        )
        cursor.execute(
            f"INSERT INTO {table} (task_id, node_id, unit_ids, cycle_id, created_at, released_at,"
            " release_reason, borrowed)"
            " SELECT t.id, a.node_id, a.unit_ids, NULL, s.at, s.at + INTERVAL '1 hour', 'finished', false"
            f" FROM {table} a, old_task t, generate_series(1, %s) r,"
            " LATERAL (SELECT TIMESTAMPTZ '2023-01-01' + (t.n * %s + r) * INTERVAL '10 minutes' AS at) s"
            " WHERE a.id = %s",
            [runs, runs, first[0]],
        )
        cursor.execute(f"ANALYZE {tasks_table}")
        cursor.execute(f"ANALYZE {table}")


def _plan_of_budget_read(month: Month) -> tuple[dict[int, Any], list[dict[str, Any]]]:
    """The answer of the budget read a cycle makes, and PostgreSQL's plan for the very query it sent."""
    with CaptureQueriesContext(connection) as queries:
        spent = budgets_spent(pool_id=month.h100.pk, limits={month.vision.pk: 1.0}, now=NOW)
    (usage,) = [q["sql"] for q in queries.captured_queries if Assignment._meta.db_table in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {usage}")
        plan = cursor.fetchone()[0]
    return spent, plan if isinstance(plan, list) else json.loads(plan)


def _scans_of(node: dict[str, Any], relation: str) -> list[str]:
    """Every scan of `relation` in the plan: its node type and index, e.g. 'Bitmap Index Scan on X'."""
    found = []
    if node.get("Relation Name") == relation or node.get("Index Name", "").startswith("assignment"):
        found.append(f"{node['Node Type']} on {node.get('Index Name') or node.get('Relation Name')}")
    for child in node.get("Plans", []):
        found += _scans_of(child, relation)
    return found


def test_the_budget_read_uses_the_released_at_index_and_skips_the_history(month: Month) -> None:
    _old_history(HISTORY_TASKS, RUNS_PER_TASK)
    spent, plan = _plan_of_budget_read(month)
    scans = _scans_of(plan[0]["Plan"], Assignment._meta.db_table)
    assert any("assignment_released_at" in scan for scan in scans), scans
    assert not any(scan.startswith("Seq Scan") for scan in scans), scans
    # The history is outside the month: the answer is the hand-computed December of `conftest.py`.
    assert spent[month.vision.pk].used_gpu_h == pytest.approx(VISION_DEC)


def test_without_the_index_the_same_read_scans_the_whole_history(month: Month) -> None:
    """The check above can fail: with the index dropped (in this test's transaction) the plan is a
    sequential scan of every assignment ever made."""
    _old_history(HISTORY_TASKS, RUNS_PER_TASK)
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX assignment_released_at")
    spent, plan = _plan_of_budget_read(month)
    scans = _scans_of(plan[0]["Plan"], Assignment._meta.db_table)
    assert not any("assignment_released_at" in scan for scan in scans), scans
    assert any(scan.startswith("Seq Scan") for scan in scans), scans
    assert spent[month.vision.pk].used_gpu_h == pytest.approx(VISION_DEC)
