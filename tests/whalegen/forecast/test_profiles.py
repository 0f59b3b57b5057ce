from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from whalegen.forecast.interference import SoloProfile, evaluate_interference, fit_interference
from whalegen.forecast.profiles import (
    MemoryPattern,
    UnitKind,
    build_profile,
    burstiness,
    memory_pattern,
    profiles_by_key,
    right_size,
)

T = np.arange(0, 3_600, 60.0)


@pytest.mark.parametrize(
    ("mem", "want"),
    [
        pytest.param(
            np.r_[1_000.0, np.full(len(T) - 1, 8_000.0)], MemoryPattern.STATIC, id="allocated at start"
        ),
        pytest.param(1_000.0 + 100.0 * np.arange(len(T)), MemoryPattern.GROWING, id="climbs all its life"),
        pytest.param(5_000 + 3_000 * np.sin(T / 300.0), MemoryPattern.FLUCTUATING, id="up and down"),
        pytest.param(np.array([1.0, 2.0]), MemoryPattern.UNKNOWN, id="too few samples"),
    ],
)
def test_memory_pattern(mem: np.ndarray, want: MemoryPattern) -> None:
    assert memory_pattern(T[: len(mem)], mem) is want


def test_burstiness_separates_steady_from_bursty_utilisation() -> None:
    steady = burstiness(np.full(100, 50.0))
    bursty = burstiness(np.r_[np.zeros(95), np.full(5, 100.0)])
    assert steady == -1.0
    assert bursty is not None and bursty > 0.5
    assert burstiness(np.zeros(10)) is None


def test_build_profile_summarises_samples_and_durations() -> None:
    samples = [("t1", float(t), 10.0 if i % 2 else 90.0, 4_000.0 + i) for i, t in enumerate(T)]
    samples += [("t2", float(t), None, 6_000.0) for t in T]
    profile = build_profile(samples, durations_s=[100.0, 200.0, 300.0, 400.0, 1_000.0])
    assert profile.sample_count == 2 * len(T) and profile.task_count == 2
    assert profile.mem_peak_mib == 6_000.0
    assert profile.util_mean_pct == pytest.approx(50.0)
    assert profile.util_p95_pct == pytest.approx(90.0)
    assert profile.duration_p50_s == 300.0
    assert profile.duration_p90_s == pytest.approx(760.0)
    assert profile.last_sample_s == T[-1]


def test_right_size_picks_the_smallest_mig_profile_that_holds_the_peak_with_margin() -> None:
    assert right_size(8_000, "A100-80GB").mig_profile == "1g.10gb"  # 9,200 ≤ 9,728
    assert right_size(8_500, "A100-80GB").mig_profile == "1g.20gb"  # 9,775 > 9,728
    # A busy task needs compute too: 40 % duty cycle rules out the 1g (1/7) and 2g (2/7) slices.
    busy = right_size(8_000, "A100-80GB", util_p95_pct=40.0)
    assert busy.kind is UnitKind.MIG and busy.mig_profile == "3g.40gb"
    # Growing memory doubles the margin: 8,000 × 1.3 = 10,400 no longer fits 1g.10gb.
    assert right_size(8_000, "A100-80GB", pattern=MemoryPattern.GROWING).mig_profile == "1g.20gb"
    assert right_size(70_000, "A100-80GB").kind is UnitKind.WHOLE  # only the full 7g would hold it
    assert right_size(75_000, "A100-80GB").kind is UnitKind.WHOLE  # fits, but not with the margin
    assert right_size(90_000, "A100-80GB").kind is UnitKind.TOO_BIG


def test_right_size_offers_an_mps_share_on_gpus_without_mig() -> None:
    advice = right_size(5_000, "L40S", util_p95_pct=30.0)
    assert advice.kind is UnitKind.MPS
    assert advice.mps_mem_limit_mib == 5_888  # 5,750 rounded up to 256 MiB steps
    assert advice.mps_thread_pct == 35  # 30 % × 1.15 = 34.5 → 35
    assert right_size(5_000, "G2").kind is UnitKind.WHOLE  # memory undisclosed


