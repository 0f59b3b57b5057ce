"""`whalegen replay --scenario FILE` and `whalegen replay --from-pool NAME` (docs/scenario-replay.md).

    whalegen replay --scenario docs/scenarios/two-tenants.yaml --policy fgd,whalegen --seeds 1-3
    whalegen replay --from-pool h200-train --policy whalegen,fgd

Kept apart from `replay.py` as `_dynamic.py` is; `replay.py` hands over here when either flag is given.
The what-if needs the database: Django is set up only on that path, and its side lives in
`apps/scheduling/whatif.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from whalegen.placement.registry import make_policy
from whalegen.sim.scenario import ScenarioError, ScenarioResult, parse_scenario, run_scenario
from whalegen.sim.stats import mean


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario replay (--scenario) and what-if (--from-pool)")
    group.add_argument("--scenario", type=Path, help="replay a YAML scenario of tenants, quotas and streams")
    group.add_argument(
        "--from-pool", metavar="NAME", help="what each policy would decide now on the pool's live snapshot"
    )


def _policies(text: str) -> list[str] | None:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    try:
        for policy in policies:
            make_policy(policy)
    except ValueError as error:
        print(f"whalegen replay: {error}", file=sys.stderr)
        return None
    return policies


def run(args: argparse.Namespace) -> int:
    if args.scenario is not None and args.from_pool is not None:
        print("whalegen replay: --scenario and --from-pool do not go together", file=sys.stderr)
        return 2
    policies = _policies(args.policy)
    if policies is None:
        return 2
    if args.from_pool is not None:
        return _from_pool(args.from_pool, policies, as_json=args.json)
    path: Path = args.scenario
    try:
        text = path.read_text()
    except OSError as error:
        print(f"whalegen replay: {path}: {error.strerror or error}", file=sys.stderr)
        return 2
    try:
        scenario = parse_scenario(text)
    except ScenarioError as error:
        print(f"whalegen replay: {path}: {error}", file=sys.stderr)
        return 2
    results = [run_scenario(scenario, policy, seed) for policy in policies for seed in args.seeds]
    if args.plot:
        plot(args.plot, results)
    if args.json:
        print(json.dumps(as_json(results), indent=2))
    else:
        print(table(results, args.seeds))
    return 0


def as_json(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    runs = []
    for r in results:
        run = asdict(r)
        run.pop("series_t_s")
        run.pop("series_tenant_milli")
        runs.append(run)
    return {"scenario": results[0].scenario if results else "", "runs": runs}


def table(results: Sequence[ScenarioResult], seeds: Sequence[int]) -> str:
    """Per policy, means over the seeds: the pool, then each tenant, then each priority."""
    if not results:
        return "no runs"
    first = results[0]
    lines = [
        f"scenario {first.scenario}: {first.gpus} GPUs, horizon {first.horizon_s:.0f} s; "
        f"seeds {','.join(map(str, seeds))} (means over seeds; wait = time pending before each start, "
        "requeues included; held = milli-GPU taken from the pool, time-averaged over the horizon; "
        "CPU s per run)",
        "",
        f"{'policy':<12} {'tasks':>6} {'alloc %':>8} {'wait s':>8} {'p95 s':>8} {'not run':>8} "
        f"{'preempt':>8} {'frag %':>7} {'CPU s':>6}",
    ]
    by_policy: dict[str, list[ScenarioResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    for policy, rs in by_policy.items():
        lines.append(
            f"{policy:<12} {mean([r.tasks for r in rs]):6.0f} {mean([r.alloc_pct for r in rs]):8.1f} "
            f"{mean([r.mean_wait_s for r in rs]):8.0f} {mean([r.p95_wait_s for r in rs]):8.0f} "
            f"{mean([r.not_started for r in rs]):8.1f} {mean([r.preemptions for r in rs]):8.1f} "
            f"{mean([r.frag_pct_mean for r in rs]):7.2f} {mean([r.cpu_seconds for r in rs]):6.2f}"
        )
    lines += [
        "",
        f"{'policy':<12} {'tenant':<12} {'guar.':>7} {'held':>7} {'held/g':>7} {'wait s':>8} {'p95 s':>8} "
        f"{'borrow s':>9} {'short s':>8} {'preempted':>9} {'max % lim':>9}",
    ]
    for policy, rs in by_policy.items():
        for i, tenant in enumerate(first.tenants):
            ts = [r.tenants[i] for r in rs]
            lines.append(
                f"{policy:<12} {tenant.tenant:<12} {tenant.guaranteed_milli:7d} "
                f"{mean([t.mean_held_milli for t in ts]):7.0f} "
                f"{mean([t.share_of_guarantee for t in ts]):7.2f} "
                f"{mean([t.mean_wait_s for t in ts]):8.0f} {mean([t.p95_wait_s for t in ts]):8.0f} "
                f"{mean([t.borrowing_s for t in ts]):9.0f} {mean([t.short_s for t in ts]):8.0f} "
                f"{mean([t.preemptions for t in ts]):9.1f} {max(t.max_used_pct_of_limit for t in ts):9.1f}"
            )
    lines += ["", f"{'policy':<12} {'priority':>8} {'tasks':>6} {'wait s':>8} {'p95 s':>8}"]
    for policy, rs in by_policy.items():
        for i, prio in enumerate(first.priorities):
            ps = [r.priorities[i] for r in rs]
            lines.append(
                f"{policy:<12} {prio.priority:8d} {mean([p.tasks for p in ps]):6.0f} "
                f"{mean([p.mean_wait_s for p in ps]):8.0f} {mean([p.p95_wait_s for p in ps]):8.0f}"
            )
    return "\n".join(lines)


def plot(path: Path, results: Sequence[ScenarioResult]) -> None:
    """Per policy (first seed), each tenant's held GPUs over time against its guarantee."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown: dict[str, ScenarioResult] = {}
    for r in results:
        shown.setdefault(r.policy, r)
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4.5), sharey=True, squeeze=False)
    for ax, (policy, r) in zip(axes[0], shown.items(), strict=True):
        minutes = [t / 60 for t in r.series_t_s]
        for tenant in r.tenants:
            (line,) = ax.plot(
                minutes,
                [m / 1000 for m in r.series_tenant_milli[tenant.tenant]],
                label=tenant.tenant,
                linewidth=1.2,
            )
            ax.axhline(tenant.guaranteed_milli / 1000, color=line.get_color(), linestyle=":", linewidth=0.9)
        ax.axhline(r.gpus, color="grey", linewidth=0.8)
        ax.set_title(f"{r.scenario}: {policy} (seed {r.seed})")
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("GPUs held (dotted: guarantee; grey: pool)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _from_pool(name: str, policies: list[str], *, as_json: bool) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()
    from apps.scheduling.whatif import UnknownPool, pool_whatif, whatif_text

    try:
        report = pool_whatif(pool_name=name, policies=policies)
    except UnknownPool as error:
        print(f"whalegen replay: {error}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(whatif_text(report))
    return 0
