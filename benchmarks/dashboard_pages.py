"""Server time of every dashboard page, on the demo fleet and on a 1,000-node pool with 10,000 tasks.

    DATABASE_URL=postgres://… SECRET_KEY=x python benchmarks/dashboard_pages.py [--nodes 1000]
        [--pending 10000] [--repeat 3] [--json]

Each page is requested through Django's test client (the whole middleware stack, the view, the
template; no network) as a platform admin, `--repeat` times after one warm-up; the figures are the
median wall, CPU and database milliseconds (the sum of the queries' times as Django measures them:
execute and fetch) and the number of SQL queries; then one more request after the per-cycle figures
(`apps.dashboard.caching`) are cleared, as the first request after a new cycle finds them ("uncached").

The what-if page is decided off the request (`apps.dashboard.whatif`): its "uncached" request is the page
that answers "computing…" and starts the decision; the decision itself is then run here, timed, as the
Celery worker runs it (`decide_cycle`, by ids), and the page's repeated requests read it stored.
The same run measures the floor: the login page (no database work beyond the session), so the ratios
say what each page adds.

1. The demo fleet (`whalegen demo`'s seed: 10 nodes in three pools), after one scheduling cycle per
   pool. Goal: every page within 300 ms.
2. A scratch pool of `--nodes` openb nodes with `--pending` tasks (benchmarks/cycle.py's builder), after
   one cycle placed what fits. Goal: every page within 1 s. The what-if page's uncached request runs
   two whole decisions on the pool (the cycle's policy and another); once per cycle.
The scratch rows are removed at the end. Figures only; nothing fails on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cycle import _build, _cleanup, _progress, _setup_django  # noqa: E402

DEMO_GOAL_MS = 300.0
LARGE_GOAL_MS = 1000.0


def time_page(client: Any, path: str, repeat: int, clear_last: bool = True) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.dashboard.caching import clear

    client.get(path)  # warm: templates compiled, session read
    walls, cpus, dbs, queries, status = [], [], [], 0, 0
    cold: dict[str, float] = {}
    for i in range(repeat + 1):
        if i == repeat and clear_last:
            clear()  # one more request with the per-cycle figures not cached yet (a new cycle's first)
        with CaptureQueriesContext(connection) as captured:
            wall, cpu = time.perf_counter(), time.process_time()
            response = client.get(path)
            wall_ms = (time.perf_counter() - wall) * 1000
            cpu_ms = (time.process_time() - cpu) * 1000
        # The database time as the client sees it: each query's execute and fetch (Django's timing).
        db_ms = sum(float(q["time"]) for q in captured.captured_queries) * 1000
        if i == repeat:
            cold = {"wall_ms": round(wall_ms, 1), "cpu_ms": round(cpu_ms, 1), "db_ms": round(db_ms, 1)}
            continue
        walls.append(wall_ms)
        cpus.append(cpu_ms)
        dbs.append(db_ms)
        queries, status = len(captured.captured_queries), response.status_code
    return {
        "path": path,
        "status": status,
        "wall_ms": round(statistics.median(walls), 1),
        "cpu_ms": round(statistics.median(cpus), 1),
        "db_ms": round(statistics.median(dbs), 1),
        "queries": queries,
        "uncached": cold,
    }


def time_whatif(client: Any, path: str, repeat: int) -> dict[str, Any]:
    """The what-if page: the request that starts the decision, the decision (as the worker runs it),
    then the page with the decision stored."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.dashboard import whatif
    from apps.dashboard.caching import clear

    started: list[tuple[int, tuple[str, ...], int]] = []
    original = whatif._start
    whatif._start = lambda pool_id, policies, cycle: started.append((pool_id, policies, cycle.id))
    try:
        client.get(path)  # warm: templates compiled, session read
        clear()
        started.clear()
        with CaptureQueriesContext(connection) as captured:
            wall, cpu = time.perf_counter(), time.process_time()
            assert "Computing" in client.get(path).content.decode()
            cold = {
                "wall_ms": round((time.perf_counter() - wall) * 1000, 1),
                "cpu_ms": round((time.process_time() - cpu) * 1000, 1),
                "db_ms": round(sum(float(q["time"]) for q in captured.captured_queries) * 1000, 1),
            }
        (pool_id, policies, cycle_id), *_ = started
        wall, cpu = time.perf_counter(), time.process_time()
        whatif.decide_cycle(pool_id=pool_id, policies=policies, cycle_id=cycle_id)
        decision = {
            "wall_ms": round((time.perf_counter() - wall) * 1000, 1),
            "cpu_ms": round((time.process_time() - cpu) * 1000, 1),
        }
        row = time_page(client, path, repeat, clear_last=False)
    finally:
        whatif._start = original
    row["uncached"] = cold
    row["decision"] = decision
    return row


