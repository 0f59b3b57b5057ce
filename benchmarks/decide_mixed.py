"""`decide` on a unit-exact pool that mixes MIG, MPS and whole GPUs, against the engine alone in the same run.

    python benchmarks/decide_mixed.py --nodes 150 --tasks 3000 --seeds 3 [--json]

The production cycle's benchmark (`whalegen bench cycle`) shares every GPU through MPS units; H100 and
H200 pools run MIG. Here each of `--nodes` nodes has eight H100s: 40% in MIG mode with one of five
layouts (30% of those idle, the rest with about half their instances held), 30% whole (30% held) and 30%
shared through four MPS units (0 to 2 held). Tasks: one GPU of 1/7, 1/4, 2/7, 3/7, 1/2 or a whole GPU,
or 2 or 4 whole GPUs; isolation any, MIG or exclusive. The pool is built through
`whalegen.scheduling.snapshot.gpu_picture`, the rule the production snapshot reader uses.

Prints per policy and seed: CPU seconds of the engine alone (`solve_cycle`, no units) and of `decide`
(units bound, re-carves planned), their ratio, tasks placed and GPU milli placed. `decide` binds what the
engine chose; where the engine's picture of a GPU is not its units (MIG GPUs seen as free slices, MPS
GPUs as free milli) its choices miss and `decide` retries with a new engine each time.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from whalegen.gpus.mig import profile_by_name  # noqa: E402
from whalegen.placement.engine import EngineConfig, solve_cycle  # noqa: E402
from whalegen.placement.types import (  # noqa: E402
    ClusterSnapshot,
    Isolation,
    NodeState,
    PartitionMode,
    TaskRequest,
)
from whalegen.scheduling import Config, Snapshot, decide  # noqa: E402
from whalegen.scheduling.snapshot import GpuFacts, UnitFact, gpu_picture  # noqa: E402

MODEL = "H100-80GB"
MEM_MIB = 81_559
LAYOUTS = (
    (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
    (("7g.80gb", 0),),
    tuple(("1g.10gb", i) for i in range(7)),
    (("4g.40gb", 0), ("3g.40gb", 4)),
    (("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)),
)


def _units(rng: random.Random, ids: list[int]) -> tuple[PartitionMode, tuple[UnitFact, ...]]:
    def unit_id() -> int:
        ids[0] += 1
        return ids[0]

    draw = rng.random()
    if draw < 0.4:
        idle = rng.random() < 0.3
        units = []
        for name, start in rng.choice(LAYOUTS):
            profile = profile_by_name(MODEL, name)
            held = not idle and rng.random() < 0.5
            units.append(UnitFact(unit_id(), "mig", profile.gpu_milli, profile.mem_mib, held, name, start))
        return PartitionMode.MIG, tuple(units)
    if draw < 0.7:
        return PartitionMode.WHOLE, (UnitFact(unit_id(), "whole", 1000, MEM_MIB, rng.random() < 0.3),)
    held = rng.randint(0, 2)
    return PartitionMode.SHARED, tuple(
        UnitFact(unit_id(), "mps", 250, MEM_MIB // 4, i < held) for i in range(4)
    )


def build(nodes: int, tasks: int, seed: int) -> Snapshot:
    rng = random.Random(seed)
    ids = [0]
    states: list[NodeState] = []
    free_units, views, idle = {}, {}, {}
    for n in range(nodes):
        name = f"n{n}"
        gpus = []
        for index in range(8):
            mode, units = _units(rng, ids)
            picture = gpu_picture(GpuFacts(name, index, MODEL, MEM_MIB, mode, units))
            gpus.append(picture.state)
            views[(name, index)] = picture.view
            if picture.free_units:
                free_units[(name, index)] = picture.free_units
            if picture.idle_mig is not None:
                idle[(name, index)] = picture.idle_mig
        states.append(NodeState(name, 256_000, 256_000, 2048 * 1024, 2048 * 1024, tuple(gpus)))
    pending = []
    for i in range(tasks):
        num = rng.choice([1, 1, 1, 1, 2, 4])
        milli = rng.choice([143, 250, 286, 429, 500, 1000]) if num == 1 else 1000
        isolation = rng.choice([Isolation.ANY, Isolation.ANY, Isolation.MIG, Isolation.EXCLUSIVE])
        pending.append(
            TaskRequest(
                task_id=f"t{i}",
                cpu_milli=1000,
                mem_mib=1024,
                num_gpu=num,
                gpu_milli=milli,
                gpu_mem_mib=rng.choice([0, 0, 8000]),
                priority=rng.randint(0, 3),
                tenant=rng.choice(["a", "b", "c"]),
                isolation=isolation if num == 1 else Isolation.ANY,
                submitted_at_s=float(i),
            )
        )
    return Snapshot(
        cluster=ClusterSnapshot(tuple(states), tuple(pending), (), ()),
        free_units=free_units,
        gpu_views=views,
        idle_mig=idle,
    )


def measure(snapshot: Snapshot, policy: str) -> dict[str, float]:
    by_id = {t.task_id: t for t in snapshot.cluster.pending}
    gc.disable()  # as the production cycle holds the collector off
    try:
        started = time.process_time()
        solve_cycle(snapshot.cluster, EngineConfig(policy=policy, preemption=False), 0.0)
        engine_s = time.process_time() - started
        started = time.process_time()
        decisions = decide(snapshot, Config(policy=policy, preemption=False), 0.0)
        decide_s = time.process_time() - started
    finally:
        gc.enable()
    return {
        "engine_alone_cpu_s": round(engine_s, 3),
        "decide_cpu_s": round(decide_s, 3),
        "ratio": round(decide_s / engine_s, 2) if engine_s else 0.0,
        "placed": len(decisions.placements),
        "placed_milli": sum(by_id[b.task_id].gpu_request_milli for b in decisions.placements),
        "layouts": len(decisions.layouts),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--policies", default="whalegen,bestfit,fgd")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for seed in range(1, args.seeds + 1):
        snapshot = build(args.nodes, args.tasks, seed)
        for policy in args.policies.split(","):
            print(f"… seed {seed}, {policy}", file=sys.stderr, flush=True)
            rows.append({"seed": seed, "policy": policy, **measure(snapshot, policy)})
    summary = {
        policy: {
            "median_ratio": round(statistics.median(r["ratio"] for r in rows if r["policy"] == policy), 2),
            "decide_cpu_s": round(sum(r["decide_cpu_s"] for r in rows if r["policy"] == policy), 2),
            "placed_milli": sum(r["placed_milli"] for r in rows if r["policy"] == policy),
        }
        for policy in args.policies.split(",")
    }
    if args.json:
        print(json.dumps({"nodes": args.nodes, "tasks": args.tasks, "rows": rows, "summary": summary}))
        return 0
    print(
        f"{'seed':>4} {'policy':<9} {'engine s':>9} {'decide s':>9} {'ratio':>6} {'placed':>6} {'milli':>8}"
    )
    for r in rows:
        print(
            f"{r['seed']:>4} {r['policy']:<9} {r['engine_alone_cpu_s']:>9.3f} {r['decide_cpu_s']:>9.3f}"
            f" {r['ratio']:>6.2f} {r['placed']:>6} {r['placed_milli']:>8}"
        )
    for policy, s in summary.items():
        print(
            f"{policy}: median decide/engine {s['median_ratio']}x, decide {s['decide_cpu_s']} CPU-s in all, "
            f"{s['placed_milli']} milli placed"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
