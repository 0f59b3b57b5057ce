"""Pre-carving idle MIG GPUs ahead of the forecast, off and on in one run (whalegen.sim.migwait).

    python benchmarks/precarve.py --gpus 12 --apply-s 30,120 --initial all-balanced,all-7g [--days 8.3]
        [--forecast oracle,last-hour] [--split-frac 0.7] [--json]

The one-GPU tasks of the openb `default` pod list from the 0.7 quantile of creation times on (the
dynamic replay's test window), on a pool of H100s in MIG mode, through the production `decide`; the same
tasks and the same pool for every variant. Prints MIG tasks' wait (mean, P95), re-carves (for a waiting
task, ahead of the forecast) and allocation per variant; docs/notes/goodput-runs.md has the figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

from whalegen.scheduling.precarve import PrecarveConfig
from whalegen.sim.migwait import forecaster, run_migwait, window_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="12")
    parser.add_argument("--apply-s", default="30")
    parser.add_argument("--initial", default="all-balanced")
    parser.add_argument("--forecast", default="oracle,last-hour")
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--split-frac", type=float, default=0.7, help="the window starts at this quantile")
    parser.add_argument("--max-gpus", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    traces = Path(os.environ.get("WHALEGEN_TRACES_DIR", "../shared/traces"))
    rows = []
    with (traces / "openb" / "openb_pod_list_default.csv").open(newline="") as handle:
        for r in csv.DictReader(handle):
            created = float(r["creation_time"])
            life = float(r["deletion_time"]) - created
            rows.append((r["name"], created, life, int(r["num_gpu"]), int(r["gpu_milli"])))
    tasks = window_tasks(rows, args.split_frac, args.days)
    span_s = max(tasks[-1].arrival_s - tasks[0].arrival_s, 1.0)
    out = []
    for gpus in map(int, args.gpus.split(",")):
        offered = sum(t.runtime_s * t.gpu_milli for t in tasks) / (gpus * 1000 * span_s)
        for initial in args.initial.split(","):
            for apply_s in map(float, args.apply_s.split(",")):
                variants: list[tuple[str, PrecarveConfig | None, str | None]] = [("off", None, None)]
                variants += [
                    (f"on/{f}", PrecarveConfig(max_gpus=args.max_gpus), f) for f in args.forecast.split(",")
                ]
                for label, config, kind in variants:
                    result = run_migwait(
                        tasks,
                        gpus=gpus,
                        initial=initial,
                        apply_s=apply_s,
                        precarve=config,
                        forecast=forecaster(tasks, kind) if kind else None,
                        label=label,
                    )
                    row = {"gpus": gpus, "offered": round(offered, 3), "initial": initial, "apply_s": apply_s}
                    row |= result.to_json()
                    out.append(row)
                    if not args.json:
                        r = result
                        print(
                            f"{gpus:3d} GPUs (offered {offered:.2f}) {initial:13s} apply {apply_s:5.0f} s "
                            f"{label:14s} wait mean {r.mean_wait_s:9.1f} s P95 {r.p95_wait_s:9.1f} s | "
                            f"MIG-fraction tasks mean {r.mean_wait_frac_s:8.1f} P95 "
                            f"{r.p95_wait_frac_s:8.1f} | waited for a layout {r.waited_for_layout:4d} "
                            f"re-carves {r.recarves_last_resort:4d}+{r.recarves_ahead:4d} ahead | "
                            f"alloc {r.allocated_pct:5.1f}% used {r.used_pct:5.1f}% cpu {r.cpu_s:5.1f} s",
                            flush=True,
                        )
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
