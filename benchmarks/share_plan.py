"""The share plan's LP: the hand-written simplex (`fewest_bins`) against SciPy's HiGHS, in the same run.

    .venv/bin/python -m benchmarks.share_plan [--repeat 20] [--traces DIR]

Per LP — the mixes of the three openb workloads as `whalegen` sees them, and a synthetic mix of evenly
spread share sizes whose pattern count is just under MAX_PATTERNS (the largest LP `share_plan` builds) —
it prints both solvers' CPU milliseconds per solve (mean of `--repeat` solves, `time.process_time`),
their objective values (GPUs per arriving share), whether they agree within 1e-9, and whether they
reach the same vertex. Equally optimal vertices pack differently online (docs/placement.md §6), so the
vertex column matters as much as the objective. Nothing is asserted: the figures are for reading.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy.optimize import linprog

from whalegen.commands.replay import default_traces
from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.types import WHOLE_GPU_MILLI, ShapeMix
from whalegen.placement.whalegen_policy import MAX_PATTERNS, fewest_bins, pattern_count, share_patterns
from whalegen.sim.trace import load_tasks, pod_file

Solver = Callable[[npt.NDArray[np.float64], npt.NDArray[np.float64]], npt.NDArray[np.float64]]
AGREE = 1e-9  # GPUs per share; both solvers work to about 1e-9 feasibility


def highs(counts: npt.NDArray[np.float64], rates: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The same LP, `min Σ x  s.t.  counts · x = rates, x ≥ 0`, by SciPy's HiGHS."""
    result = linprog(np.ones(counts.shape[1]), A_eq=counts, b_eq=rates, bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"HiGHS: {result.message}")
    return np.asarray(result.x, dtype=float)


def lp_of_mix(mix: ShapeMix) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The LP `share_plan` solves for a mix (same sizes, same cut at MAX_PATTERNS)."""
    demand: dict[int, float] = {}
    for shape, weight in zip(mix.shapes, mix.weights, strict=True):
        if shape.num_gpu == 1 and 0 < shape.gpu_milli < WHOLE_GPU_MILLI:
            demand[shape.gpu_milli] = demand.get(shape.gpu_milli, 0.0) + weight
    sizes = sorted(demand)
    while sizes and pattern_count(sizes) > MAX_PATTERNS:
        sizes = sizes[1:]
    return lp_of_sizes(sizes, [demand[s] for s in sizes])


def lp_of_sizes(
    sizes: list[int], weights: list[float]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    patterns = share_patterns(sizes)
    counts = np.array([[p.count(size) for p in patterns] for size in sizes], dtype=float)
    rates = np.array(weights, dtype=float) / sum(weights)
    return counts, rates


def largest_synthetic_lp() -> tuple[str, npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Share sizes 37 milli apart from 950 down, as many as keep the pattern count under MAX_PATTERNS."""
    sizes = [950]
    while pattern_count([*sizes, sizes[-1] - 37]) <= MAX_PATTERNS and sizes[-1] > 60:
        sizes.append(sizes[-1] - 37)
    weights = [1.0 + (i % 3) for i in range(len(sizes))]
    counts, rates = lp_of_sizes(sorted(sizes), [weights[i] for i in np.argsort(sizes)])
    return f"synthetic {len(sizes)} sizes", counts, rates


def cpu_ms(
    solver: Solver, counts: npt.NDArray[np.float64], rates: npt.NDArray[np.float64], repeat: int
) -> float:
    started = time.process_time()
    for _ in range(repeat):
        solver(counts, rates)
    return 1000 * (time.process_time() - started) / repeat


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--traces", type=Path, default=None)
    args = parser.parse_args()
    traces = args.traces or default_traces()
    lps = []
    for workload in ("default", "gpuspec10", "multigpu20"):
        mix = shape_mix_from_tasks(load_tasks(traces / pod_file(workload)), with_memory=True)
        lps.append((workload, *lp_of_mix(mix)))
    lps.append(largest_synthetic_lp())
    print(
        f"{'LP':<22} {'sizes':>5} {'patterns':>8} {'own ms':>8} {'HiGHS ms':>9} {'HiGHS/own':>9} "
        f"{'own GPUs/share':>14} {'HiGHS':>9} {'agree':>5} {'vertex':>9}"
    )
    for name, counts, rates in lps:
        own_ms = cpu_ms(fewest_bins, counts, rates, args.repeat)
        highs_ms = cpu_ms(highs, counts, rates, args.repeat)
        own_x, highs_x = fewest_bins(counts, rates), highs(counts, rates)
        agree = abs(own_x.sum() - highs_x.sum()) <= AGREE
        same = set(np.flatnonzero(own_x > 1e-9)) == set(np.flatnonzero(highs_x > 1e-9))
        print(
            f"{name:<22} {counts.shape[0]:>5} {counts.shape[1]:>8} {own_ms:>8.2f} {highs_ms:>9.2f} "
            f"{highs_ms / own_ms:>8.1f}× {own_x.sum():>14.6f} {highs_x.sum():>9.6f} "
            f"{'yes' if agree else 'NO':>5} {'same' if same else 'different':>9}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
