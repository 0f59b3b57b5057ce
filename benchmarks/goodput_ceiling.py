"""Goodput ceilings of the replay's runs on any fleet file: what no placement passes (docs/goodput.md).

Per fleet, seed and load, on the same jobs as `whalegen replay --goodput --max-jobs N` (the first N of
openb `default` after the stragglers, less the jobs no model of the fleet runs, arrivals scaled to the
load), in % of the fleet's GPU-hours of the window, reference (V100) work as the replay counts it:

- strict (LP): the fluid LP of whalegen/goodput/ceiling.py at `--intervals` cuts (strict: an upper bound
  on every schedule of the replay's physics), with its CPU time; with `--check-intervals K`, also at K
  cuts, the baseline of the same run (more cuts: tighter, slower), and the CPU-time ratio;
- no queue: every job starts on arrival on its fastest model, alone, and runs until the window ends
  (strict, looser: it ignores that GPUs are shared by the jobs);
- best-job capacity: every GPU busy all the time at the speed of its model's best job type (strict);
- mean capacity: every GPU busy at its model's mean speed over the job types (the replay's capacity; not
  strict).

    .venv/bin/python benchmarks/goodput_ceiling.py docs/fleets/default.yaml [more fleet files]
        [--max-jobs 2000] [--seeds 1,2] [--load 0.8,1.0,1.5] [--intervals 16] [--check-intervals 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from whalegen.goodput.ceiling import DEFAULT_MAX_INTERVALS, fleet_ceiling
from whalegen.goodput.data import (
    GAVEL_FILE,
    LUCID_COLOCATE_FILE,
    LUCID_SINGLE_FILE,
    default_traces_dir,
    load_gavel,
    load_lucid_colocate,
    load_lucid_single,
)
from whalegen.goodput.fleet import load_fleet
from whalegen.goodput.interference import fit_utilisation, lucid_observations
from whalegen.goodput.jobs import load_jobs
from whalegen.goodput.replay import ReplayConfig, World, dense_part, fleet_models
from whalegen.goodput.truth import MeasuredPairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("fleets", nargs="+", type=Path, help="fleet files (docs/fleets/*.yaml)")
    parser.add_argument("--max-jobs", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--load", default="0.8,1.0,1.5")
    parser.add_argument("--intervals", type=int, default=DEFAULT_MAX_INTERVALS)
    parser.add_argument("--check-intervals", type=int, default=None)
    args = parser.parse_args()
    traces = default_traces_dir()
    gavel = load_gavel(traces / GAVEL_FILE)
    observations = lucid_observations(
        load_lucid_single(traces / LUCID_SINGLE_FILE), load_lucid_colocate(traces / LUCID_COLOCATE_FILE)
    )
    rule = fit_utilisation(observations)
    pairs = MeasuredPairs.from_lucid(observations)
    head = f"{'fleet':<14} {'seed':>4} {'load':>5} {'jobs':>5} {'strict LP %':>11} {'LP CPU s':>8}"
    if args.check_intervals:
        head += f" {f'LP@{args.check_intervals} %':>10} {'CPU s':>7} {'CPU ratio':>9}"
    print(f"{head} {'no queue %':>10} {'best-job cap. %':>15} {'mean cap. %':>11}")
    for path in args.fleets:
        fleet = load_fleet(path)
        for seed in (int(s) for s in args.seeds.split(",")):
            world = World.build(gavel, rule, fleet_models(fleet), pairs, seed)
            jobs = dense_part(load_jobs(traces / "openb" / "openb_pod_list_default.csv", gavel, seed))
            jobs = jobs[: args.max_jobs]
            for load in (float(x) for x in args.load.split(",")):
                config = ReplayConfig(load=load)
                started = time.process_time()
                bound = fleet_ceiling(fleet, jobs, world, config, args.intervals)
                cpu_s = time.process_time() - started
                line = (
                    f"{fleet.name:<14} {seed:>4} {load:>5g} {bound.jobs:>5} {bound.strict_pct:>11.1f} "
                    f"{cpu_s:>8.2f}"
                )
                if args.check_intervals:
                    started = time.process_time()
                    finer = fleet_ceiling(fleet, jobs, world, config, args.check_intervals)
                    finer_s = time.process_time() - started
                    line += f" {finer.strict_pct:>10.1f} {finer_s:>7.2f} {finer_s / cpu_s:>9.1f}"
                earlier = bound.earlier
                print(
                    f"{line} {earlier.no_queue_pct:>10.1f} {earlier.best_job_capacity_pct:>15.1f} "
                    f"{earlier.mean_capacity_pct:>11.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
