"""The speed rule: how fast a job runs on a GPU model, from the model's FP32 TFLOPS and HBM bandwidth.

Per job type (docs/notes/goodput-design.md §2),

    throughput(model) = k × fp32_tflops(model) ** a × mem_bandwidth_gbps(model) ** (1 − a)

with `a` in [0, 1] the job's compute-boundness (1: scales with FLOPS only, 0: with HBM bandwidth only)
and `k` its scale, fitted by least squares on log throughput over the models it was measured on. A
geometric blend of the two roofline ceilings is the smallest rule that lets the best card depend on the
job with one shape parameter per job.

A fact about GPUs, so it lives beside the catalogue: placement ranks models by it
(`whalegen.placement.aware`) and the goodput replay's truth (`whalegen.goodput.speed.SpeedModel`) and
learning (`ProfileBook`) fit it, without placement importing the replay harness.

FP32 (non-tensor) TFLOPS, because Gavel's jobs are taken as FP32 runs (an assumption); the rule credits
no tensor cores, TF32 or mixed precision on newer cards, so it is conservative for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from whalegen.gpus.catalogue import get_model

# The exponent used when the measured models cannot tell compute from bandwidth (one model, or models
# with the same FLOPS-to-bandwidth ratio): an even blend.
DEFAULT_COMPUTE_EXPONENT = 0.5


@dataclass(frozen=True)
class GpuFigures:
    model: str
    fp32_tflops: float
    mem_bandwidth_gbps: float

    @property
    def log_balance(self) -> float:
        """log(FLOPS / bandwidth): the axis along which the rule's exponent is identified."""
        return math.log(self.fp32_tflops) - math.log(self.mem_bandwidth_gbps)


def gpu_figures(model_name: str) -> GpuFigures:
    """The catalogue's FP32 TFLOPS and bandwidth of a model; ValueError when either is unknown."""
    model = get_model(model_name)
    tflops = model.fp32_tflops
    if tflops is None or model.mem_bandwidth_gbps is None:
        raise ValueError(f"GPU model {model.name}: no FP32 TFLOPS or bandwidth in the catalogue")
    return GpuFigures(model.name, tflops, float(model.mem_bandwidth_gbps))


@dataclass(frozen=True)
class PowerLawFit:
    compute_exponent: float  # a
    log_scale: float  # log k

    def throughput(self, figures: GpuFigures) -> float:
        a = self.compute_exponent
        return math.exp(
            self.log_scale
            + a * math.log(figures.fp32_tflops)
            + (1 - a) * math.log(figures.mem_bandwidth_gbps)
        )

    def from_anchor(self, anchor: GpuFigures, anchor_throughput: float, target: GpuFigures) -> float:
        """The anchor's measured throughput scaled by the rule's ratio target / anchor.

        The level comes from a measurement and only the shape (the exponent) from the fit, so a job whose
        anchor measurement sits off its fitted line is not moved back onto it.
        """
        return anchor_throughput * self.throughput(target) / self.throughput(anchor)


def fit_power_law(
    points: Sequence[tuple[GpuFigures, float]], fixed_exponent: float | None = None
) -> PowerLawFit:
    """Least squares on log throughput; the exponent is clipped to [0, 1] before the scale is refitted.

    With z = log(T / bandwidth) and x = log(FLOPS / bandwidth) the rule is the line z = log k + a·x, so
    `a` is the ordinary least-squares slope and `log k` the mean residual.
    """
    if not points:
        raise ValueError("no measured points to fit")
    if any(t <= 0 for _, t in points):
        raise ValueError("throughputs must be positive")
    xs = [f.log_balance for f, _ in points]
    zs = [math.log(t) - math.log(f.mem_bandwidth_gbps) for f, t in points]
    if fixed_exponent is not None:
        a = fixed_exponent
    else:
        mean_x = sum(xs) / len(xs)
        mean_z = sum(zs) / len(zs)
        spread = sum((x - mean_x) ** 2 for x in xs)
        if spread < 1e-12:
            a = DEFAULT_COMPUTE_EXPONENT
        else:
            a = sum((x - mean_x) * (z - mean_z) for x, z in zip(xs, zs, strict=True)) / spread
    a = min(1.0, max(0.0, a))
    log_k = sum(z - a * x for x, z in zip(xs, zs, strict=True)) / len(xs)
    return PowerLawFit(a, log_k)
