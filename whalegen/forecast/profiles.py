"""Task profiles from telemetry and finished tasks, right-sizing advice, and a co-location predictor.

A profile says what history knows about one kind of task (tenant + profile key): how long it runs,
how much GPU memory it holds and how that memory behaves over its life, how busy it keeps the GPU.
The control plane folds agent telemetry into it; here everything is plain arrays in, frozen values out.

Units: time in seconds, utilisation in percent of one GPU (0…100, NVML's duty cycle), memory in MiB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt
import pandas as pd

from whalegen.forecast import metrics
from whalegen.forecast.interference import utilisation_factor
from whalegen.gpus.catalogue import get_model
from whalegen.gpus.mig import mig_profiles

# A memory level is "reached" at 95 % of the peak; "static" means reached in the first 10 % of the
# observed life and never far below afterwards (5th percentile within 20 % of the peak).
REACHED_SHARE = 0.95
STATIC_REACH_LIFE_SHARE = 0.10
STATIC_FLOOR_SHARE = 0.80
# "growing": the peak comes late (after half of the life) and memory rises with time overall.
GROWING_REACH_LIFE_SHARE = 0.50
GROWING_MIN_RANK_CORR = 0.5
MIN_SAMPLES_FOR_PATTERN = 5
MPS_MEM_STEP_MIB = 256  # MPS pinned-memory limits are set in whole 256 MiB steps here
MPS_THREAD_STEP_PCT = 5
MPS_MIN_THREAD_PCT = 10


class MemoryPattern(StrEnum):
    STATIC = "static"  # allocated at start, flat (typical of frameworks that pre-allocate)
    GROWING = "growing"  # climbs over the life: a bound from early samples will be too low
    FLUCTUATING = "fluctuating"  # moves up and down (serving, dynamic batching)
    UNKNOWN = "unknown"  # too few samples to tell


@dataclass(frozen=True)
class TaskProfile:
    sample_count: int
    task_count: int
    duration_p50_s: float | None
    duration_p90_s: float | None
    mem_peak_mib: float | None
    mem_typical_mib: float | None  # median of the samples
    mem_p95_mib: float | None
    mem_pattern: MemoryPattern
    util_mean_pct: float | None
    util_p95_pct: float | None
    util_burstiness: float | None  # (σ − μ) / (σ + μ): −1 steady, 0 Poisson-like, → 1 bursty
    util_zero_share: float | None  # share of samples with the GPU idle
    last_sample_s: float | None


def memory_pattern(times_s: npt.ArrayLike, mem_mib: npt.ArrayLike) -> MemoryPattern:
    """Classify one task's memory curve (samples of a single task, any order)."""
    t = np.asarray(times_s, dtype=np.float64)
    m = np.asarray(mem_mib, dtype=np.float64)
    keep = ~(np.isnan(t) | np.isnan(m))
    t, m = t[keep], m[keep]
    if len(t) < MIN_SAMPLES_FOR_PATTERN or np.ptp(t) <= 0 or m.max() <= 0:
        return MemoryPattern.UNKNOWN
    order = np.argsort(t, kind="mergesort")
    t, m = t[order], m[order]
    peak = m.max()
    life = t[-1] - t[0]
    reach = (t[int(np.argmax(m >= REACHED_SHARE * peak))] - t[0]) / life
    if reach <= STATIC_REACH_LIFE_SHARE and np.quantile(m, 0.05) >= STATIC_FLOOR_SHARE * peak:
        return MemoryPattern.STATIC
    trend = metrics.spearman(t, m)
    if reach >= GROWING_REACH_LIFE_SHARE and not math.isnan(trend) and trend >= GROWING_MIN_RANK_CORR:
        return MemoryPattern.GROWING
    return MemoryPattern.FLUCTUATING


