"""Held-out errors of the goodput replay's speed and interference models, with their baselines, in one run.

    .venv/bin/python benchmarks/goodput_models.py [--traces DIR] [--json]

1. Speed: for each measured model (K80, P100, V100), fit every rule on the other two and predict it;
   median and max relative error over the job types measured on all three, next to the pure-FLOPS,
   pure-bandwidth and model-blind ("equal speed") baselines.
2. The fitted compute exponents and the predicted speed of each catalogue model over V100.
3. Interference: 5-fold over Gavel's measured pairs per model, and leave-one-model-out on Lucid; median,
   P90 and max absolute error of the factor, next to a constant (training median) and "no interference".
Errors are properties of the data, not timings; the CPU seconds printed are for the whole run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from whalegen.goodput.data import (
    GAVEL_FILE,
    LUCID_COLOCATE_FILE,
    LUCID_SINGLE_FILE,
    default_traces_dir,
    load_gavel,
    load_lucid_colocate,
    load_lucid_single,
)
from whalegen.goodput.interference import gavel_holdout, lucid_holdout
from whalegen.goodput.speed import SpeedModel, holdout_errors
from whalegen.gpus.catalogue import FP32_TFLOPS
from whalegen.gpus.speed import gpu_figures

REFERENCE_MODEL = "V100M16"


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return ordered[0], ordered[len(ordered) // 2], ordered[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces", type=Path, default=None, help="default $WHALEGEN_TRACES_DIR or ../shared/traces"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    args = parser.parse_args(argv)
    traces = args.traces or default_traces_dir()
    started = time.process_time()

    gavel = load_gavel(traces / GAVEL_FILE)
    speed_rows = holdout_errors(gavel)
    model = SpeedModel(gavel)
    exponents = [model.compute_exponent(job) for job in model.job_types]
    speedups: dict[str, tuple[float, float, float]] = {}
    for name in FP32_TFLOPS:
        ratios = []
        for job in model.job_types:
            reference = model.throughput(job, REFERENCE_MODEL)
            if reference > 0:
                ratios.append(model.throughput(job, name) / reference)
        speedups[name] = _quantiles(ratios)
    interference = [gavel_holdout(gavel, m) for m in gavel.gpu_models]
    interference.append(
        lucid_holdout(
            load_lucid_single(traces / LUCID_SINGLE_FILE), load_lucid_colocate(traces / LUCID_COLOCATE_FILE)
        )
    )
    cpu_s = time.process_time() - started

    if args.json:
        document: dict[str, Any] = {
            "speed_holdout": [vars(r) for r in speed_rows],
            "compute_exponents": exponents,
            "speedup_over_v100": {k: {"min": v[0], "median": v[1], "max": v[2]} for k, v in speedups.items()},
            "interference_holdout": [vars(r) for r in interference],
            "cpu_s": cpu_s,
        }
        json.dump(document, sys.stdout, indent=2)
        print()
        return 0

    print(f"Speed model, hold one measured model out ({speed_rows[0].jobs} job types measured on all three)")
    print(f"{'rule':<20} {'held out':<9} {'median rel err':>14} {'max rel err':>11}")
    for row in speed_rows:
        print(
            f"{row.rule:<20} {row.held_out_model:<9} {row.median_rel_error:>14.2f} {row.max_rel_error:>11.2f}"
        )
    at_zero = sum(1 for a in exponents if a == 0.0)
    at_one = sum(1 for a in exponents if a == 1.0)
    print(
        f"\nFitted compute exponent a over {len(exponents)} job types: {at_zero} at 0 (bandwidth), "
        f"{at_one} at 1 (FLOPS), {len(exponents) - at_zero - at_one} between"
    )
    print(f"\nPredicted throughput over {REFERENCE_MODEL} across job types (measured where measured)")
    print(f"{'model':<12} {'FP32 TFLOPS':>11} {'GB/s':>6} {'min':>6} {'median':>7} {'max':>6}")
    for name, (low, mid, high) in speedups.items():
        figures = gpu_figures(name)
        print(
            f"{name:<12} {figures.fp32_tflops:>11.2f} {figures.mem_bandwidth_gbps:>6.0f} "
            f"{low:>6.2f} {mid:>7.2f} {high:>6.2f}"
        )
    print("\nInterference factor, held out (absolute error of throughput-shared / throughput-alone)")
    print(f"{'data':<36} {'n':>5} {'median':>7} {'P90':>6} {'max':>6} {'const':>6} {'none':>6}")
    for h in interference:
        print(
            f"{h.data:<36} {h.predictions:>5} {h.median_abs_error:>7.3f} {h.p90_abs_error:>6.3f} "
            f"{h.max_abs_error:>6.3f} {h.median_abs_error_constant:>6.3f} {h.median_abs_error_none:>6.3f}"
        )
    print(f"\nCPU time of the whole run: {cpu_s:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
