"""The quota list's figures count only live tasks, and what it costs follows them, not the history: each
figure is a subquery per quota over the tenant's tasks in the states it counts (before, an aggregate over
every task of the pool joined in: 160 quotas with 84,000 tasks took seconds a call)."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.tenants.selectors import Access
from apps.workloads.models import Task
from apps.workloads.selectors import quota_list
from tests.apps.factories import TaskFactory

ADMIN = Access(platform_admin=True)
FIGURES = ("held_milli", "held_mem_mib", "waiting_milli", "tasks_pending", "tasks_admitted")
# Neither held nor waiting: ended, or between a lost or preempted run and the return to pending.
LIVE = (Task.State.PENDING, Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING)
COUNTED_NOWHERE = tuple(s for s in Task.State if s not in LIVE)


def _figures() -> dict[tuple[str, str], tuple[int, ...]]:
    rows = quota_list(access=ADMIN)
    return {(q.tenant.slug, q.pool.name): tuple(getattr(q, f) for f in FIGURES) for q in rows}


def _history(world: Any, *, per_state: int) -> None:
    """Tasks of every tenant and pool in every state that counts in no figure, big asks included."""
    for queue in (world.queue_a, world.queue_a_l4, world.queue_b):
        for state in COUNTED_NOWHERE:
            big = {"gpu_count": 8, "gpu_milli": 1000, "gpu_mem_mib": 80_000}
            TaskFactory.create_batch(per_state, queue=queue, state=state, **big)


def _tasks_read(sql: str, params: Any) -> int:
    """Rows of the task table the query's plan touched, kept or filtered out, over all its loops."""

    def walk(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Relation Name") == Task._meta.db_table:
            seen = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            own = (seen + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
        return own + sum(walk(child) for child in node.get("Plans", []))

    with connection.cursor() as cursor:
        # Analysed, as autovacuum keeps a live plane's tables (never analysed, the planner guesses a row
        # per table and any index will do). And the toy tables here fit a page or two, where it may scan
        # them whole; at a plane's size it takes the (tenant, state) index (EXPLAIN at 84,000 tasks in
        # docs/notes/submission-speed.md), so scans are discouraged: the test measures what the query
        # can be answered from, not a toy's plan.
        cursor.execute(f"ANALYZE {Task._meta.db_table}")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()
        cursor.execute("RESET enable_seqscan")
    return walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])


def test_figures_count_live_tasks_only_with_finished_and_cancelled_ones_present(world: Any) -> None:
    # Besides the world's two pending one-GPU tasks (A's and B's in h100):
    S = Task.State
    TaskFactory(queue=world.queue_a, state=S.ADMITTED, gpu_count=2, gpu_milli=1000, gpu_mem_mib=40_000)
    TaskFactory(queue=world.queue_a, state=S.ASSIGNED, gpu_milli=250, gpu_mem_mib=10_000)
    TaskFactory(queue=world.queue_a, state=S.RUNNING, gpu_milli=500)  # no memory stated: none counted
    TaskFactory(queue=world.queue_a, gpu_count=4, gpu_milli=1000)  # pending
    TaskFactory(queue=world.queue_a_l4, state=S.RUNNING, gpu_milli=1000, gpu_mem_mib=24_000)
    TaskFactory(queue=world.queue_b, state=S.RUNNING, gpu_count=3, gpu_milli=1000)
    _history(world, per_state=2)
    assert _figures() == {
        # held milli, held MiB, waiting milli, pending, admitted
        ("speech", "h100-train"): (3000, 0, 1000, 1, 1),
        ("vision", "h100-train"): (2000 + 250 + 500, 80_000 + 10_000, 1000 + 4000, 2, 3),
        ("vision", "l4-infer"): (1000, 24_000, 0, 0, 1),
    }


def test_a_quota_whose_tasks_all_ended_holds_and_waits_for_zero_not_null(world: Any) -> None:
    Task.objects.update(state=Task.State.CANCELLED)
    _history(world, per_state=1)
    assert set(_figures().values()) == {(0, 0, 0, 0, 0)}


def test_the_list_reads_no_more_queries_and_no_ended_task_with_a_longer_history(world: Any) -> None:
    TaskFactory(queue=world.queue_a, state=Task.State.RUNNING, gpu_milli=500)
    sql, params = quota_list(access=ADMIN).query.sql_with_params()

    def queries_made() -> int:
        with CaptureQueriesContext(connection) as queries:
            list(quota_list(access=ADMIN))
        return len(queries.captured_queries)

    before, figures = queries_made(), _figures()
    _history(world, per_state=40)  # 40 × 5 states × 3 quotas: 600 ended tasks against 3 live ones
    assert queries_made() == before == 1  # tenants and pools joined, every figure a subquery
    assert _figures() == figures
    # Each figure of each quota may read every live task at most (the live ones are 3 here), never the
    # ended ones: the join this replaced read all 600 of them, for every quota of their pool.
    live = Task.objects.exclude(state__in=COUNTED_NOWHERE).count()
    assert _tasks_read(sql, params) <= live * len(FIGURES) * len(figures) < 600
