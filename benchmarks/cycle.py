"""One production scheduling cycle at scale: 10,000 pending tasks on the 1,213-node openb pool in PostgreSQL.

    DATABASE_URL=postgres://… SECRET_KEY=x python benchmarks/cycle.py --pending 10000 --nodes 1213 --json

It builds a scratch pool in the configured database (nodes and GPU models from the openb node list, split
over two clusters; every GPU shared through MPS units of 1000/--shares milli; task shapes drawn with a
fixed seed from the openb pod list, shares rounded up to whole units, CPU-only rows left out because a
WhaleGen task always asks for a GPU), runs `cycle_run` once and removes the pool again (--keep keeps it).

Figures: snapshot, solve and commit milliseconds (from the Cycle record), the whole cycle (wall and CPU
seconds of this process), and admitted tasks per second. Baselines measured in the same run: the engine
alone (`solve_cycle` on the same snapshot, its own order, no database), pure `decide` on the same snapshot
(what the cycle's solve step runs: ordering, units, re-carve, estimates), and the per-task commit path
(`task_transition` twice per task, on a sample, rolled back) extrapolated to the cycle's placements.
A second cycle then runs over the same pool, busy with the first one's placements (`busy_*` figures,
with the engine alone on that snapshot): what every later cycle of a production pool reads.
Goals (issue 10, reported, not asserted): ≤ 3 s per cycle and ≤ 2× the engine alone in the same run.
`--pairs N` first runs N pairs on the empty pool (the engine alone, then a whole cycle rolled back), and
reports each pair's ratio and their median: on a noisy host one pair is not a measurement.

On a shared host wall time mostly measures the neighbours, so two load-independent figures come with it:
this process's CPU seconds, and the PostgreSQL backend's (`cycle_db_cpu_s`, read from /proc when the
server runs on this host). `decisions_sha256` hashes every placement (task, node, GPU indexes, each unit
by its place on its GPU): identical before and after a change that must not change decisions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 3.0
SAMPLE_FOR_PER_TASK_COMMIT = 200


def _progress(message: str) -> None:
    print(f"… {message}", file=sys.stderr, flush=True)


def _setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()


def _build(args: argparse.Namespace, tag: str) -> dict[str, Any]:
    """Bulk-insert the scratch pool: the rows a real fleet would have, without the per-row services."""
    from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool
    from apps.tenants.models import Tenant
    from apps.workloads.models import Queue, Quota, Task
    from whalegen.commands.replay import default_traces
    from whalegen.gpus import UnknownGpuModel, get_model
    from whalegen.sim.trace import NODE_FILE, load_nodes, load_tasks, pod_file

    traces = Path(args.traces) / "openb" if args.traces else default_traces()
    trace_nodes = load_nodes(traces / NODE_FILE)
    trace_tasks = [t for t in load_tasks(traces / pod_file("default")) if t.num_gpu]
    rng = random.Random(args.seed)
    node_specs = [trace_nodes[i % len(trace_nodes)] for i in range(args.nodes)]
    unit_milli = 1000 // args.shares

    pool = Pool.objects.create(name=f"bench-{tag}", runtime=Pool.Runtime.PROCESS)
    clusters = [Cluster.objects.create(name=f"bench-{tag}-{side}") for side in ("east", "west")]
    nodes = Node.objects.bulk_create(
        [
            Node(
                cluster=clusters[i % 2],
                pool=pool,
                name=f"{spec.name}-{i}",
                cpu_milli=spec.cpu_total_milli,
                mem_mib=spec.mem_total_mib,
            )
            for i, spec in enumerate(node_specs)
        ],
        batch_size=2000,
    )
    gpus: list[Gpu] = []
    for node, spec in zip(nodes, node_specs, strict=True):
        for gpu in spec.gpus:
            try:
                mem = get_model(gpu.model).mem_mib or 16_384
            except UnknownGpuModel:
                mem = 16_384  # trace-only models (G2, G3) carry no memory figure
            gpus.append(
                Gpu(
                    node=node,
                    index=gpu.index,
                    uuid=f"GPU-bench-{tag}-{node.pk}-{gpu.index}",
                    model=gpu.model,
                    mem_mib=mem,
                    partition_mode=Gpu.PartitionMode.MPS,
                )
            )
    gpus = Gpu.objects.bulk_create(gpus, batch_size=5000)
    ComputeUnit.objects.bulk_create(
        [
            ComputeUnit(
                gpu=gpu,
                kind=ComputeUnit.Kind.MPS,
                gpu_milli=unit_milli,
                mem_mib=gpu.mem_mib // args.shares,
                mps_thread_pct=max(1, 100 // args.shares),
            )
            for gpu in gpus
            for _ in range(args.shares)
        ],
        batch_size=10_000,
    )
    capacity = 1000 * len(gpus)
    tenants = [
        Tenant.objects.create(slug=f"bench-{tag}-t{i}", name=f"bench {i}") for i in range(args.tenants)
    ]
    queues = []
    for tenant in tenants:
        # Guarantees split the pool evenly; each may borrow up to all of it.
        Quota.objects.create(
            tenant=tenant,
            pool=pool,
            guaranteed_milli=capacity // len(tenants),
            borrow_limit_milli=capacity,
        )
        queues.append(Queue.objects.create(tenant=tenant, pool=pool, name="bench"))
    tasks = []
    for n in range(args.pending):
        shape = rng.choice(trace_tasks)
        milli = shape.gpu_milli if shape.num_gpu == 1 else 1000
        milli = min(1000, -(-milli // unit_milli) * unit_milli)  # rounded up to whole MPS units
        k = n % len(tenants)
        tasks.append(
            Task(
                tenant=tenants[k],
                queue=queues[k],
                pool=pool,
                name=f"bench-{n}",
                gpu_count=shape.num_gpu,
                gpu_milli=milli,
                cpu_milli=shape.cpu_milli,
                host_mem_mib=shape.mem_mib,
                allowed_gpu_models=sorted(shape.allowed_models),
                priority=rng.choice((0, 0, 0, 5)),
                preemptible=False,
            )
        )
    Task.objects.bulk_create(tasks, batch_size=5000)
    _analyze()
    return {
        "pool": pool,
        "clusters": clusters,
        "tenants": tenants,
        "gpus": len(gpus),
        "units": len(gpus) * args.shares,
    }


def _analyze() -> None:
    """Give the server's planner the new rows' statistics, as autovacuum does on a production server
    within a minute of such a load. This host's server runs with autovacuum off, and a pool built and
    cycled within seconds was read with a table's default guesses: the snapshot's units read (62,120 rows)
    took a nested loop and a sort spilled to disk, 70-140 ms of the server's time against 25-45 ms once
    the tables are analysed (docs/notes/cycle-speed.md, round 18)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _cleanup(built: dict[str, Any]) -> None:
    from apps.inventory.models import Node
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Queue, Quota, Task

    pool = built["pool"]
    Assignment.objects.filter(node__pool=pool).delete()
    Task.objects.filter(pool=pool).delete()
    Node.objects.filter(pool=pool).delete()
    Quota.objects.filter(pool=pool).delete()
    Queue.objects.filter(pool=pool).delete()
    for tenant in built["tenants"]:
        tenant.delete()
    for cluster in built["clusters"]:
        cluster.delete()
    pool.delete()


