"""`whalegen replay --dynamic`: arrivals and departures over trace time (whalegen/sim/dynamic.py).

    whalegen replay --dynamic --policy fgd,whalegen,whalegen+forecast --forecast oracle,model \\
        --cluster-frac 0.008 --seeds 42 --plot dynamic.png

Kept apart from `replay.py` so the static protocol's module stays as it is; `replay.py` hands over here
when `--dynamic` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.registry import make_policy
from whalegen.placement.types import NodeState, TaskRequest
from whalegen.sim.dynamic import (
    FORECAST_SUFFIX,
    RESERVE_SUFFIX,
    DynamicResult,
    TimedTask,
    load_timed_tasks,
    model_predictions,
    oracle_predictions,
    run_dynamic,
    sample_cluster,
    split_time,
    trace_window,
)
from whalegen.sim.stats import mean
from whalegen.sim.trace import NODE_FILE, load_nodes, pod_file

FORECASTS = ("none", "oracle", "model", "model-p90")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dynamic replay (--dynamic)")
    group.add_argument("--dynamic", action="store_true", help="replay arrivals and departures over time")
    group.add_argument(
        "--forecast",
        default="oracle,model",
        help="for POLICY+forecast and POLICY+reserve: none, oracle (true run time), model (P50 of the "
        "duration model), model-p90 (its P90); comma-separated, one run each",
    )
    group.add_argument("--cluster-frac", type=float, default=1.0, help="share of nodes drawn per seed")
    group.add_argument(
        "--split-frac",
        type=float,
        default=0.7,
        help="replay the tasks after this share of submissions (the duration model trains before it)",
    )
    group.add_argument("--queue-window", type=int, default=32, help="queued tasks retried per event")
    group.add_argument(
        "--align-slack",
        type=float,
        default=0.0,
        help="POLICY+forecast: score points below the best still aligned on (0: exact ties)",
    )


def run(args: argparse.Namespace, traces: Path) -> int:
    """1. check the inputs, 2. load the trace and its forecasts, 3. replay every run, 4. report."""
    node_path = traces / NODE_FILE
    pod_path = traces / pod_file(args.workload)
    for path in (node_path, pod_path):
        if not path.is_file():
            print(f"whalegen replay: {path} not found", file=sys.stderr)
            return 2
    parsed = _parse_runs(args)
    if isinstance(parsed, str):
        print(f"whalegen replay: {parsed}", file=sys.stderr)
        return 2
    forecasts, runs = parsed
    trace = _load_trace(args, node_path, pod_path, forecasts, runs)
    results = _replay_runs(args, trace, runs)
    if args.plot:
        plot(args.plot, args.workload, results)
    if args.json:
        _print_json(args, trace, results)
        return 0
    groups = list(dict.fromkeys((r.policy, r.forecast) for r in results))
    _print_tables(args, trace, results, groups)
    _print_paired(results, groups)
    return 0


def _parse_runs(args: argparse.Namespace) -> tuple[list[str], list[tuple[str, str]]] | str:
    """The forecasts asked for and the (policy, forecast) runs they make, or what is wrong with them:
    a plain policy runs once without a forecast, a +forecast or +reserve policy once per forecast."""
    forecasts = [f.strip() for f in args.forecast.split(",") if f.strip()]
    unknown = [f for f in forecasts if f not in FORECASTS]
    if unknown or not forecasts:
        return f"--forecast takes {', '.join(FORECASTS)}"
    runs: list[tuple[str, str]] = []
    for policy in (p.strip() for p in args.policy.split(",") if p.strip()):
        try:
            make_policy(policy.removesuffix(RESERVE_SUFFIX).removesuffix(FORECAST_SUFFIX))
        except ValueError as error:
            return str(error)
        if policy.endswith((FORECAST_SUFFIX, RESERVE_SUFFIX)):
            runs += [(policy, f) for f in forecasts]
        else:
            runs.append((policy, "none"))
    return forecasts, runs


@dataclass(frozen=True)
class _Trace:
    """What every run replays: the nodes, the window after the split, the static mix's history (the
    tasks before the window) and each forecast's predicted run times."""

    nodes: tuple[NodeState, ...]
    split_s: float
    window: tuple[TimedTask, ...]
    history: list[TaskRequest]
    predictions: dict[str, dict[str, float]]