def pages_of(pool_id: int, task_id: int | None) -> list[str]:
    paths = ["/login/", "/", "/tasks/", "/tasks/?state=pending", "/pools/", f"/pools/{pool_id}/"]
    paths += [f"/pools/{pool_id}/history/?hours=6", f"/pools/{pool_id}/whatif/?policy=fgd", "/overrides/"]
    paths += ["/accounting/"]
    if task_id is not None:
        paths.append(f"/tasks/{task_id}/")
    return paths


def measure(label: str, pool_id: int, task_id: int | None, repeat: int, goal_ms: float) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench-pages-admin", defaults={"is_staff": True}
    )
    client = Client()
    client.force_login(user)
    rows = []
    for path in pages_of(pool_id, task_id):
        _progress(f"{label}: {path}")
        rows.append(
            time_whatif(client, path, repeat) if "/whatif/" in path else time_page(client, path, repeat)
        )
    floor = rows[0]["cpu_ms"] or 0.1
    for row in rows:
        row["cpu_vs_login"] = round(row["cpu_ms"] / floor, 1)
        row["within_goal"] = row["wall_ms"] <= goal_ms
    return {"label": label, "goal_ms": goal_ms, "pages": rows, "load_avg": os.getloadavg()[0]}


def run(args: argparse.Namespace) -> int:
    _setup_django()
    from django.db import connection

    from apps.inventory.models import Pool
    from apps.scheduling.services import cycle_run
    from apps.workloads.models import Task
    from whalegen.commands.demo import seed

    if connection.vendor != "postgresql":
        print("benchmarks/dashboard_pages.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    results = []
    _progress("demo fleet: seeding (once) and one cycle per pool")
    seed()
    for pool in Pool.objects.exclude(name__startswith="bench-"):
        cycle_run(pool_id=pool.pk)
    demo_pool = Pool.objects.exclude(name__startswith="bench-").order_by("name").first()
    assert demo_pool is not None
    demo_task = Task.objects.filter(pool=demo_pool).order_by("pk").values_list("pk", flat=True).first()
    results.append(measure("demo fleet", demo_pool.pk, demo_task, args.repeat, DEMO_GOAL_MS))

    tag = f"pages-{int(time.time())}"
    build_args = argparse.Namespace(
        nodes=args.nodes, pending=args.pending, shares=args.shares, tenants=4, seed=42, traces=None
    )
    _progress(f"large pool: building {args.nodes} nodes and {args.pending} tasks")
    built = _build(build_args, tag)
    try:
        pool_id = built["pool"].pk
        _progress("large pool: one scheduling cycle")
        cycle_run(pool_id=pool_id)
        task = Task.objects.filter(pool_id=pool_id).order_by("pk").values_list("pk", flat=True).first()
        results.append(
            measure(f"{args.nodes} nodes, {args.pending} tasks", pool_id, task, args.repeat, LARGE_GOAL_MS)
        )
    finally:
        _progress("removing the scratch pool")
        _cleanup(built)
    if args.json:
        print(json.dumps({"results": results}, indent=2))
        return 0
    for result in results:
        print(
            f"\n{result['label']} (goal {result['goal_ms']:.0f} ms per page; load average "
            f"{result['load_avg']:.1f} at the end)"
        )
        print(
            f"{'page':<40} {'status':>6} {'wall ms':>9} {'CPU ms':>9} {'DB ms':>8} {'queries':>8} "
            f"{'CPU vs login':>13}   uncached: wall / CPU / DB ms"
        )
        for row in result["pages"]:
            mark = "" if row["within_goal"] else "  over goal"
            cold = row["uncached"]
            print(
                f"{row['path']:<40} {row['status']:>6} {row['wall_ms']:>9.1f} {row['cpu_ms']:>9.1f} "
                f"{row['db_ms']:>8.1f} {row['queries']:>8} {row['cpu_vs_login']:>12.1f}x   "
                f"{cold['wall_ms']:.0f} / {cold['cpu_ms']:.0f} / {cold['db_ms']:.0f}{mark}"
            )
            if "decision" in row:
                d = row["decision"]
                name = "  the decision, off the request"
                print(f"{name:<40} {'':>6} {d['wall_ms']:>9.1f} {d['cpu_ms']:>9.1f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--shares", type=int, default=4, help="MPS units per GPU in the large pool")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