def _trace_csv(archive) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """The one CSV of a trace archive, read from the archive itself: nothing extracted, so no extraction
    filter is needed (`extractall(filter=...)` is Python 3.11.4+, and the venv runs the system's 3.11.2
    so that tenants' uids can execute it, docs/isolation.md)."""
    import tarfile

    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.isfile() and m.name.endswith(".csv"))
        handle = tar.extractfile(member)
        assert handle is not None
        return pd.read_csv(handle)


def test_profiles_from_genai_telemetry(traces_dir) -> None:  # type: ignore[no-untyped-def]
    util = _trace_csv(traces_dir / "genai-2026" / "pod_gpu_duty_cycle_anon.tar.gz")
    mem = _trace_csv(traces_dir / "genai-2026" / "pod_gpu_memory_used_bytes_anon.tar.gz")
    frame = pd.merge(
        util.rename(columns={"value": "util"}),
        mem.rename(columns={"value": "mem"}).assign(mem=lambda f: f["mem"] / 2**20),
        on=["container_ip", "timestamp_anon"],
        how="outer",
    ).rename(columns={"container_ip": "key", "timestamp_anon": "t"})
    profiles = profiles_by_key(frame.assign(task=frame["key"]))
    assert len(profiles) == 144  # traces/README.md §3: 144 pods in the memory file
    full = [p for p in profiles.values() if p.sample_count >= 1_441]
    assert len(full) >= 72
    # Serving pods: low mean utilisation, bursty, memory that moves (README §3 caveats).
    means = np.array([p.util_mean_pct for p in full if p.util_mean_pct is not None])
    assert 3.0 < np.median(means) < 12.0
    patterns = [p.mem_pattern for p in full]
    assert patterns.count(MemoryPattern.FLUCTUATING) > len(full) / 2
    assert all(p.mem_peak_mib >= p.mem_typical_mib for p in full if p.mem_peak_mib is not None)


def test_interference_model_beats_no_slowdown_on_held_out_lucid_families(traces_dir) -> None:  # type: ignore[no-untyped-def]
    single = pd.read_csv(traces_dir / "lucid-profiles" / "single_data.csv")
    pairs_frame = pd.read_csv(traces_dir / "lucid-profiles" / "colocate_info.csv", index_col=0)
    solo = {
        (r.model, r.dataset, r.batchsize, r.amp): SoloProfile(r.gpu_util, r.gmem_util, r.gmem)
        for r in single.itertuples()
    }
    pairs, families = [], []
    for r in pairs_frame.itertuples():
        a = solo[(r.model1, r.dataset1, r.batchsize1, r.amp1)]
        b = solo[(r.model2, r.dataset2, r.batchsize2, r.amp2)]
        pairs += [(a, b, r.speed1), (b, a, r.speed2)]
        families += [(r.model1, r.model2), (r.model2, r.model1)]
    ev = evaluate_interference(pairs, families)
    assert ev.models["solo_profile_model"]["mae"] < 0.85 * ev.models["no_slowdown"]["mae"]
    assert ev.models["solo_profile_model"]["spearman"] > 0.3


def test_interference_is_worse_for_two_busy_jobs_than_two_idle_ones() -> None:
    busy, idle = SoloProfile(95.0, 60.0, 8_000), SoloProfile(10.0, 5.0, 2_000)
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(200):
        u1, u2 = rng.uniform(0, 100, 2)
        a, b = SoloProfile(u1, u1 / 2, 1_000), SoloProfile(u2, u2 / 2, 1_000)
        pairs.append((a, b, 1.0 - 0.4 * (u1 / 100) * (u2 / 100)))
    model = fit_interference(pairs)
    assert model.speed(busy, busy) < model.speed(idle, idle)
    assert model.speed(idle, idle) == pytest.approx(1.0, abs=0.02)
    assert model.fits_memory(busy, idle, 24_576) and not model.fits_memory(busy, busy, 16_384)
