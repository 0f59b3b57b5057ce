"""What a GPU-hour budget costs the scheduling cycle, and what an accounting report costs, against a pool's
history of N finished assignments (default 50,000 spread over 90 days).

    DATABASE_URL=postgres://… SECRET_KEY=x python benchmarks/accounting.py [--assignments N] [--repeat R]

Builds a scratch tenant, pool and node (8 whole H100s) in the configured database, inserts the history,
then measures in the same run: the pool's snapshot without a budget (the baseline), the snapshot with a
budget (it adds the month's usage query), and a month's report grouped by tenant and pool. Prints the
best of R wall times, process CPU, and the ratio to the baseline; removes what it made unless --keep.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()


def _best(repeat: int, work: Callable[[], object]) -> tuple[float, float]:
    """Best wall and process-CPU seconds of `repeat` runs (the database's own time is in wall only)."""
    runs = []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--assignments", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    _setup_django()
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.accounting.models import Budget
    from apps.accounting.selectors import month_start, usage_report
    from apps.inventory.models import ComputeUnit
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.scheduling.models import Assignment
    from apps.scheduling.snapshot import snapshot_for_pool
    from apps.tenants.selectors import Access
    from apps.tenants.services import tenant_create
    from apps.workloads.models import Task
    from apps.workloads.services import queue_create, quota_set

    suffix = str(os.getpid())
    print(f"building {args.assignments:,} finished assignments over 90 days …", flush=True)
    with transaction.atomic():
        pool = pool_create(name=f"bench-acct-{suffix}", runtime="process")
        tenant = tenant_create(slug=f"bench-acct-{suffix}", name="accounting benchmark")
        quota = quota_set(tenant=tenant, pool=pool, guaranteed_milli=8000)
        queue = queue_create(tenant=tenant, pool=pool, name="q")
        cluster = cluster_create(name=f"bench-acct-{suffix}")
        node, _ = node_register(cluster=cluster, pool=pool, name="n", cpu_milli=64_000, mem_mib=512 * 1024)
        for index in range(8):
            gpu_add(node=node, index=index, model="H100-80GB")
        units = list(ComputeUnit.objects.filter(gpu__node=node).values_list("id", flat=True))
        tasks = Task.objects.bulk_create(
            Task(tenant=tenant, queue=queue, pool=pool, priority=0, state=Task.State.SUCCEEDED)
            for _ in range(args.assignments)
        )
        Assignment.objects.bulk_create(
            Assignment(task=task, node=node, unit_ids=[units[i % len(units)]]) for i, task in enumerate(tasks)
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Assignment._meta.db_table} SET created_at = now() - random() * interval '90 days'"
                " WHERE node_id = %s",
                [node.pk],
            )
            cursor.execute(
                f"UPDATE {Assignment._meta.db_table} SET released_at = created_at + interval '1 hour'"
                " WHERE node_id = %s",
                [node.pk],
            )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    try:
        now = timezone.now()
        base = _best(args.repeat, lambda: snapshot_for_pool(pool.pk, now))
        budget = Budget.objects.create(quota=quota, gpu_hours=1e9)
        with_budget = _best(args.repeat, lambda: snapshot_for_pool(pool.pk, now))
        report = _best(
            args.repeat,
            lambda: usage_report(
                access=Access(platform_admin=True),
                start=month_start(now),
                end=now,
                now=now,
                group_by=("tenant", "pool"),
            ),
        )
        print(f"{'measure':<34} {'wall ms':>9} {'CPU ms':>8} {'× baseline':>11}")
        for label, (wall, cpu) in (
            ("snapshot, no budget (baseline)", base),
            ("snapshot, with a budget", with_budget),
            ("report: this month by tenant,pool", report),
        ):
            print(f"{label:<34} {wall * 1000:>9.1f} {cpu * 1000:>8.1f} {wall / base[0]:>11.2f}")
        budget.delete()
    finally:
        if not args.keep:
            with transaction.atomic():
                Assignment.objects.filter(node=node).delete()
                Task.objects.filter(tenant=tenant).delete()
                node.gpus.all().delete()
                node.delete()
                cluster.delete()
                queue.delete()
                quota.delete()
                tenant.delete()
                pool.delete()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
