"""`whalegen replay`: the FGD paper's trace protocol through the production placement engine.

    whalegen replay --workload default --policy fgd,bestfit,whalegen --seeds 42-51 --jobs 2 \\
        --curves curves.csv --plot unallocated.png

DIR (`--traces`) holds `openb_node_list_gpu_node.csv` and `openb_pod_list_<NAME>.csv`; it defaults to
$WHALEGEN_TRACES_DIR/openb, else /work/shared/traces/openb. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from multiprocessing import Pool
from pathlib import Path

from whalegen.commands import _dynamic, _goodput, _scenario
from whalegen.placement.registry import make_policy
from whalegen.placement.types import NodeState, TaskRequest
from whalegen.sim.replay import MAX_PCT, RunResult, run_replay
from whalegen.sim.report import PolicySummary, as_json, summarize, table, write_curves
from whalegen.sim.trace import NODE_FILE, load_nodes, load_tasks, pod_file

FALLBACK_TRACES = Path("/work/shared/traces")


def default_traces() -> Path:
    root = os.environ.get("WHALEGEN_TRACES_DIR")
    return (Path(root) if root else FALLBACK_TRACES) / "openb"


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `42,43,50` or a mix (`42-45,50`)."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = (int(x) for x in part.split("-", 1))
            if high < low:
                raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
            seeds.extend(range(low, high + 1))
        elif part:
            seeds.append(int(part))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", type=Path, default=None, help="folder with the openb CSVs")
    parser.add_argument("--workload", default="default", help="NAME in openb_pod_list_<NAME>.csv")
    parser.add_argument("--policy", default="fgd,whalegen", help="comma-separated policy names")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"), help="e.g. 42-51")
    parser.add_argument(
        "--jobs", type=_jobs, default=1, help="worker processes (default 1); with --goodput: the job source"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--curves", type=Path, help="write every run's curves (arrived 0…130 %%) to CSV")
    parser.add_argument("--plot", type=Path, help="draw unallocated GPU %% against arrived %% to a PNG")
    _dynamic.add_arguments(parser)
    _scenario.add_arguments(parser)
    _goodput.add_arguments(parser)


def _jobs(text: str) -> int | str:
    """A worker count, or (for --goodput) a job source: an openb workload name or a CSV path."""
    return int(text) if text.isdigit() else text


_NODES: tuple[NodeState, ...] = ()
_TASKS: tuple[TaskRequest, ...] = ()


def _load(node_path: Path, pod_path: Path) -> None:
    global _NODES, _TASKS
    _NODES = load_nodes(node_path)
    _TASKS = load_tasks(pod_path)


def _one(job: tuple[str, int]) -> RunResult:
    policy, seed = job
    return run_replay(_NODES, _TASKS, policy, seed)


class _Progress:
    """A one-line progress bar on stderr: runs done, with the current run's share when running alone."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def show(self, label: str, fraction: float = 0.0) -> None:
        filled = (self.done + fraction) / self.total
        bar = "#" * int(30 * filled)
        elapsed = time.perf_counter() - self.started
        line = f"[{bar:<30}] {self.done}/{self.total} runs  {elapsed:5.0f} s  {label}"
        if self.tty:
            print(f"\r{line:<100}", end="", file=sys.stderr, flush=True)
        elif fraction == 0.0:
            print(line, file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.goodput:
        return _goodput.run(args)
    if not isinstance(args.jobs, int):
        print(
            f"whalegen replay: --jobs {args.jobs}: a worker count (a job source needs --goodput)",
            file=sys.stderr,
        )
        return 2
    if args.scenario is not None or args.from_pool is not None:
        return _scenario.run(args)
    traces: Path = args.traces or default_traces()
    if args.dynamic:
        return _dynamic.run(args, traces)
    node_path = traces / NODE_FILE
    pod_path = traces / pod_file(args.workload)
    for path in (node_path, pod_path):
        if not path.is_file():
            print(f"whalegen replay: {path} not found", file=sys.stderr)
            return 2
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    try:
        for policy in policies:
            make_policy(policy)
    except ValueError as error:
        print(f"whalegen replay: {error}", file=sys.stderr)
        return 2
    _load(node_path, pod_path)
    jobs = [(policy, seed) for policy in policies for seed in args.seeds]
    progress = _Progress(len(jobs))
    results: list[RunResult] = []
    if args.jobs <= 1:
        for policy, seed in jobs:
            label = f"{policy} seed {seed}"
            progress.show(label)
            results.append(
                run_replay(
                    _NODES, _TASKS, policy, seed, on_progress=lambda i, n, lb=label: progress.show(lb, i / n)
                )
            )
            progress.done += 1
    else:
        with Pool(args.jobs, initializer=_load, initargs=(node_path, pod_path)) as pool:
            progress.show("starting")
            for result in pool.imap_unordered(_one, jobs):
                results.append(result)
                progress.done += 1
                progress.show(f"{result.policy} seed {result.seed} done")
    progress.show("done")
    progress.finish()
    summaries = [summarize(p, [r for r in results if r.policy == p]) for p in policies]
    gpus = sum(len(node.gpus) for node in _NODES)
    if args.curves:
        write_curves(args.curves, args.workload, summaries)
    if args.plot:
        plot(args.plot, args.workload, summaries)
    if args.json:
        print(json.dumps(as_json(args.workload, len(_NODES), gpus, summaries), indent=2))
    else:
        print(f"workload {args.workload}: {len(_NODES)} nodes, {gpus} GPUs; {seeds_text(args.seeds)}")
        print(
            "unallocated GPU % and fragmentation (amount, % of capacity): mean ± sd over seeds; s/run = CPU s"
        )
        print(table(summaries))
    return 0


def seeds_text(seeds: list[int]) -> str:
    """`seed 42 (1 run)` or `seeds 42–51 (10 runs)`: the runs per policy behind each mean."""
    if len(seeds) == 1:
        return f"seed {seeds[0]} (1 run)"
    return f"seeds {min(seeds)}–{max(seeds)} ({len(seeds)} runs)"


def plot(path: Path, workload: str, summaries: Sequence[PolicySummary]) -> None:
    """Median unallocated GPU % per arrived %, with the band from the best to the worst seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(12, 5))
    arrived = np.arange(MAX_PCT + 1)
    for s in summaries:
        curves = np.array(
            [[np.nan if v is None else v for v in run.unallocated_pct] for run in s.runs], dtype=float
        )
        median = np.nanmedian(curves, axis=0)
        low = np.nanmin(curves, axis=0)
        high = np.nanmax(curves, axis=0)
        label = f"{s.policy} ({s.unallocated_at_100.mean:.2f} % at 100)"
        for ax in (whole, zoom):
            (line,) = ax.plot(arrived, median, label=label, linewidth=1.2)
            ax.fill_between(arrived, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    # Before the cluster saturates every policy sits on 100 − arrived; the right panel shows where they part.
    zoom.set_xlim(85, MAX_PCT)
    top = max(float(np.nanmax([r.at(r.unallocated_pct, 100) for s in summaries for r in s.runs])), 10.0)
    zoom.set_ylim(0, 1.15 * top)
    for ax in (whole, zoom):
        ax.axvline(100, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel("arrived GPU request, % of cluster GPU capacity")
        ax.set_ylabel("unallocated GPU, % of capacity")
        ax.grid(alpha=0.3)
    whole.set_title(f"openb {workload}: median over {len(summaries[0].runs)} seeds")
    zoom.set_title("zoom; band = best to worst seed")
    zoom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
