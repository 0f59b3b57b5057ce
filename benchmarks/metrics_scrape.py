"""The quota reads of one `/metrics` scrape and of the quota list, at a revision and at the working tree,
in the same run on the same rows.

    DATABASE_URL=postgres://… SECRET_KEY=x python benchmarks/metrics_scrape.py [--baseline-rev REV]
        [--tenants 40] [--pools 4] [--pending 25] [--holding 0] [--history 500] [--rounds 15] [--only READ]
        [--json]

Builds scratch tenants, pools, queues and quotas in the configured database (every tenant a quota in
every pool), with `--pending` pending, `--holding` admitted, assigned or running, and `--history` finished
(succeeded, failed, cancelled) tasks per quota, then times, round by
round and alternating so drift in a shared machine falls on both alike:

- the whole scrape: `generate_latest(registry_for(now))`, as `/metrics` answers it, with the collector's
  `plane_readings` taken from `apps/metrics/selectors.py` at `--baseline-rev` (before) and from the
  working tree (after);
- `quota_list` (platform admin, every row read), from `apps/workloads/selectors.py` at both.

Printed per read: the median over rounds of this process's CPU (`time.process_time`: the web worker's
share) and of wall time (which adds the database's). The baseline's modules are the revision's files
loaded under other names; they import the rest of the working tree. Everything made is removed unless
--keep. Use a scratch database: the scrape reads every row there, not only these.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()


def _module_at(rev: str, path: str, name: str) -> ModuleType:
    """`path` as it was at `rev`, imported as module `name` (its own imports resolve in the working tree)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # the revision's own file
    return module


def _seed(tag: str, *, tenants: int, pools: int, pending: int, holding: int, history: int) -> dict[str, int]:
    """Scratch rows, `tag` in every name; returns what was made."""
    from django.db import connection

    from apps.inventory.models import Pool
    from apps.inventory.services import pool_create
    from apps.tenants.models import Tenant
    from apps.tenants.services import tenant_create
    from apps.workloads.models import Queue, Quota, Task
    from apps.workloads.services import queue_create, quota_set

    made_pools = [pool_create(name=f"{tag}-p{i}", runtime="process") for i in range(pools)]
    rows: list[Task] = []
    for t in range(tenants):
        tenant = tenant_create(slug=f"{tag}-t{t}", name=f"{tag} t{t}")
        for pool in made_pools:
            quota_set(tenant=tenant, pool=pool, guaranteed_milli=4000, borrow_limit_milli=4000)
            queue = queue_create(tenant=tenant, pool=pool, name=f"q-{pool.name}")
            common = {"tenant": tenant, "queue": queue, "pool": pool, "priority": 0}
            # Half a quarter GPU each, half two whole GPUs (a fraction is of one GPU only).
            shapes = ((1, 250), (2, 1000))
            rows += [
                Task(state=Task.State.PENDING, gpu_count=count, gpu_milli=milli, **common)
                for count, milli in (shapes[i % 2] for i in range(pending))
            ]
            # Holding work in every holding state, some stating GPU memory (the list sums it), some not.
            held_states = (Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING)
            rows += [
                Task(state=held_states[i % 3], gpu_milli=500, gpu_mem_mib=(i % 2) * 8192, **common)
                for i in range(holding)
            ]
            # The history: finished in every way (none of it counts in any figure of the quota list).
            ended = (Task.State.SUCCEEDED, Task.State.FAILED, Task.State.CANCELLED)
            rows += [Task(state=ended[i % 3], gpu_milli=250, **common) for i in range(history)]
    Task.objects.bulk_create(rows, batch_size=5_000)
    # Fresh statistics, as autovacuum keeps them on a live plane: with the empty tables' stale ones the
    # planner's estimates (hundreds of quotas, tens of thousands of groups) crossed PostgreSQL's JIT
    # threshold, and compiling the query took 0.9 s of a 0.96 s quota list.
    with connection.cursor() as cursor:
        for model in (Task, Quota, Queue, Tenant, Pool):
            cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    return {"tenants": tenants, "pools": pools, "quotas": tenants * pools, "tasks": len(rows)}


def _clean(tag: str) -> None:
    from apps.inventory.models import Pool
    from apps.tenants.models import Tenant
    from apps.workloads.models import Queue, Quota, Task

    Task.objects.filter(tenant__slug__startswith=f"{tag}-").delete()
    Queue.objects.filter(tenant__slug__startswith=f"{tag}-").delete()
    Quota.objects.filter(tenant__slug__startswith=f"{tag}-").delete()
    Tenant.objects.filter(slug__startswith=f"{tag}-").delete()
    Pool.objects.filter(name__startswith=f"{tag}-").delete()