def _load_trace(
    args: argparse.Namespace,
    node_path: Path,
    pod_path: Path,
    forecasts: list[str],
    runs: list[tuple[str, str]],
) -> _Trace:
    nodes = load_nodes(node_path)
    tasks = load_timed_tasks(pod_path)
    split_s = split_time(tasks, args.split_frac)
    window = trace_window(tasks, split_s)
    history = [t.request for t in tasks if t.creation_s < split_s] or [t.request for t in window]
    predictions: dict[str, dict[str, float]] = {"none": {}}
    if "oracle" in forecasts:
        predictions["oracle"] = oracle_predictions(window)
    for name, quantile in (("model", 0), ("model-p90", 1)):
        if any(f == name for _, f in runs):
            print(f"training the duration model ({name}) on the tasks before the window …", file=sys.stderr)
            predictions[name] = model_predictions(pod_path, split_s, window, quantile)
    return _Trace(nodes, split_s, window, history, predictions)


def _replay_runs(args: argparse.Namespace, trace: _Trace, runs: list[tuple[str, str]]) -> list[DynamicResult]:
    """One run per (policy, forecast, seed), sequentially (the runs are cheap on a sampled cluster)."""
    results: list[DynamicResult] = []
    started = time.perf_counter()
    total = len(runs) * len(args.seeds)
    for seed in args.seeds:
        cluster = sample_cluster(trace.nodes, args.cluster_frac, seed)
        for policy, forecast in runs:
            label = f"[{len(results) + 1}/{total}] {policy} ({forecast}) seed {seed}"

            def progress(i: int, n: int, label: str = label) -> None:
                elapsed = time.perf_counter() - started
                print(f"{label}: {i}/{n} arrivals, {elapsed:.0f} s", file=sys.stderr, flush=True)

            mix = shape_mix_from_tasks(trace.history, with_memory=policy.startswith("whalegen"))
            results.append(
                run_dynamic(
                    cluster,
                    trace.window,
                    policy,
                    seed,
                    mix=mix,
                    predicted_s=trace.predictions[forecast],
                    forecast=forecast,
                    queue_window=args.queue_window,
                    align_slack=args.align_slack,
                    on_progress=progress,
                )
            )
    return results


def _print_json(args: argparse.Namespace, trace: _Trace, results: list[DynamicResult]) -> None:
    out = {
        "workload": args.workload,
        "cluster_frac": args.cluster_frac,
        "split_s": trace.split_s,
        "tasks": len(trace.window),
        "runs": [
            {k: v for k, v in asdict(r).items() if not k.startswith("series") and k != "start_s"}
            for r in results
        ],
    }
    print(json.dumps(out, indent=2))


def _print_tables(
    args: argparse.Namespace,
    trace: _Trace,
    results: list[DynamicResult],
    groups: list[tuple[str, str]],
) -> None:
    """Two tables of means over the seeds, one row per (policy, forecast): allocation and waits; then
    large and small tasks, and the start estimates queued tasks were shown."""
    first = results[0]
    print(
        f"dynamic replay, workload {args.workload}: {len(trace.window)} tasks from t={trace.split_s:.0f} s "
        f"(split {args.split_frac}), horizon {first.horizon_s / 86400:.2f} days; "
        f"cluster {args.cluster_frac:g} of the nodes "
        f"({first.nodes} nodes, {first.gpus} GPUs for seed {first.seed}); "
        f"queue window {args.queue_window}; mean over seeds {', '.join(map(str, args.seeds))}"
    )
    head = (
        "| policy | forecast | alloc % | offered % | mean wait h | P95 wait h | not started by end "
        "| not started GPU-h | never started | makespan d | CPU s/run |"
    )
    print(head)
    print("|" + "---|" * 11)
    for policy, forecast in groups:
        rs = [r for r in results if (r.policy, r.forecast) == (policy, forecast)]
        cells = [
            f"{mean([r.alloc_pct for r in rs]):.2f}",
            f"{mean([r.offered_pct for r in rs]):.2f}",
            f"{mean([r.mean_delay_s for r in rs]) / 3600:.2f}",
            f"{mean([r.p95_delay_s for r in rs]) / 3600:.2f}",
            f"{mean([r.not_started for r in rs]):.1f}",
            f"{mean([r.not_started_gpu_h for r in rs]):.0f}",
            f"{mean([r.never_started for r in rs]):.1f}",
            f"{mean([r.makespan_s for r in rs]) / 86400:.2f}",
            f"{mean([r.cpu_seconds for r in rs]):.1f}",
        ]
        print(f"| {policy} | {forecast} | " + " | ".join(cells) + " |")
    print()
    print(
        "| policy | forecast | large started | large P95 wait h | small mean wait h | queued | estimated "
        "| estimate MAE h | estimate median abs h | without queue: node MAE h | capacity MAE h | reserved "
        "| reserved with start | reserved start MAE h |"
    )
    print("|" + "---|" * 14)
    for policy, forecast in groups:
        rs = [r for r in results if (r.policy, r.forecast) == (policy, forecast)]
        cells = [
            f"{mean([r.large_started for r in rs]):.1f}",
            f"{mean([r.large_p95_delay_s for r in rs]) / 3600:.2f}",
            f"{mean([r.small_mean_delay_s for r in rs]) / 3600:.2f}",
            f"{mean([r.queued for r in rs]):.1f}",
            f"{mean([r.estimated for r in rs]):.1f}",
            f"{mean([r.estimate_mae_s for r in rs if r.estimated]) / 3600:.2f}",
            f"{mean([r.estimate_median_abs_s for r in rs if r.estimated]) / 3600:.2f}",
            f"{mean([r.estimate_alone_mae_s for r in rs if r.estimated]) / 3600:.2f}",
            f"{mean([r.estimate_capacity_alone_mae_s for r in rs if r.estimated]) / 3600:.2f}",
            f"{mean([r.reserved for r in rs]):.1f}",
            f"{mean([r.reserved_with_start for r in rs]):.1f}",
            f"{mean([r.reserve_mae_s for r in rs if r.reserved_with_start]) / 3600:.2f}",
        ]
        print(f"| {policy} | {forecast} | " + " | ".join(cells) + " |")
    print()