def _backend_cpu_s() -> float | None:
    """CPU seconds the database server's process for this connection has used, or None when the server
    is not on this host (or not PostgreSQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _decisions_sha256(cycle_id: int, pool_id: int) -> str:
    """A hash of the cycle's placements that two scratch pools built alike share (row ids differ)."""
    from apps.inventory.models import ComputeUnit
    from apps.scheduling.models import Assignment

    rank: dict[int, tuple[int, int]] = {}  # unit → (its GPU's index, its place among the GPU's units)
    position: dict[int, int] = {}
    for unit_id, gpu_id, index in (
        ComputeUnit.objects.filter(gpu__node__pool_id=pool_id)
        .order_by("gpu_id", "id")
        .values_list("id", "gpu_id", "gpu__index")
    ):
        position[gpu_id] = position.get(gpu_id, -1) + 1
        rank[unit_id] = (index, position[gpu_id])
    rows = Assignment.objects.filter(cycle_id=cycle_id).values_list("task__name", "node__name", "unit_ids")
    picture = sorted((task, node, tuple(rank[u] for u in ids)) for task, node, ids in rows)
    return hashlib.sha256(repr(picture).encode()).hexdigest()


def _busy_pool_cycle(pool_id: int, policy: str) -> dict[str, Any]:
    """A second cycle over the same pool, now busy: the first cycle's placements run, its leftovers wait.

    The first cycle starts from an empty pool; every later one reads the running tasks too (their
    assignments, units and expected ends), which is where a production pool spends its life. Its engine
    alone is measured on the busy snapshot, as for the first.
    """
    from django.utils import timezone

    from apps.scheduling.models import Cycle
    from apps.scheduling.services import cycle_run
    from apps.scheduling.snapshot import snapshot_for_pool
    from whalegen.placement.engine import EngineConfig, solve_cycle

    _progress("a second cycle over the now busy pool, and its engine alone")
    now = timezone.now()
    snapshot = snapshot_for_pool(pool_id, now)
    started = time.perf_counter()
    solve_cycle(snapshot.cluster, EngineConfig(policy=policy), now.timestamp())
    engine_alone_s = time.perf_counter() - started
    started, started_cpu = time.perf_counter(), time.process_time()
    report = cycle_run(pool_id=pool_id, policy=policy, now=now)
    cycle_s = time.perf_counter() - started
    cycle_cpu_s = time.process_time() - started_cpu
    cycle = Cycle.objects.get(pk=report.cycle_id)
    return {
        "busy_running": len(snapshot.cluster.running),
        "busy_pending": len(snapshot.cluster.pending),
        "busy_snapshot_ms": round(cycle.snapshot_ms or 0, 1),
        "busy_solve_ms": round(cycle.solve_ms or 0, 1),
        "busy_commit_ms": round(cycle.commit_ms or 0, 1),
        "busy_cycle_s": round(cycle_s, 3),
        "busy_cycle_cpu_s": round(cycle_cpu_s, 3),
        "busy_engine_alone_s": round(engine_alone_s, 3),
        "busy_cycle_over_engine_alone": round(cycle_s / engine_alone_s, 2) if engine_alone_s else None,
    }


