"""Placement speed: the production decision (`Decider.step` per task) vs the engine alone vs a plain
per-node-loop FGD, for `fgd` and `whalegen`.

    /work/venv/bin/python -m benchmarks.placement [--nodes 5000] [--fill 130]
    /work/venv/bin/python -m benchmarks.placement --fingerprint [--policy fgd,whalegen]

`--fingerprint` times nothing: it prints, per policy and cluster, a SHA-256 of every decision of the
`--seed 42` stream through `decide` and through the engine alone. A speed change must reprint them.

Targets from issue 3 (reported, not asserted): ≥ 3,000 placements/s on the 1,213-node trace cluster,
≥ 2,000/s on 5,000 nodes × 8 GPUs, and one full 130 % replay in ≤ 3 CPU seconds; issue 10 raised the
5,000-node one for `whalegen` to ≥ 2,500/s (`fgd` ran at 2,492/s when it was set). The `fgd` rows are
the same-run reference: on a shared machine compare `whalegen` against them, not against the targets.
The share plan's LP solvers have their own benchmark, `benchmarks/share_plan.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from whalegen.commands.replay import default_traces
from whalegen.sim.bench import bench_cluster, fingerprint, synthetic_cluster
from whalegen.sim.trace import NODE_FILE, load_nodes, load_tasks, pod_file

POLICIES = ("fgd", "whalegen")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--fill", type=float, default=130.0)
    parser.add_argument("--traces", type=Path, default=None)
    parser.add_argument("--policy", default=",".join(POLICIES), help="comma-separated policies")
    parser.add_argument("--fingerprint", action="store_true", help="hash the decisions instead of timing")
    parser.add_argument("--clusters", default="trace,synthetic", help="which clusters (--fingerprint)")
    args = parser.parse_args()
    traces = args.traces or default_traces()
    nodes = load_nodes(traces / NODE_FILE)
    tasks = load_tasks(traces / pod_file("default"))
    policies = args.policy.split(",")
    if args.fingerprint:
        for policy in policies:
            for name in args.clusters.split(","):
                cluster = nodes if name == "trace" else synthetic_cluster(args.nodes)
                f = fingerprint(cluster, tasks, policy, seed=42, fill=args.fill / 100)
                print(
                    f"{policy:<10} {name:<10} {f['nodes']:>5} nodes "
                    f"{f['placements']:>6} of {f['tasks']:>6} placed  "
                    f"decide {f['decide_sha256'][:16]}  engine {f['engine_sha256'][:16]}",
                    flush=True,
                )
        return 0
    rows = []
    for policy in policies:
        for name, cluster, naive_tasks in (
            ("trace 1213×mixed", nodes, 300),
            (f"synthetic {args.nodes}×8", synthetic_cluster(args.nodes), max(20, 300 * 1213 // args.nodes)),
        ):
            print(f"… {policy} on {name}", file=sys.stderr, flush=True)
            figures = bench_cluster(
                cluster, tasks, policy, seed=42, fill=args.fill / 100, naive_tasks=naive_tasks
            )
            rows.append((policy, name, figures))
    header = ("policy", "cluster", "decide/s", "CPU s", "engine/s", "cost", "plain FGD/s", "speed-up")
    print(
        f"{header[0]:<10} {header[1]:<18} {header[2]:>9} {header[3]:>7} {header[4]:>9} {header[5]:>6} "
        f"{header[6]:>11} {header[7]:>8}"
    )
    for policy, name, f in rows:
        print(
            f"{policy:<10} {name:<18} {f['decide']['placements_per_s']:>9.0f} {f['decide']['cpu_s']:>7.2f} "
            f"{f['engine_alone']['placements_per_s']:>9.0f} {f['decide_cpu_over_engine_alone_cpu']:>5}× "
            f"{f['naive_fgd_first_tasks']['decisions_per_s']:>11.1f} {f['speedup_vs_naive_fgd']:>7}×"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
