"""Goodput ceilings of the replay's runs: what no placement passes (docs/goodput.md §8, "What limits").

Per fleet, seed and load, on the same jobs as `whalegen replay --goodput --max-jobs N` (the first N of
openb `default` after the stragglers, arrivals scaled to the load), in % of the fleet's GPU-hours of the
window, reference (V100) work as the replay counts it:

- no queue: every job starts on arrival on its fastest model, alone, and runs until the window ends
  (strict: no job runs faster than alone on its best model);
- best-job capacity: every GPU busy all the time at the speed of its model's best job type (strict);
- mean capacity: every GPU busy at its model's mean speed over the job types (the replay's capacity; not
  strict: a placement that always had a fast-on-this-card job could exceed it).

    .venv/bin/python benchmarks/goodput_ceiling.py [--max-jobs 2000] [--seeds 1,2] [--load 0.8,1.0,1.5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

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
from whalegen.goodput.replay import ReplayConfig, World, ceilings, dense_part, fleet_models
from whalegen.goodput.truth import MeasuredPairs

FLEETS = ("docs/fleets/default.yaml", "docs/fleets/holdout.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-jobs", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--load", default="0.8,1.0,1.5")
    args = parser.parse_args()
    traces = default_traces_dir()
    gavel = load_gavel(traces / GAVEL_FILE)
    observations = lucid_observations(
        load_lucid_single(traces / LUCID_SINGLE_FILE), load_lucid_colocate(traces / LUCID_COLOCATE_FILE)
    )
    rule = fit_utilisation(observations)
    pairs = MeasuredPairs.from_lucid(observations)
    head = f"{'fleet':<14} {'seed':>4} {'load':>5} {'no queue %':>11}"
    print(f"{head} {'best-job cap. %':>16} {'mean cap. %':>12}")
    for path in FLEETS:
        fleet = load_fleet(Path(path))
        for seed in (int(s) for s in args.seeds.split(",")):
            world = World.build(gavel, rule, fleet_models(fleet), pairs, seed)
            jobs = dense_part(load_jobs(traces / "openb" / "openb_pod_list_default.csv", gavel, seed))
            jobs = jobs[: args.max_jobs]
            for load in (float(x) for x in args.load.split(",")):
                bound = ceilings(fleet, jobs, world, ReplayConfig(load=load))
                print(
                    f"{fleet.name:<14} {seed:>4} {load:>5g} {bound.no_queue_pct:>11.1f} "
                    f"{bound.best_job_capacity_pct:>16.1f} {bound.mean_capacity_pct:>12.1f}"
                )


if __name__ == "__main__":
    main()