def _pairs(pool_id: int, policy: str, count: int) -> dict[str, Any]:
    """`count` same-run pairs on the empty pool: the engine alone, then a whole cycle in a transaction
    that is rolled back, alternated. On a shared host one pair says little (identical engine runs here
    took 1.1 to 2.0 s); the median over pairs, each ratio taken within its pair, is the figure to read.
    The engine alone runs with the garbage collector held off, as the cycle runs: with it on, its
    collections (0 to 0.5 s here, depending on what the process holds) made the ratio look better.

    A rolled-back cycle runs every statement of a real one but the final COMMIT, which the committed cycle
    after the pairs reports (`transaction_commit_ms`). Dead rows it leaves are vacuumed between pairs, so
    every pair reads the pool as the first did.
    """
    import statistics

    from django.db import connection, transaction
    from django.utils import timezone

    from apps.scheduling.services import cycle_run, gc_paused
    from apps.scheduling.snapshot import snapshot_for_pool
    from whalegen.placement.engine import EngineConfig, solve_cycle

    class Rollback(Exception):
        pass

    rows: list[dict[str, float]] = []
    for number in range(1, count + 1):
        _progress(f"same-run pair {number} of {count}: the engine alone, then a rolled-back cycle")
        with connection.cursor() as cursor:
            for table in ("workloads_task", "workloads_taskevent", "scheduling_assignment"):
                cursor.execute(f"VACUUM ANALYZE {table}")
        now = timezone.now()
        snapshot = snapshot_for_pool(pool_id, now)
        with gc_paused():  # as the cycle holds it off: like for like
            started, started_cpu = time.perf_counter(), time.process_time()
            solve_cycle(snapshot.cluster, EngineConfig(policy=policy), now.timestamp())
            engine_s, engine_cpu_s = time.perf_counter() - started, time.process_time() - started_cpu
        del snapshot
        try:
            with transaction.atomic():
                started, started_cpu = time.perf_counter(), time.process_time()
                cycle_run(pool_id=pool_id, policy=policy, now=now)
                cycle_s, cycle_cpu_s = time.perf_counter() - started, time.process_time() - started_cpu
                raise Rollback
        except Rollback:
            pass
        rows.append(
            {
                "engine_alone_s": round(engine_s, 3),
                "cycle_s": round(cycle_s, 3),
                "ratio": round(cycle_s / engine_s, 2),
                "engine_alone_cpu_s": round(engine_cpu_s, 3),
                "cycle_cpu_s": round(cycle_cpu_s, 3),
                "cpu_ratio": round(cycle_cpu_s / engine_cpu_s, 2),
            }
        )
    if not rows:
        return {}
    return {
        "pairs": rows,
        "pairs_median_ratio": round(statistics.median(r["ratio"] for r in rows), 2),
        "pairs_max_ratio": max(r["ratio"] for r in rows),
        "pairs_median_cpu_ratio": round(statistics.median(r["cpu_ratio"] for r in rows), 2),
        "pairs_median_cycle_s": round(statistics.median(r["cycle_s"] for r in rows), 3),
        "pairs_median_engine_alone_s": round(statistics.median(r["engine_alone_s"] for r in rows), 3),
    }