def _print_paired(results: list[DynamicResult], groups: list[tuple[str, str]]) -> None:
    """Each row against the first, paired by seed: the seeds' clusters differ far more than the
    policies do."""
    base = [r for r in results if (r.policy, r.forecast) == groups[0]]
    for policy, forecast in groups[1:]:
        rs = [r for r in results if (r.policy, r.forecast) == (policy, forecast)]
        pairs = list(zip(base, rs, strict=True))
        more = sum(r.alloc_pct > b.alloc_pct + 1e-9 for b, r in pairs)
        less = sum(r.alloc_pct < b.alloc_pct - 1e-9 for b, r in pairs)
        shorter = sum(r.mean_delay_s < b.mean_delay_s - 1e-9 for b, r in pairs)
        longer = sum(r.mean_delay_s > b.mean_delay_s + 1e-9 for b, r in pairs)
        large_shorter = sum(r.large_p95_delay_s < b.large_p95_delay_s - 1e-9 for b, r in pairs)
        large_longer = sum(r.large_p95_delay_s > b.large_p95_delay_s + 1e-9 for b, r in pairs)
        small_shorter = sum(r.small_mean_delay_s < b.small_mean_delay_s - 1e-9 for b, r in pairs)
        small_longer = sum(r.small_mean_delay_s > b.small_mean_delay_s + 1e-9 for b, r in pairs)
        print(
            f"{policy} ({forecast}) vs {groups[0][0]} ({groups[0][1]}), {len(pairs)} seeds: "
            f"allocation higher on {more}, lower on {less}; "
            f"mean wait shorter on {shorter}, longer on {longer}; "
            f"large P95 wait shorter on {large_shorter}, longer on {large_longer}; "
            f"small mean wait shorter on {small_shorter}, longer on {small_longer}"
        )


def plot(path: Path, workload: str, results: Sequence[DynamicResult]) -> None:
    """Allocated GPU % over time, one line per (policy, forecast), first seed only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed = results[0].seed
    fig, ax = plt.subplots(figsize=(12, 5))
    for r in results:
        if r.seed != seed:
            continue
        days = [t / 86400 for t in r.series_t_s]
        ax.plot(
            days, r.series_alloc_pct, linewidth=1.0, label=f"{r.policy} ({r.forecast}): {r.alloc_pct:.2f} %"
        )
    ax.set_xlabel("days since the window's first arrival")
    ax.set_ylabel("allocated GPU, % of capacity")
    ax.set_title(
        f"openb {workload}, dynamic replay: {results[0].nodes} nodes, {results[0].gpus} GPUs, seed {seed}"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
