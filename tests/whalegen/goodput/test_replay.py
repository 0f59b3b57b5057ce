"""The goodput replay on hand-built fleets, job types and services: metrics by hand, determinism, learning."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from whalegen.goodput.data import GavelData, JobType
from whalegen.goodput.fleet import parse_fleet
from whalegen.goodput.interference import UtilisationFit
from whalegen.goodput.jobs import Job, Service, ServiceProfile
from whalegen.goodput.replay import (
    ReplayConfig,
    World,
    dense_part,
    run_goodput,
    util_from_imposed,
)
from whalegen.goodput.telemetry import ProfileBook
from whalegen.goodput.truth import MeasuredPairs
from whalegen.gpus.speed import gpu_figures
from whalegen.sim.stats import nearest_rank_percentile

V100 = "V100M16"
A = JobType("ResNet-18 (batch size 32)", 1)
B = JobType("LM (batch size 5)", 1)
RULE = UtilisationFit(contention=0.0, exponent=0.6)


def measured_pairs(low: float = 0.9, high: float = 0.5) -> MeasuredPairs:
    """A hand-made co-location truth on the 5 % grid: `low` while the two utilisations add up to 100 % or
    less, `high` past it (the nearest measured pairs of any cell are all of one kind)."""
    grid = range(0, 101, 5)
    points = tuple((float(u), float(o), low if u + o <= 100 else high) for u in grid for o in grid)
    return MeasuredPairs(points, k=1)


def _gavel() -> GavelData:
    return GavelData(
        solo={(V100, A): 10.0, (V100, B): 4.0, ("P100", A): 6.0, ("P100", B): 2.0},
        pairs={
            (V100, A, B): (5.0, 3.0),
            (V100, B, A): (3.0, 5.0),
            ("P100", A, B): (3.0, 1.0),
            ("P100", B, A): (1.0, 3.0),
        },
        unfit=frozenset(),
        solo_unfit=frozenset(),
    )


def _fleet(mode: str = "whole", gpus: int = 1, model: str = V100) -> object:
    """One pool of one node with `gpus` GPUs of `model`, all in `mode` (shared two ways under mps and
    time-slice; under mig the fleet's layout, of which the replay's engine carves what each request needs)."""
    group: list[dict[str, object]] = [] if mode == "whole" else [{"mode": mode, "count": gpus}]
    if mode in ("mps", "time-slice"):
        group[0]["max_shares"] = 2
    if mode == "mig":
        group[0]["layout"] = ["4g.20gb", "2g.10gb", "1g.5gb"]
    return parse_fleet(
        {
            "name": "tiny",
            "pools": [
                {
                    "name": "p",
                    "gpu_model": model,
                    "nodes": 1,
                    "gpus_per_node": gpus,
                    "cpu_cores": 8,
                    "mem_gib": 64,
                    "gpus": group,
                }
            ],
        }
    )


def _job(job_id: str, job_type: JobType, runtime_s: float, arrival_s: int = 0, milli: int = 1000) -> Job:
    """A one-GPU job whose work is `runtime_s` at its share of a V100 (jobs.load_jobs' recipe)."""
    throughput = _gavel().solo[(V100, job_type)] * min(1.0, milli / 1000)
    return Job(job_id, arrival_s, job_type, 1, milli, 1000, 1024, False, runtime_s * throughput, runtime_s)


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(_gavel(), RULE, [V100], measured_pairs())


def test_two_one_hour_jobs_on_one_gpu_by_hand(world: World) -> None:
    # Offered 2 reference GPU-hours on 1 GPU of speed 1 at load 1: a 2 h window. The first job runs 0–1 h,
    # the second waits 1 h and runs 1–2 h: goodput and allocation 100 %, JCT 1 h and 2 h.
    fleet = _fleet()
    jobs = [_job("j0", A, 3600), _job("j1", B, 3600)]
    result = run_goodput(fleet, jobs, [], world, "k8s-default", 0, ReplayConfig(load=1.0))  # type: ignore[arg-type]
    assert result.window_h == pytest.approx(2.0)
    assert result.goodput_pct == pytest.approx(100.0, abs=0.01)
    assert result.allocated_pct == pytest.approx(100.0, abs=0.01)
    assert result.mean_jct_h == pytest.approx(1.5, abs=1e-6)
    assert result.p95_jct_h == pytest.approx(2.0, abs=1e-6)
    assert result.p95_wait_h == pytest.approx(1.0, abs=1e-6)
    assert result.finished == 2
    assert result.preemptions == 0 and result.work_lost_gpu_h == 0.0


def test_half_load_leaves_half_the_capacity_idle(world: World) -> None:
    fleet = _fleet()
    result = run_goodput(fleet, [_job("j0", A, 3600)], [], world, "fgd", 0, ReplayConfig(load=0.5))  # type: ignore[arg-type]
    assert result.window_h == pytest.approx(2.0)
    assert result.goodput_pct == pytest.approx(50.0, abs=0.01)
    assert result.mean_jct_h == pytest.approx(1.0, abs=1e-6)


def test_two_shares_on_one_mps_gpu_run_at_the_measured_pair_factor(world: World) -> None:
    # Two 400-milli jobs of 1 h at their share (0.4 GPU-h of work each) pack on one MPS GPU; their
    # utilisations (type's × 0.4) add to 100 % or less, so the measured pair factor is 0.9: each runs at
    # 0.4 × 0.9 of the GPU and ends after 1 / 0.9 h.
    fleet = _fleet("mps")
    jobs = [_job("a", A, 3600, milli=400), _job("b", B, 3600, milli=400)]
    result = run_goodput(fleet, jobs, [], world, "share-binpack", 0, ReplayConfig(load=1.0, step_s=1.0))  # type: ignore[arg-type]
    assert result.mean_jct_h == pytest.approx(1 / 0.9, abs=0.01)
    assert result.finished == 2


def test_a_service_beside_a_busy_job_violates_its_sla_and_k8s_gives_it_a_whole_gpu(world: World) -> None:
    busy = ServiceProfile("pod", (90.0,) * 10, ())
    service = Service("svc-000", busy, 0.9)
    fleet = _fleet("mps", gpus=1)
    jobs = [_job("a", A, 3600, milli=400)]
    static = ReplayConfig(load=1.0, service_churn=False)  # the service stays the whole replay
    shared = run_goodput(fleet, jobs, [service], world, "share-binpack", 0, static)  # type: ignore[arg-type]
    assert shared.sla_violation_pct > 50  # 90 % + the job's utilisation oversubscribe the GPU
    aware = run_goodput(fleet, jobs, [service], world, "whalegen-aware", 0, static)  # type: ignore[arg-type]
    assert aware.sla_violation_pct == 0.0  # the job waits for the GPU rather than break the SLA
    assert aware.refusals >= 0


def test_the_replay_is_deterministic_per_seed(world: World) -> None:
    fleet = _fleet("mps", gpus=2)
    jobs = [
        _job(f"j{i}", (A, B)[i % 2], 600 + 300 * i, arrival_s=60 * i, milli=(300, 1000)[i % 2])
        for i in range(12)
    ]
    services = [Service("svc-000", ServiceProfile("pod", (5.0, 60.0, 10.0), ()), 0.9)]
    runs = [
        run_goodput(fleet, jobs, services, world, "whalegen-aware", 7, ReplayConfig(load=1.2))
        for _ in range(2)
    ]  # type: ignore[arg-type]
    first, second = (r.__dict__ | {"cpu_s": 0.0} for r in runs)
    assert first == second


def test_util_from_imposed_inverts_the_utilisation_rule() -> None:
    rule = UtilisationFit(contention=0.005, exponent=0.6)
    for factor in (0.5, 0.68, 0.8, 0.9):
        u = util_from_imposed(factor, rule)
        if 5.0 < u < 100.0:
            assert rule.factor(u, 100.0) == pytest.approx(factor, abs=1e-9)
    assert util_from_imposed(0.1, rule) == 100.0  # a neighbour that slows others that much is saturating


def test_profile_book_learns_the_exponent_from_telemetry_on_two_models() -> None:
    book = ProfileBook()
    assert book.profile("w").compute_exponent == 0.5  # nothing seen: the even prior
    for model in ("L4", "A100-80GB"):
        f = gpu_figures(model)
        book.observe("w", model, 3.0 * f.fp32_tflops**0.2 * f.mem_bandwidth_gbps**0.8, 70.0)
    profile = book.profile("w")
    assert profile.compute_exponent == pytest.approx(0.2, abs=1e-9)
    assert profile.sm_util_pct == 70.0
    assert book.profile("unseen").compute_exponent == pytest.approx(0.2, abs=1e-9)  # the pooled prior


def test_percentile_is_nearest_rank() -> None:
    assert nearest_rank_percentile([], 95) == 0.0
    assert nearest_rank_percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert nearest_rank_percentile([float(i) for i in range(1, 21)], 95) == 19.0
    assert math.isclose(nearest_rank_percentile([3.0], 95), 3.0)


def test_dense_part_drops_the_stragglers_created_long_before_the_rest() -> None:
    jobs = [_job("old", A, 60, arrival_s=0)] + [
        _job(f"j{i}", A, 60, arrival_s=10_000 + i) for i in range(199)
    ]
    kept = dense_part(jobs)
    assert [j.job_id for j in kept][:1] == ["j1"] and len(kept) == 198  # the first 1 % (2 of 200) go


def test_a_guaranteed_job_preempts_a_best_effort_one_which_loses_its_work_since_the_checkpoint(
    world: World,
) -> None:
    # One GPU. A best-effort 2 h job starts at 0; a guaranteed (priority 1) job arrives after ~40 s and
    # preempts it at once: no checkpoint yet (every 30 min), so the victim loses what it ran, then reruns.
    best_effort = replace(_job("be", A, 7200), preemptible=True)
    urgent = _job("ls", B, 600, arrival_s=600)
    # Stretches the scaled arrivals ("ls" comes at ~47 s); best effort, so that it preempts nothing itself.
    late = replace(_job("x", B, 60, arrival_s=100_000), preemptible=True)
    result = run_goodput(_fleet(), [best_effort, urgent, late], [], world, "fgd", 0, ReplayConfig(load=1.0))  # type: ignore[arg-type]
    assert result.preemptions == 1
    assert 0 < result.work_lost_gpu_h <= 120 / 3600
    assert result.finished == 3
