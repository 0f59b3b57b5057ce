"""`whalegen replay --goodput`: policies compared on work done, on a fleet file (docs/goodput.md).

    whalegen replay --goodput --fleet docs/fleets/default.yaml \\
        --policy k8s-default,volcano-binpack,share-binpack,fgd,whalegen,whalegen-aware \\
        --seeds 1 --load 0.8,1.0,1.5 [--jobs default|gpuspec10|FILE.csv] [--services N] [--json] [--plot F]

A policy name may carry replay options after "+": `whalegen-aware+headroom` (the online headroom sized
from the services' forecast), `whalegen-aware+oracle` (true job profiles instead of learned ones).

Progress on stderr; a table (or `--json`) on stdout. Figures are means over the seeds.

`--ceiling` also solves the strict fluid ceiling per seed and load (whalegen.goodput.ceiling; printed
beside the no-queue bound) and adds the headline fields per policy and load (whalegen.goodput.headline:
`gap_closed` from k8s-default to the ceiling, with its prices), and their table (stderr under `--json`).
`--drain-factor` lets the replay run on after the window until every job finished (for
`gpu_hours_to_finish`), up to that many windows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whalegen.goodput.ceiling import DEFAULT_MAX_INTERVALS, FleetCeiling, fleet_ceiling
from whalegen.goodput.data import (
    GAVEL_FILE,
    LUCID_COLOCATE_FILE,
    LUCID_SINGLE_FILE,
    TraceFileMissing,
    default_traces_dir,
    load_gavel,
    load_lucid_colocate,
    load_lucid_single,
)
from whalegen.goodput.fleet import FleetError, FleetSpec, load_fleet
from whalegen.goodput.headline import Headline, headline_table, headlines
from whalegen.goodput.interference import fit_utilisation, lucid_observations
from whalegen.goodput.jobs import Job, draw_services, load_jobs, load_service_profiles
from whalegen.goodput.replay import (
    ReplayConfig,
    RunResult,
    World,
    dense_part,
    fleet_models,
    refuse_unrunnable,
    run_goodput,
    split_policy,
)
from whalegen.goodput.truth import MeasuredPairs
from whalegen.placement.registry import make_policy
from whalegen.sim.stats import mean

METRICS = (
    "goodput_pct",
    "allocated_pct",
    "busy_pct",
    "sla_violation_pct",
    "mean_jct_h",
    "p95_jct_h",
    "p95_wait_h",
    "preemptions",
    "work_lost_gpu_h",
)
# Reported in --json next to METRICS (not in the table's columns).
EXTRA = (
    "offered_pct",
    "ceiling_pct",
    "headroom_gpus_mean",
    "service_preemptions",
    "work_done_ref_gpu_h",
    "work_retained_ref_gpu_h",
    "refused_jobs",
)
DEFAULT_POLICIES = "k8s-default,volcano-binpack,share-binpack,fgd,whalegen,whalegen-aware"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("goodput replay (--goodput)")
    group.add_argument(
        "--goodput", action="store_true", help="compare policies on work done (docs/goodput.md)"
    )
    group.add_argument("--fleet", type=Path, help="fleet YAML (docs/fleets/default.yaml)")
    group.add_argument("--load", default="1.0", help="offered work over capacity, e.g. 0.8,1.0,1.5")
    group.add_argument("--services", type=int, default=None, help="online services (default: GPUs / 9)")
    group.add_argument("--max-jobs", type=int, default=None, help="only the first N jobs of the source")
    group.add_argument(
        "--service-milli", type=int, default=500, help="GPU milli each service asks (default 500)"
    )
    group.add_argument(
        "--static-services",
        action="store_true",
        help="every service from t = 0 to the end (default: they arrive and leave over the window)",
    )
    group.add_argument(
        "--ceiling",
        action="store_true",
        help="solve the strict fluid ceiling and report the headline (gap closed and its prices)",
    )
    group.add_argument(
        "--ceiling-intervals",
        type=int,
        default=DEFAULT_MAX_INTERVALS,
        help=f"time cuts of the ceiling's LP (default {DEFAULT_MAX_INTERVALS}; more: tighter and slower)",
    )
    group.add_argument(
        "--drain-factor",
        type=float,
        default=ReplayConfig.drain_factor,
        help="run on after the window up to this many windows (default 2; larger lets every job finish)",
    )


def _loads(text: str) -> list[float]:
    loads = [float(x) for x in text.split(",") if x.strip()]
    if not loads or any(x <= 0 for x in loads):
        raise ValueError(f"--load: positive numbers, comma-separated, got {text!r}")
    return loads


def _job_source(value: object, traces: Path) -> Path:
    text = "default" if value is None or isinstance(value, int) else str(value)
    path = Path(text)
    if path.suffix == ".csv":
        return path
    return traces / "openb" / f"openb_pod_list_{text}.csv"


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.fleet is None:
        print("whalegen replay --goodput: --fleet FILE is required", file=sys.stderr)
        return 2
    try:
        loads = _loads(args.load)
        if args.ceiling_intervals < 1 or args.drain_factor < 1:
            raise ValueError("--ceiling-intervals and --drain-factor: at least 1")
        if not 0 < args.service_milli <= 1000:
            raise ValueError(f"--service-milli: 1 … 1000 (one GPU), got {args.service_milli}")
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        for policy in policies:
            make_policy(split_policy(policy)[0])
        fleet = load_fleet(args.fleet)
    except (ValueError, FleetError) as error:
        print(f"whalegen replay --goodput: {error}", file=sys.stderr)
        return 2
    traces = args.traces or default_traces_dir()
    source = _job_source(args.jobs, traces)
    try:
        gavel = load_gavel(traces / GAVEL_FILE)
        observations = lucid_observations(
            load_lucid_single(traces / LUCID_SINGLE_FILE),
            load_lucid_colocate(traces / LUCID_COLOCATE_FILE),
        )
        rule = fit_utilisation(observations)
        pairs = MeasuredPairs.from_lucid(observations)
        count = args.services if args.services is not None else max(1, fleet.total_gpus // 9)
        profiles = load_service_profiles(traces) if count > 0 else ()
    except (TraceFileMissing, ValueError) as error:
        print(f"whalegen replay --goodput: {error}", file=sys.stderr)
        return 2
    results: list[RunResult] = []
    bounds: dict[tuple[int, float], FleetCeiling] = {}
    runs = len(loads) * len(args.seeds) * len(policies)
    done = 0
    for seed in args.seeds:
        try:
            jobs = dense_part(load_jobs(source, gavel, seed))
            services = draw_services(profiles, min(count, len(profiles)), seed)
        except (TraceFileMissing, ValueError) as error:
            print(f"whalegen replay --goodput: {error}", file=sys.stderr)
            return 2
        if args.max_jobs is not None:
            jobs = jobs[: args.max_jobs]
        # The truth's drawn speed errors follow the seed (whalegen.goodput.truth).
        world = World.build(gavel, rule, fleet_models(fleet), pairs, seed)
        jobs, refused = refuse_unrunnable(jobs, fleet, world)
        for line in refused:
            print(f"whalegen replay --goodput: {line}", file=sys.stderr)
        if args.ceiling:
            bounds.update(_ceilings(fleet, jobs, world, seed, loads, args.ceiling_intervals))
        for load in loads:
            for policy in policies:
                label = f"{policy} seed {seed} load {load:g}"

                def show(fraction: float, label: str = label, done: int = done) -> None:
                    elapsed = time.perf_counter() - started
                    print(
                        f"  {done}/{runs} runs, {elapsed:4.0f} s: {label} {100 * fraction:3.0f} %",
                        file=sys.stderr,
                    )

                show(0.0)
                results.append(
                    run_goodput(
                        fleet,
                        jobs,
                        services,
                        world,
                        policy,
                        seed,
                        ReplayConfig(
                            load=load,
                            service_churn=not args.static_services,
                            service_milli=args.service_milli,
                            drain_factor=args.drain_factor,
                        ),
                        show,
                    )
                )
                done += 1
    print(f"  {done}/{runs} runs, {time.perf_counter() - started:.0f} s: done", file=sys.stderr)
    if args.plot:
        plot(args.plot, fleet.name, results, policies, loads)
    document = as_json(fleet.name, fleet.total_gpus, results, policies, loads, args.seeds)
    by_load = add_headline(document, results, bounds, loads) if args.ceiling else None
    print(json.dumps(document, indent=2) if args.json else table(document))
    if by_load is not None:
        print(headline_table(by_load), file=sys.stderr if args.json else sys.stdout)
    return 0


def _ceilings(
    fleet: FleetSpec, jobs: Sequence[Job], world: World, seed: int, loads: Sequence[float], intervals: int
) -> dict[tuple[int, float], FleetCeiling]:
    out = {}
    for load in loads:
        print(f"  strict ceiling, seed {seed} load {load:g}", file=sys.stderr)
        out[(seed, load)] = fleet_ceiling(fleet, jobs, world, ReplayConfig(load=load), intervals)
    return out


def add_headline(
    document: dict[str, Any],
    results: Sequence[RunResult],
    bounds: dict[tuple[int, float], FleetCeiling],
    loads: Sequence[float],
) -> dict[str, dict[str, Headline]]:
    """Per load: the ceiling (strict, and the no-queue bound beside it; means over the seeds) and each
    policy's headline fields, added to the document's entries; returns the headlines for the table."""
    entries = document.get("loads") or {f"{loads[0]:g}": document}
    by_load = {}
    for load in loads:
        entry = entries[f"{load:g}"]
        mine = [b for (_, at), b in bounds.items() if at == load]
        strict = mean([b.strict_pct for b in mine])
        entry["ceiling"] = {
            "strict_pct": round(strict, 3),
            "no_queue_pct": round(mean([b.earlier.no_queue_pct for b in mine]), 3),
            "intervals": mine[0].strict.intervals if mine else 0,
            "lp_variables": round(mean([b.strict.variables for b in mine])),
        }
        by_load[f"{load:g}"] = headlines([r for r in results if r.load == load], strict)
        for policy, figures in by_load[f"{load:g}"].items():
            entry["policies"][policy].update(figures.as_json())
    return by_load


def summary(results: Sequence[RunResult]) -> dict[str, Any]:
    out: dict[str, Any] = {m: round(mean([getattr(r, m) for r in results]), 3) for m in METRICS}
    out.update({m: round(mean([getattr(r, m) for r in results]), 3) for m in EXTRA})
    out["preemptions"] = round(mean([r.preemptions for r in results]), 1)
    out["finished_jobs"] = round(mean([r.finished for r in results]), 1)
    out["cpu_s"] = round(mean([r.cpu_s for r in results]), 2)
    if results and results[0].reasons:
        out["reasons_sample"] = [f"{t}: {why}" for t, why in results[0].reasons[:5]]
    return out


def as_json(
    fleet: str,
    gpus: int,
    results: Sequence[RunResult],
    policies: Sequence[str],
    loads: Sequence[float],
    seeds: Sequence[int],
) -> dict[str, Any]:
    by_load: dict[str, Any] = {}
    for load in loads:
        chosen = [r for r in results if r.load == load]
        by_load[f"{load:g}"] = {
            "window_h": round(mean([r.window_h for r in chosen]), 2),
            "policies": {p: summary([r for r in chosen if r.policy == p]) for p in policies},
        }
    first = by_load[f"{loads[0]:g}"]
    document: dict[str, Any] = {
        "fleet": fleet,
        "gpus": gpus,
        "seeds": list(seeds),
        "load": loads[0],
        "policies": first["policies"],
    }
    if len(loads) > 1:
        document["loads"] = by_load
    return document


def table(document: dict[str, Any]) -> str:
    loads = document.get("loads") or {f"{document['load']:g}": {"policies": document["policies"]}}
    lines = [f"fleet {document['fleet']}: {document['gpus']} GPUs; seeds {document['seeds']}"]
    header = f"{'load':>5} {'policy':<16}" + "".join(f"{m:>18}" for m in METRICS)
    lines.append(header)
    for load, entry in loads.items():
        for policy, figures in entry["policies"].items():
            lines.append(f"{load:>5} {policy:<16}" + "".join(f"{figures[m]:>18.2f}" for m in METRICS))
    return "\n".join(lines)


def plot(
    path: Path, fleet: str, results: Sequence[RunResult], policies: Sequence[str], loads: Sequence[float]
) -> None:
    """Goodput and SLA violations against load (left), and over time at the highest load (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for policy in policies:
        mine = [r for r in results if r.policy == policy]
        xs = list(loads)
        axes[0][0].plot(
            xs, [mean([r.goodput_pct for r in mine if r.load == x]) for x in xs], marker="o", label=policy
        )
        axes[1][0].plot(
            xs,
            [mean([r.sla_violation_pct for r in mine if r.load == x]) for x in xs],
            marker="o",
            label=policy,
        )
        top = [r for r in mine if r.load == max(loads)]
        if top:
            bins = len(top[0].series_goodput_pct)
            t = [top[0].window_h * (i + 0.5) / bins for i in range(bins)]
            axes[0][1].plot(
                t, [mean([r.series_goodput_pct[i] for r in top]) for i in range(bins)], label=policy
            )
            axes[1][1].plot(
                t, [mean([r.series_sla_violation_pct[i] for r in top]) for i in range(bins)], label=policy
            )
    axes[0][0].set_ylabel("goodput, % of GPU-hours (reference V100 work)")
    axes[1][0].set_ylabel("SLA-violating service-minutes, %")
    for ax in (axes[1][0],):
        ax.set_xlabel("load (offered work / capacity)")
    axes[1][1].set_xlabel(f"hours into the window (load {max(loads):g})")
    axes[0][0].set_title(f"{fleet}: against load")
    axes[0][1].set_title(f"{fleet}: over time at load {max(loads):g}")
    for row in axes:
        for ax in row:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