def burstiness(values: npt.ArrayLike) -> float | None:
    """Goh–Barabási burstiness (σ − μ)/(σ + μ) of a non-negative signal; None when it is all zero."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return None
    mu, sigma = float(v.mean()), float(v.std())
    return None if mu + sigma == 0 else (sigma - mu) / (sigma + mu)


def _q(values: np.ndarray, q: float) -> float | None:
    return float(np.quantile(values, q)) if len(values) else None


def build_profile(
    samples: Iterable[tuple[str, float, float | None, float | None]],
    durations_s: Sequence[float] = (),
) -> TaskProfile:
    """Fold telemetry samples `(task_id, time_s, gpu_util_pct, gpu_mem_mib)` of one profile key and the
    run times of its finished tasks into a profile. A missing reading is None. The memory pattern is
    the most common pattern among the key's tasks (ties go to the riskier: growing, then fluctuating)."""
    frame = pd.DataFrame(list(samples), columns=["task", "t", "util", "mem"], dtype=object)
    frame = frame.astype({"t": np.float64, "util": np.float64, "mem": np.float64})
    util = frame["util"].dropna().to_numpy()
    mem = frame["mem"].dropna().to_numpy()
    patterns = [
        memory_pattern(part["t"], part["mem"]) for _, part in frame.dropna(subset=["mem"]).groupby("task")
    ]
    known = [p for p in patterns if p is not MemoryPattern.UNKNOWN]
    if known:
        risk = {MemoryPattern.GROWING: 0, MemoryPattern.FLUCTUATING: 1, MemoryPattern.STATIC: 2}
        counts = {p: known.count(p) for p in set(known)}
        pattern: MemoryPattern = min(counts, key=lambda p: (-counts[p], risk[p]))
    else:
        pattern = MemoryPattern.UNKNOWN
    d = np.asarray(durations_s, dtype=np.float64)
    return TaskProfile(
        sample_count=len(frame),
        task_count=int(frame["task"].nunique()),
        duration_p50_s=_q(d, 0.5),
        duration_p90_s=_q(d, 0.9),
        mem_peak_mib=float(mem.max()) if len(mem) else None,
        mem_typical_mib=_q(mem, 0.5),
        mem_p95_mib=_q(mem, 0.95),
        mem_pattern=pattern,
        util_mean_pct=float(util.mean()) if len(util) else None,
        util_p95_pct=_q(util, 0.95),
        util_burstiness=burstiness(util),
        util_zero_share=float(np.mean(util == 0)) if len(util) else None,
        last_sample_s=float(frame["t"].max()) if len(frame) else None,
    )


def profiles_by_key(
    frame: pd.DataFrame, durations_s: Mapping[str, Sequence[float]] | None = None
) -> dict[str, TaskProfile]:
    """Profiles of a long frame with columns `key`, `task`, `t`, `util`, `mem` (util/mem may be NaN)."""
    out = {}
    for key, part in frame.groupby("key", sort=True):
        rows = zip(part["task"], part["t"], part["util"], part["mem"], strict=True)
        samples = [(str(k), float(t), _opt(u), _opt(m)) for k, t, u, m in rows]
        out[str(key)] = build_profile(samples, (durations_s or {}).get(str(key), ()))
    return out


