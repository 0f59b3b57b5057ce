"""`whalegen bench SUBJECT`: speed figures against a baseline measured in the same run.

    whalegen bench placement --nodes 5000 --policy fgd --json

`placement` times the production decision (`whalegen.scheduling.Decider.step`, one cycle per task, as
`whalegen replay` runs it) on the openb trace cluster and on a synthetic cluster of N nodes × 8 GPUs,
next to the engine alone (`Engine.solve` per task) and a plain per-node-loop FGD on the same streams.
Subjects are subcommands so that others (a full scheduling `cycle`) can join without changing this one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from whalegen.commands.replay import default_traces
from whalegen.placement.registry import make_policy
from whalegen.sim.bench import bench_cluster, synthetic_cluster
from whalegen.sim.trace import NODE_FILE, load_nodes, load_tasks, pod_file

TRACE_CLUSTER_NODES = 1213


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subjects = parser.add_subparsers(dest="subject", required=True)
    placement = subjects.add_parser(
        "placement", help="placements per second: decide vs the engine alone vs a plain FGD loop"
    )
    placement.add_argument("--nodes", type=int, default=5000, help="synthetic cluster size (8 GPUs each)")
    placement.add_argument("--policy", default="fgd", help="policy to time (default fgd)")
    placement.add_argument("--workload", default="default", help="pod list whose tasks are replayed")
    placement.add_argument("--traces", default=None, help="folder with the openb CSVs")
    placement.add_argument("--seed", type=int, default=42)
    placement.add_argument("--fill", type=float, default=130.0, help="stop the stream at this %% of capacity")
    placement.add_argument("--naive-tasks", type=int, default=300, help="tasks timed for the plain loop")
    placement.add_argument("--json", action="store_true", help="print one JSON object")
    cycle = subjects.add_parser(
        "cycle", help="one production scheduling cycle in the configured PostgreSQL (benchmarks/cycle.py)"
    )
    cycle_benchmark = _cycle_benchmark()
    if cycle_benchmark is not None:
        cycle_benchmark.add_arguments(cycle)


def run(args: argparse.Namespace) -> int:
    if args.subject == "placement":
        return _placement(args)
    if args.subject == "cycle":
        cycle_benchmark = _cycle_benchmark()
        if cycle_benchmark is None:
            print("whalegen bench cycle: benchmarks/cycle.py is missing (use a checkout)", file=sys.stderr)
            return 2
        return int(cycle_benchmark.run(args))
    print(f"whalegen bench: unknown subject {args.subject!r}", file=sys.stderr)
    return 2


def _cycle_benchmark() -> ModuleType | None:
    """benchmarks/cycle.py from the source checkout; it needs Django and PostgreSQL, `placement` does not."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cycle.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("whalegen_bench_cycle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _placement(args: argparse.Namespace) -> int:
    try:
        make_policy(args.policy)
    except ValueError as error:
        print(f"whalegen bench: {error}", file=sys.stderr)
        return 2
    traces = Path(args.traces) if args.traces else default_traces()
    tasks = load_tasks(traces / pod_file(args.workload))
    fill = args.fill / 100
    print(f"timing {args.policy} on the trace cluster …", file=sys.stderr, flush=True)
    trace = bench_cluster(
        load_nodes(traces / NODE_FILE),
        tasks,
        args.policy,
        seed=args.seed,
        fill=fill,
        naive_tasks=args.naive_tasks,
    )
    # The plain loop costs O(nodes) per task, so it gets proportionally fewer tasks on big clusters.
    naive_tasks = max(20, args.naive_tasks * TRACE_CLUSTER_NODES // max(args.nodes, 1))
    print(f"timing {args.policy} on {args.nodes} synthetic nodes × 8 GPUs …", file=sys.stderr, flush=True)
    synthetic = bench_cluster(
        synthetic_cluster(args.nodes), tasks, args.policy, seed=args.seed, fill=fill, naive_tasks=naive_tasks
    )
    result = {"policy": args.policy, "workload": args.workload, "trace": trace, "synthetic": synthetic}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"policy {args.policy}, tasks from {args.workload}; CPU seconds of one process")
    for name, figures in (("trace cluster", trace), (f"synthetic {args.nodes}×8", synthetic)):
        decided = figures["decide"]
        engine = figures["engine_alone"]
        naive = figures["naive_fgd_first_tasks"]
        head = figures["decide_first_tasks"]
        print(
            f"{name:<20} {figures['nodes']:>6} nodes {figures['gpus']:>6} GPUs: decide "
            f"{decided['placements_per_s']:>8.0f} placements/s "
            f"({decided['placements']} of {decided['tasks']} tasks placed, {decided['cpu_s']:.2f} s); "
            f"engine alone {engine['placements_per_s']:.0f}/s (decide costs "
            f"×{figures['decide_cpu_over_engine_alone_cpu']}); "
            f"first {naive['tasks']} tasks: decide {head['decisions_per_s']:.0f}/s, plain FGD loop "
            f"{naive['decisions_per_s']:.0f}/s, ×{figures['speedup_vs_naive_fgd']}"
        )
    return 0
