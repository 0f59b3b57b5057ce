"""How far the NVML-based classification (whalegen.forecast.profiles.classify_bound) agrees with the data.

1. Compute exponent from telemetry (Lucid's solo SM and memory-controller utilisation, RTX 3090) against
   the exponent fitted on measured speeds (Gavel's K80/P100/V100 throughputs, the speed rule of
   docs/notes/goodput-design.md §2), per model family both sources measured (a mean over batch sizes and
   precisions; one-GPU Gavel jobs). Spearman rank correlation; the families are few, so it is a sanity
   check only.
2. Interference sensitivity from telemetry against Lucid's own hand-assigned sharing-sensitivity label
   (0 least … 2 most), over all 66 configurations.

    .venv/bin/python benchmarks/goodput_bound_check.py      # figures in docs/notes/goodput-design.md §10
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

import numpy as np

from whalegen.forecast import metrics
from whalegen.forecast.profiles import classify_bound
from whalegen.goodput.data import (
    GAVEL_FILE,
    LUCID_SINGLE_FILE,
    default_traces_dir,
    load_gavel,
    load_lucid_single,
)
from whalegen.goodput.speed import SpeedModel

# Lucid family → the Gavel family of the same kind of model (the same model where both have it).
FAMILIES = {
    "ResNet18": "ResNet-18",
    "ResNet50": "ResNet-50",
    "LSTM": "LM",
    "NeuMF": "Recommendation",
    "DCGAN": "CycleGAN",
    "PPO": "A3C",
    "Transformer": "Transformer",
}


def main() -> None:
    traces = default_traces_dir()
    speed = SpeedModel(load_gavel(traces / GAVEL_FILE))
    fitted: dict[str, list[float]] = defaultdict(list)
    for job in speed.job_types:
        if job.num_gpus == 1:
            fitted[job.family].append(speed.compute_exponent(job))
    solos = load_lucid_single(traces / LUCID_SINGLE_FILE)
    read: dict[str, list[float]] = defaultdict(list)
    sensitivity: list[float] = []
    labels: list[int] = []
    for solo in solos:
        bound = classify_bound(10, solo.gpu_util_pct, solo.gmem_util_pct)
        if bound.compute_exponent is not None and bound.sensitivity is not None:
            read[solo.config.model].append(bound.compute_exponent)
            sensitivity.append(bound.sensitivity)
            labels.append(solo.label)
    print("family (Lucid / Gavel)        a from NVML   a fitted on speeds")
    rows = [(lucid, gavel, mean(read[lucid]), mean(fitted[gavel])) for lucid, gavel in FAMILIES.items()]
    for lucid, gavel, telemetry, speeds in rows:
        print(f"{lucid:>12} / {gavel:<15} {telemetry:10.2f} {speeds:14.2f}")
    rho = metrics.spearman(np.array([r[2] for r in rows]), np.array([r[3] for r in rows]))
    print(f"Spearman over {len(rows)} families: {rho:.2f}")
    rho_s = metrics.spearman(np.array(sensitivity), np.array(labels, dtype=float))
    print(f"sensitivity against Lucid's label, Spearman over {len(labels)} configurations: {rho_s:.2f}")
    for label in sorted(set(labels)):
        values = [s for s, lab in zip(sensitivity, labels, strict=True) if lab == label]
        print(f"  label {label}: mean sensitivity {mean(values):.3f} ({len(values)} configurations)")


if __name__ == "__main__":
    main()