def _opt(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


class UnitKind(StrEnum):
    MIG = "mig"
    MPS = "mps"
    WHOLE = "whole"
    TOO_BIG = "too_big"


@dataclass(frozen=True)
class RightSizing:
    kind: UnitKind
    need_mib: int  # observed peak × (1 + margin), what the unit must hold
    mig_profile: str | None
    mps_mem_limit_mib: int | None
    mps_thread_pct: int | None
    reason: str


def right_size(
    peak_mib: float,
    gpu_model: str,
    *,
    margin: float = 0.15,
    util_p95_pct: float | None = None,
    pattern: MemoryPattern = MemoryPattern.STATIC,
) -> RightSizing:
    """The smallest unit of `gpu_model` that would have held `peak_mib` with a safety `margin`.

    MIG-capable models: the smallest GI profile (by memory, then compute; `+me` media variants
    skipped) whose memory holds the need, and, when `util_p95_pct` is given, whose compute share is
    at least that duty cycle. Other models: an MPS share with a pinned-memory limit and an active
    thread percentage. A growing memory pattern doubles the margin: its observed peak understates
    the next run's.
    """
    model = get_model(gpu_model)
    eff_margin = margin * (2.0 if pattern is MemoryPattern.GROWING else 1.0)
    need = math.ceil(peak_mib * (1.0 + eff_margin))
    if model.mem_mib is None:
        return RightSizing(
            UnitKind.WHOLE, need, None, None, None, f"{model.name} memory undisclosed: whole GPU"
        )
    if peak_mib > model.mem_mib:
        return RightSizing(
            UnitKind.TOO_BIG,
            need,
            None,
            None,
            None,
            f"peak {peak_mib:.0f} MiB exceeds {model.name}'s {model.mem_mib} MiB",
        )
    if need > model.mem_mib:
        # It did fit once; only the margin does not. The whole GPU is the most that can be given.
        return RightSizing(
            UnitKind.WHOLE, need, None, None, None, f"{need} MiB with margin: whole {model.name}"
        )
    compute_need = 0.0 if util_p95_pct is None else min(util_p95_pct, 100.0) / 100.0
    profiles = [p for p in mig_profiles(model.name) if not p.name.endswith("+me")]
    for p in sorted(profiles, key=lambda p: (p.memory_slices, p.compute_slices, p.mem_mib)):
        if p.mem_mib >= need and p.gpu_milli / 1000.0 >= compute_need:
            if p.memory_slices == 8:
                break  # the full-GPU instance: a whole GPU says the same without MIG mode
            return RightSizing(
                UnitKind.MIG, need, p.name, None, None, f"{p.name} holds {p.mem_mib} MiB ≥ {need} MiB needed"
            )
    if profiles:
        return RightSizing(
            UnitKind.WHOLE, need, None, None, None, f"no MIG profile below the full GPU fits {need} MiB"
        )
    mem_limit = math.ceil(need / MPS_MEM_STEP_MIB) * MPS_MEM_STEP_MIB
    threads = 100 if util_p95_pct is None else util_p95_pct * (1.0 + margin)
    thread_pct = int(
        min(100, max(MPS_MIN_THREAD_PCT, math.ceil(threads / MPS_THREAD_STEP_PCT) * MPS_THREAD_STEP_PCT))
    )
    if mem_limit >= model.mem_mib and thread_pct >= 100:
        return RightSizing(UnitKind.WHOLE, need, None, None, None, "needs the whole GPU's memory and compute")
    return RightSizing(
        UnitKind.MPS,
        need,
        None,
        min(mem_limit, model.mem_mib),
        thread_pct,
        f"MPS share: {min(mem_limit, model.mem_mib)} MiB pinned, {thread_pct} % threads",
    )


# ------------------------------------------------------------ compute- or bandwidth-bound, from NVML


class BoundClass(StrEnum):
    """Which ceiling a task's speed follows (the speed rule of docs/notes/goodput-design.md §2)."""

    COMPUTE = "compute-bound"  # speed follows FP32 TFLOPS
    BANDWIDTH = "bandwidth-bound"  # speed follows HBM bandwidth
    BALANCED = "balanced"
    UNKNOWN = "unknown"  # too little telemetry, or the GPU was idle


# The exponent's cut-offs for the two classes (the same as the replay's reasons).
COMPUTE_BOUND_MIN_EXPONENT = 0.6
BANDWIDTH_BOUND_MAX_EXPONENT = 0.4
# Samples of a busy GPU needed before a key is classified, and what "busy" means: an SM utilisation below
# this says the task waited on the host (data loading, I/O), which tells nothing about its kernels.
MIN_BOUND_SAMPLES = 3
MIN_BUSY_SM_PCT = 5.0


def bound_class(exponent: float | None) -> BoundClass:
    if exponent is None:
        return BoundClass.UNKNOWN
    if exponent >= COMPUTE_BOUND_MIN_EXPONENT:
        return BoundClass.COMPUTE
    if exponent <= BANDWIDTH_BOUND_MAX_EXPONENT:
        return BoundClass.BANDWIDTH
    return BoundClass.BALANCED


@dataclass(frozen=True)
class BoundProfile:
    """A profile key's compute/bandwidth split and interference sensitivity, learned from NVML telemetry.

    `compute_exponent` is the `a` of the speed rule (0: bandwidth … 1: compute); `sensitivity` is the
    share of its speed the task is predicted to lose beside a copy of itself on one GPU (0 … 1).
    """

    samples: int
    sm_util_pct: float | None
    mem_ctrl_util_pct: float | None
    compute_exponent: float | None
    bound: BoundClass
    sensitivity: float | None


def classify_bound(samples: int, sm_util_pct: float | None, mem_ctrl_util_pct: float | None) -> BoundProfile:
    """Classify a profile key from its mean SM and memory-controller utilisation (NVML's
    `utilization.gpu` and `utilization.memory`, over the samples where its GPU was busy).

    Rule: `a = 1 − mem_ctrl / sm`, clipped to [0, 1]. NVML's memory utilisation is the share of time the
    DRAM was being read or written, its GPU utilisation the share of time a kernel ran; their ratio is
    the share of kernel time spent moving memory, so a task whose DRAM is busy whenever its kernels run
    is bandwidth-bound (a → 0), one whose kernels run with the DRAM mostly quiet is compute-bound (a → 1).
    A roofline reading of two duty cycles, not a measurement of arithmetic intensity
    (docs/notes/goodput-design.md §10 states what it misses). The sensitivity is the Lucid utilisation rule of
    `whalegen.forecast.interference.utilisation_factor` beside a copy of itself.
    """
    if samples < MIN_BOUND_SAMPLES or sm_util_pct is None or mem_ctrl_util_pct is None:
        return BoundProfile(samples, sm_util_pct, mem_ctrl_util_pct, None, BoundClass.UNKNOWN, None)
    if sm_util_pct < MIN_BUSY_SM_PCT:
        return BoundProfile(samples, sm_util_pct, mem_ctrl_util_pct, None, BoundClass.UNKNOWN, None)
    exponent = float(min(1.0, max(0.0, 1.0 - mem_ctrl_util_pct / sm_util_pct)))
    sensitivity = 1.0 - utilisation_factor(sm_util_pct, sm_util_pct)
    return BoundProfile(
        samples, sm_util_pct, mem_ctrl_util_pct, exponent, bound_class(exponent), round(sensitivity, 4)
    )