def _timed(call: Callable[[], Any]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    call()
    return (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-rev", default="HEAD", help="the revision measured as 'before' (HEAD)")
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument("--pending", type=int, default=25, help="pending tasks per quota")
    parser.add_argument("--holding", type=int, default=0, help="admitted/assigned/running tasks per quota")
    parser.add_argument("--history", type=int, default=500, help="finished tasks per quota")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--only", choices=["scrape", "quota_list"], help="time one read (both still compared)"
    )
    args = parser.parse_args(argv)
    _setup_django()
    from django.utils import timezone
    from prometheus_client.exposition import generate_latest

    from apps.metrics import collector
    from apps.metrics import selectors as metrics_now
    from apps.tenants.selectors import Access
    from apps.workloads import selectors as workloads_now

    metrics_before = _module_at(args.baseline_rev, "apps/metrics/selectors.py", "_baseline_metrics_selectors")
    workloads_before = _module_at(
        args.baseline_rev, "apps/workloads/selectors.py", "_baseline_workloads_selectors"
    )
    tag = f"scrape-{int(time.time())}"
    out: dict[str, Any] = {"baseline_rev": args.baseline_rev}
    try:
        started = time.perf_counter()
        out["made"] = _seed(
            tag,
            tenants=args.tenants,
            pools=args.pools,
            pending=args.pending,
            holding=args.holding,
            history=args.history,
        )
        out["seed_s"] = round(time.perf_counter() - started, 1)
        admin = Access(platform_admin=True)
        now = timezone.now()  # one clock for every scrape, so their texts can be compared

        def scrape(readings: Callable[..., Any]) -> Callable[[], Any]:
            def call() -> bytes:
                collector.plane_readings = readings  # type: ignore[attr-defined]
                return generate_latest(collector.registry_for(now=now))

            return call

        reads: dict[str, Callable[[], Any]] = {
            "scrape before": scrape(metrics_before.plane_readings),
            "scrape after": scrape(metrics_now.plane_readings),
            "quota_list before": lambda: list(workloads_before.quota_list(access=admin)),
            "quota_list after": lambda: list(workloads_now.quota_list(access=admin)),
        }

        # The same figures either way, or the comparison means nothing (bar the scrape's own duration).
        def figures(text: bytes) -> list[bytes]:
            return [
                line for line in text.splitlines() if not line.startswith(b"whalegen_metrics_scrape_seconds")
            ]

        assert figures(reads["scrape before"]()) == figures(reads["scrape after"]())
        fields = ("tenant_id", "pool_id", "waiting_milli", "held_milli", "held_mem_mib")
        fields += ("tasks_pending", "tasks_admitted")
        listed = {
            name: [tuple(getattr(q, field) for field in fields) for q in reads[name]()]
            for name in ("quota_list before", "quota_list after")
        }
        assert listed["quota_list before"] == listed["quota_list after"]  # every figure, in the same order
        timed = [name for name in reads if args.only is None or name.startswith(f"{args.only} ")]
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in timed}
        for _ in range(args.rounds):
            for name in timed:
                samples[name].append(_timed(reads[name]))
        out["median_ms"] = {
            name: {
                "cpu": round(statistics.median(c for c, _ in got), 2),
                "wall": round(statistics.median(w for _, w in got), 2),
            }
            for name, got in samples.items()
        }
    finally:
        collector.plane_readings = metrics_now.plane_readings  # type: ignore[attr-defined]
        if not args.keep:
            _clean(tag)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"baseline {args.baseline_rev}; made {out['made']} in {out['seed_s']} s; {args.rounds} rounds")
    print(f"{'read':<20} {'cpu ms':>9} {'wall ms':>9}")
    for name, median in out["median_ms"].items():
        print(f"{name:<20} {median['cpu']:>9.2f} {median['wall']:>9.2f}")
    for read in [args.only] if args.only else ["scrape", "quota_list"]:
        before, after = out["median_ms"][f"{read} before"], out["median_ms"][f"{read} after"]
        cpu, wall = after["cpu"] / before["cpu"], after["wall"] / before["wall"]
        print(f"{read}: after/before cpu {cpu:.2f}, wall {wall:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
