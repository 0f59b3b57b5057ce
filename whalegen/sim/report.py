"""Summaries of replay runs: the table, the JSON object and the curves CSV of `whalegen replay`."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whalegen.sim.replay import MAX_PCT, RunResult


@dataclass(frozen=True)
class Stat:
    mean: float
    sd: float

    @staticmethod
    def of(values: Sequence[float]) -> Stat:
        return Stat(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)

    def text(self) -> str:
        return f"{self.mean:6.2f} ± {self.sd:4.2f}"

    def as_dict(self) -> dict[str, float]:
        return {"mean": round(self.mean, 4), "sd": round(self.sd, 4)}


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    unallocated_at_100: Stat
    unallocated_at_130: Stat
    frag_at_100: Stat
    failed_tasks: Stat
    cpu_seconds_per_run: float
    wall_seconds_per_run: float
    runs: tuple[RunResult, ...]


def summarize(policy: str, runs: Sequence[RunResult]) -> PolicySummary:
    ordered = tuple(sorted(runs, key=lambda r: r.seed))
    return PolicySummary(
        policy=policy,
        unallocated_at_100=Stat.of([r.at(r.unallocated_pct, 100) for r in ordered]),
        unallocated_at_130=Stat.of([r.at(r.unallocated_pct, MAX_PCT) for r in ordered]),
        frag_at_100=Stat.of([r.at(r.frag_amount_pct, 100) for r in ordered]),
        failed_tasks=Stat.of([float(r.failed_tasks) for r in ordered]),
        cpu_seconds_per_run=statistics.fmean(r.cpu_seconds for r in ordered),
        wall_seconds_per_run=statistics.fmean(r.seconds for r in ordered),
        runs=ordered,
    )


def table(summaries: Sequence[PolicySummary]) -> str:
    header = (
        f"{'policy':<14} {'unalloc% @100':>15} {'unalloc% @130':>15} {'frag% @100':>15} "
        f"{'failed tasks':>14} {'s/run':>6}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        lines.append(
            f"{s.policy:<14} {s.unallocated_at_100.text():>15} {s.unallocated_at_130.text():>15} "
            f"{s.frag_at_100.text():>15} {s.failed_tasks.mean:>14.0f} {s.cpu_seconds_per_run:>6.2f}"
        )
    return "\n".join(lines)


def as_json(workload: str, nodes: int, gpus: int, summaries: Sequence[PolicySummary]) -> dict[str, Any]:
    return {
        "workload": workload,
        "nodes": nodes,
        "gpus": gpus,
        "policies": {
            s.policy: {
                "unallocated_pct_at_100": s.unallocated_at_100.as_dict(),
                "unallocated_pct_at_130": s.unallocated_at_130.as_dict(),
                "frag_pct_at_100": s.frag_at_100.as_dict(),
                "failed_tasks": s.failed_tasks.as_dict(),
                "seconds_per_run": round(s.cpu_seconds_per_run, 3),
                "wall_seconds_per_run": round(s.wall_seconds_per_run, 3),
                "runs": [
                    {
                        "seed": r.seed,
                        "tasks": r.tasks,
                        "unallocated_pct_at_100": round(r.at(r.unallocated_pct, 100), 4),
                        "unallocated_pct_at_130": round(r.at(r.unallocated_pct, MAX_PCT), 4),
                        "frag_pct_at_100": round(r.at(r.frag_amount_pct, 100), 4),
                        "failed_tasks": r.failed_tasks,
                        "seconds": round(r.cpu_seconds, 3),
                    }
                    for r in s.runs
                ],
            }
            for s in summaries
        },
    }


CURVES = (
    ("unallocated_gpu_pct", "unallocated_pct"),
    ("frag_amount_pct", "frag_amount_pct"),
    (
        "frag_ratio_pct",
        "frag_ratio_pct",
    ),
)


def write_curves(path: Path, workload: str, summaries: Sequence[PolicySummary]) -> None:
    """One row per run and metric, one column per arrived % (0 … 130), like the authors' merged CSVs."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["workload", "policy", "seed", "metric", *range(MAX_PCT + 1)])
        for s in summaries:
            for run in s.runs:
                for metric, attribute in CURVES:
                    values = getattr(run, attribute)
                    writer.writerow(
                        [
                            workload,
                            s.policy,
                            run.seed,
                            metric,
                            *("" if v is None else f"{v:.4f}" for v in values),
                        ]
                    )