def _per_task_commit_s(pool_id: int, placed: int) -> float | None:
    """Seconds per task of the one-at-a-time path (two `task_transition` calls), on a rolled-back sample."""
    from django.db import transaction

    from apps.workloads.models import Task
    from apps.workloads.services import task_transition

    sample = list(Task.objects.filter(pool_id=pool_id, state=Task.State.PENDING)[:SAMPLE_FOR_PER_TASK_COMMIT])
    if not sample or not placed:
        return None

    class Rollback(Exception):
        pass

    started = time.perf_counter()
    try:
        with transaction.atomic():
            for task in sample:
                moved = task_transition(
                    task=task, to_state=Task.State.ADMITTED, actor="bench", reason="bench"
                )
                task_transition(task=moved, to_state=Task.State.ASSIGNED, actor="bench", reason="bench")
            raise Rollback
    except Rollback:
        pass
    return (time.perf_counter() - started) / len(sample)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1213)
    parser.add_argument(
        "--shares", type=int, default=10, help="MPS units per GPU (default 10: 100 milli each)"
    )
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--policy", default="whalegen")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--traces",
        default=None,
        help="folder holding openb/ (default $WHALEGEN_TRACES_DIR or /work/shared/traces)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="also run N same-run pairs (engine alone, then a rolled-back cycle); report their median ratio",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch pool in the database")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    _setup_django()
    from django.db import connection
    from django.utils import timezone

    from apps.scheduling.models import Cycle
    from apps.scheduling.services import cycle_run, gc_paused
    from apps.scheduling.snapshot import cycle_input
    from whalegen.placement.engine import EngineConfig, solve_cycle
    from whalegen.scheduling import decide

    if connection.vendor != "postgresql":
        print("benchmarks/cycle.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    tag = f"{int(time.time())}-{os.getpid()}"
    _progress(f"building {args.nodes} nodes and {args.pending} pending tasks in PostgreSQL")
    started = time.perf_counter()
    built = _build(args, tag)
    build_s = time.perf_counter() - started
    pool_id = built["pool"].pk
    try:
        now = timezone.now()
        _progress("baseline: the engine alone on the same snapshot")
        # The cycle's own input: the engine alone reads its cluster, pure `decide` all of it.
        given = cycle_input(pool_id, now, args.policy)
        snapshot = given.snapshot
        started, started_cpu = time.perf_counter(), time.process_time()
        alone = solve_cycle(snapshot.cluster, EngineConfig(policy=args.policy), now.timestamp())
        engine_alone_s = time.perf_counter() - started
        engine_alone_cpu_s = time.process_time() - started_cpu
        # The cycle holds the garbage collector off (`gc_paused`); the engine alone with it held off too,
        # so that the ratio can be read both ways.
        _progress("baseline: the engine alone, collector paused as in the cycle")
        started_cpu = time.process_time()
        with gc_paused():
            solve_cycle(snapshot.cluster, EngineConfig(policy=args.policy), now.timestamp())
        engine_alone_gc_paused_cpu_s = time.process_time() - started_cpu
        _progress("baseline: pure decide on the same snapshot (what the cycle's solve step runs)")
        started, started_cpu = time.perf_counter(), time.process_time()
        decided = decide(given.pure, given.config, now.timestamp())
        decide_alone_s = time.perf_counter() - started
        decide_alone_cpu_s = time.process_time() - started_cpu
        engine_alone_placed, decide_alone_placed = len(alone.placements), len(decided.placements)
        # Let the baselines' pictures go before any cycle runs: a production worker holds no other
        # snapshot and decisions (a few million objects) while it cycles, and holding them slowed the
        # cycles' allocation-heavy steps more than the engine's (docs/notes/cycle-speed.md, round 17).
        del given, snapshot, alone, decided
        _progress("baseline: per-task commit on a rolled-back sample")
        per_task_s = _per_task_commit_s(pool_id, engine_alone_placed)
        paired = _pairs(pool_id, args.policy, args.pairs)
        _progress("one production cycle")
        db_cpu_before = _backend_cpu_s()
        started, started_cpu = time.perf_counter(), time.process_time()
        report = cycle_run(pool_id=pool_id, policy=args.policy, now=now)
        cycle_s = time.perf_counter() - started
        cycle_cpu_s = time.process_time() - started_cpu
        db_cpu_after = _backend_cpu_s()
        cycle = Cycle.objects.get(pk=report.cycle_id)
        decisions_sha256 = _decisions_sha256(cycle.pk, pool_id)
        steady = _busy_pool_cycle(pool_id, args.policy)
    finally:
        if not args.keep:
            _progress("removing the scratch pool")
            _cleanup(built)
    figures = {
        "nodes": args.nodes,
        "gpus": built["gpus"],
        "compute_units": built["units"],
        "pending": args.pending,
        "policy": args.policy,
        "build_s": round(build_s, 2),
        "snapshot_ms": round(cycle.snapshot_ms or 0, 1),
        "solve_ms": round(cycle.solve_ms or 0, 1),
        "commit_ms": round(cycle.commit_ms or 0, 1),
        "transaction_commit_ms": report.transaction_commit_ms,
        "cycle_s": round(cycle_s, 3),
        "placed": report.placed,
        "unplaced": report.unplaced,
        "conflicts": report.conflicts,
        "decisions_sha256": decisions_sha256,
        "admitted_per_s": round(report.placed / cycle_s, 1) if cycle_s else None,
        "goal_s": GOAL_S,
        "within_goal": cycle_s <= GOAL_S,
        "commit_phases_ms": cycle.stats.get("commit_phases_ms"),
        # None: the commit wrote unlocked (docs/scheduling.md §4 step 1); else why it took the locked path.
        "commit_unlocked_missed": cycle.stats.get("commit_unlocked_missed"),
        # This process's CPU per step and commit phase: comparable on a loaded host, where wall is not.
        "cpu_ms": cycle.stats.get("cpu_ms"),
        "commit_phases_cpu_ms": cycle.stats.get("commit_phases_cpu_ms"),
        "fragmentation_before": cycle.stats.get("fragmentation_before"),
        "fragmentation_after": cycle.stats.get("fragmentation_after"),
        "baseline_engine_alone_s": round(engine_alone_s, 3),
        "baseline_engine_alone_placed": engine_alone_placed,
        "cycle_over_engine_alone": round(cycle_s / engine_alone_s, 2) if engine_alone_s else None,
        "cycle_cpu_s": round(cycle_cpu_s, 3),
        # The database server's CPU for the same cycle (its COMMIT included), when it runs on this host.
        "cycle_db_cpu_s": round(db_cpu_after - db_cpu_before, 2)
        if db_cpu_before is not None and db_cpu_after is not None
        else None,
        "baseline_engine_alone_cpu_s": round(engine_alone_cpu_s, 3),
        "cycle_cpu_over_engine_alone_cpu": round(cycle_cpu_s / engine_alone_cpu_s, 2)
        if engine_alone_cpu_s
        else None,
        "baseline_engine_alone_gc_paused_cpu_s": round(engine_alone_gc_paused_cpu_s, 3),
        "cycle_cpu_over_engine_alone_gc_paused_cpu": round(cycle_cpu_s / engine_alone_gc_paused_cpu_s, 2)
        if engine_alone_gc_paused_cpu_s
        else None,
        "decide_alone_s": round(decide_alone_s, 3),
        "decide_alone_cpu_s": round(decide_alone_cpu_s, 3),
        "decide_alone_placed": decide_alone_placed,
        "decide_cpu_over_engine_alone_cpu": round(decide_alone_cpu_s / engine_alone_cpu_s, 2)
        if engine_alone_cpu_s
        else None,
        "baseline_per_task_commit_ms": round(per_task_s * 1000, 2) if per_task_s else None,
        "per_task_commit_extrapolated_s": round(per_task_s * report.placed, 2) if per_task_s else None,
        "bulk_commit_speedup": round(per_task_s * report.placed / ((cycle.commit_ms or 1) / 1000), 1)
        if per_task_s
        else None,
        **steady,
        **paired,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:<34} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
