"""The headline of a goodput replay (issue #41 item 3): how much of the achievable gain a policy gets, and
at what price.

Per fleet and load, for each policy (means over the seeds):

- `goodput_retained_pct`: the replay's goodput, retained work only (`RunResult.goodput_pct`);
- `ceiling_strict_pct`: the strict fluid ceiling (whalegen.goodput.ceiling), the same for every policy;
- `gap_closed`: the share of the gap from `k8s-default` (whole GPUs, spreading) to the ceiling that the
  policy closes: 0 for k8s-default itself, 1 at the ceiling, negative below k8s-default; None where the
  gap is not positive (nothing to close) or k8s-default was not run;
- the prices: `sla_violation_pct`, `p95_jct_h`, `work_lost_gpu_h` (reference GPU-hours preemptions threw
  away), and `gpu_hours_to_finish`: the fleet's GPUs × the hours until the last job finished (what an
  operator buys to get the whole workload done), None where a job was unfinished at the drain limit.

A policy's gap closed is read beside the best baseline's: the highest of `volcano-binpack`,
`share-binpack` and `fgd` that was run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from whalegen.goodput.replay import RunResult
from whalegen.sim.stats import mean

REFERENCE_POLICY = "k8s-default"
BASELINES = ("volcano-binpack", "share-binpack", "fgd")


def gap_closed(goodput_pct: float, reference_pct: float, ceiling_pct: float) -> float | None:
    """(goodput − reference) / (ceiling − reference); None where the ceiling is not above the reference."""
    gap = ceiling_pct - reference_pct
    if gap <= 0:
        return None
    return (goodput_pct - reference_pct) / gap


@dataclass(frozen=True)
class Headline:
    goodput_retained_pct: float
    gap_closed: float | None
    ceiling_strict_pct: float
    sla_violation_pct: float
    p95_jct_h: float
    work_lost_gpu_h: float
    gpu_hours_to_finish: float | None

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def gpu_hours_to_finish(results: Sequence[RunResult]) -> float | None:
    """Mean over the runs of GPUs × hours to the last job's finish; None if any run left a job unfinished."""
    hours = [r.last_finish_h for r in results]
    if not results or any(h is None for h in hours):
        return None
    return mean([r.gpus * h for r, h in zip(results, hours, strict=True) if h is not None])


def headlines(results: Sequence[RunResult], ceiling_strict_pct: float) -> dict[str, Headline]:
    """One load's runs (every policy and seed) and its strict ceiling (mean over the seeds): per policy, in
    the order first run."""
    policies = list(dict.fromkeys(r.policy for r in results))
    by_policy = {p: [r for r in results if r.policy == p] for p in policies}
    reference = by_policy.get(REFERENCE_POLICY)
    reference_pct = mean([r.goodput_pct for r in reference]) if reference else None
    out = {}
    for policy, runs in by_policy.items():
        goodput = mean([r.goodput_pct for r in runs])
        out[policy] = Headline(
            goodput_retained_pct=goodput,
            gap_closed=(
                gap_closed(goodput, reference_pct, ceiling_strict_pct) if reference_pct is not None else None
            ),
            ceiling_strict_pct=ceiling_strict_pct,
            sla_violation_pct=mean([r.sla_violation_pct for r in runs]),
            p95_jct_h=mean([r.p95_jct_h for r in runs]),
            work_lost_gpu_h=mean([r.work_lost_gpu_h for r in runs]),
            gpu_hours_to_finish=gpu_hours_to_finish(runs),
        )
    return out


def best_baseline(by_policy: Mapping[str, Headline]) -> str | None:
    """The baseline that closes the most of the gap (None if no baseline was run or none has a gap)."""
    run = [(h.gap_closed, p) for p, h in by_policy.items() if p in BASELINES and h.gap_closed is not None]
    return max(run)[1] if run else None


def _cell(value: float | None, form: str) -> str:
    return "—" if value is None else format(value, form)


def headline_table(by_load: Mapping[str, Mapping[str, Headline]]) -> str:
    """Per load and policy: the gap closed beside the best baseline's, then the prices."""
    head = (
        f"{'load':>5} {'policy':<24} {'gap closed':>10} {'best baseline':>24} {'goodput %':>9} "
        f"{'ceiling %':>9} {'SLA viol. %':>11} {'P95 JCT h':>9} {'lost GPU-h':>10} {'GPU-h to finish':>15}"
    )
    lines = [head]
    for load, by_policy in by_load.items():
        best = best_baseline(by_policy)
        best_text = f"{best} {_cell(by_policy[best].gap_closed, '.2f')}" if best else "—"
        for policy, h in by_policy.items():
            lines.append(
                f"{load:>5} {policy:<24} {_cell(h.gap_closed, '.2f'):>10} {best_text:>24} "
                f"{h.goodput_retained_pct:>9.1f} {h.ceiling_strict_pct:>9.1f} {h.sla_violation_pct:>11.2f} "
                f"{h.p95_jct_h:>9.2f} {h.work_lost_gpu_h:>10.2f} {_cell(h.gpu_hours_to_finish, ',.0f'):>15}"
            )
    return "\n".join(lines)
