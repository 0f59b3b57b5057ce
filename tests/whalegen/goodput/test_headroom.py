"""The online headroom sized from the services' forecast, services that arrive and leave, the oracle
profiles and the goodput ceiling of the replay (docs/notes/goodput-design.md §6 steps 3 and 3b)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.whalegen.goodput.test_replay import A, B, _fleet, _job, world  # noqa: F401
from whalegen.forecast.online_reserve import poisson_quantile
from whalegen.goodput.fleet import parse_fleet
from whalegen.goodput.headroom import forecast_arrivals, online_headroom_milli
from whalegen.goodput.jobs import Service, ServiceProfile
from whalegen.goodput.replay import ReplayConfig, World, ceilings, run_goodput, split_policy

QUIET = ServiceProfile("pod", (20.0, 40.0, 10.0), ())


def test_poisson_quantile_by_hand() -> None:
    # Poisson(1): P(0) = 0.368, P(≤1) = 0.736, P(≤2) = 0.920.
    assert [poisson_quantile(1.0, q) for q in (0.3, 0.5, 0.9)] == [0, 1, 2]
    assert poisson_quantile(0.0, 0.9) == 0
    with pytest.raises(ValueError):
        poisson_quantile(1.0, 1.0)


def test_the_headroom_is_the_forecast_arrivals_upper_quantile_times_a_services_ask() -> None:
    # Three hours back from 11,000 s: (200, 11,000] holds 7,000 and 11,000: 2 arrivals in 3 h, so 0.67
    # expected in the next hour; Poisson(0.67): P(0) = 0.51, P(≤1) = 0.86, P(≤2) = 0.97 → 2 services.
    arrivals = [100.0, 200.0, 7000.0, 11_000.0]
    assert forecast_arrivals(arrivals, 11_000.0, 10_800.0, 3600.0) == pytest.approx(2 / 3)
    assert online_headroom_milli(arrivals, 11_000.0, 500) == 1000
    assert online_headroom_milli([], 11_000.0, 500) == 0


def test_policy_names_carry_replay_options() -> None:
    assert split_policy("whalegen-aware+headroom+oracle") == (
        "whalegen-aware",
        frozenset({"headroom", "oracle"}),
    )
    assert split_policy("fgd") == ("fgd", frozenset())
    with pytest.raises(ValueError, match="replay options"):
        split_policy("fgd+magic")


def _roomy_fleet(mode: str, gpus: int) -> object:
    """One V100 node with CPU and memory to spare (services ask 4 cores and 16 GiB each)."""
    group = [] if mode == "whole" else [{"mode": mode, "count": gpus, "max_shares": 2}]
    pool = {"name": "p", "gpu_model": "V100M16", "nodes": 1, "gpus_per_node": gpus, "cpu_cores": 64}
    return parse_fleet({"name": "roomy", "pools": [pool | {"mem_gib": 512, "gpus": group}]})


def _churn_run(truth: World, policy: str) -> object:
    # Eight GPUs, a stream of preemptible whole-GPU jobs that keeps them busy, and eight services that
    # arrive over the window (half at t = 0) and leave after an exponential lifetime. Whole GPUs: a
    # service at SLA 0.90 never shares one (the measured pairs' 1st percentile is below 0.90 everywhere,
    # whalegen.forecast.interference), so on four shared GPUs eight services could not all run whatever
    # the headroom (it was four MPS GPUs while services shared on the median rule).
    fleet = _roomy_fleet("whole", 8)
    jobs = [
        replace(_job(f"j{i}", (A, B)[i % 2], 3600, arrival_s=300 * i), preemptible=True) for i in range(40)
    ]
    services = [Service(f"svc-{i:03d}", QUIET, 0.9) for i in range(8)]
    return run_goodput(fleet, jobs, services, truth, policy, 3, ReplayConfig(load=1.5))  # type: ignore[arg-type]


def test_a_headroom_sized_from_the_forecast_spares_arriving_services_the_wait_and_the_preemptions(
    world: World,  # noqa: F811
) -> None:
    plain = _churn_run(world, "whalegen-aware")
    kept = _churn_run(world, "whalegen-aware+headroom")
    assert plain.headroom_gpus_mean == 0.0 and kept.headroom_gpus_mean > 0.0  # type: ignore[attr-defined]
    # Without a headroom arriving services find the GPUs full and displace batch work (and wait for it).
    assert plain.service_preemptions > 0  # type: ignore[attr-defined]
    assert kept.service_preemptions < plain.service_preemptions  # type: ignore[attr-defined]
    assert kept.sla_violation_pct <= plain.sla_violation_pct  # type: ignore[attr-defined]
    assert kept.policy == "whalegen-aware+headroom"  # type: ignore[attr-defined]


def test_a_service_that_leaves_frees_its_gpu_by_hand(world: World) -> None:  # noqa: F811
    # One whole GPU; a service there from t = 0 for exactly 30 min (every lifetime is the 30 min floor),
    # and a one-hour job arriving at 0 behind it (the service's priority is higher). The window is 1 h: the
    # job runs 0.5–1.5 h, half its work in the window; JCT 1.5 h. A service that never leaves blocks it.
    fleet = _roomy_fleet("whole", 1)
    jobs = [_job("j0", A, 3600)]
    services = [Service("svc-000", QUIET, 0.9)]
    churn = ReplayConfig(service_present_share=1.0, service_mean_life=1e-9)
    result = run_goodput(fleet, jobs, services, world, "k8s-default", 0, churn)  # type: ignore[arg-type]
    assert result.goodput_pct == pytest.approx(50.0, abs=0.01)
    assert result.mean_jct_h == pytest.approx(1.5, abs=1e-6) and result.p95_wait_h == pytest.approx(0.5)
    assert result.sla_violation_pct == 0.0  # running for each of its 30 minutes, none counted after
    static = ReplayConfig(service_churn=False)
    blocked = run_goodput(fleet, jobs, services, world, "k8s-default", 0, static)  # type: ignore[arg-type]
    assert blocked.goodput_pct == 0.0 and blocked.finished == 0


def test_the_ceiling_bounds_every_policys_goodput_and_the_oracle_reads_true_profiles(
    world: World,  # noqa: F811
) -> None:
    fleet = _fleet("whole", gpus=2)
    jobs = [_job(f"j{i}", (A, B)[i % 2], 1800 + 600 * i, arrival_s=400 * i) for i in range(10)]
    for policy in ("k8s-default", "fgd", "whalegen-aware", "whalegen-aware+oracle"):
        result = run_goodput(fleet, jobs, [], world, policy, 2, ReplayConfig(load=1.2))  # type: ignore[arg-type]
        assert 0 < result.goodput_pct <= result.ceiling_pct + 1e-9
        assert result.offered_pct == pytest.approx(120.0)  # one model: capacity is 1 reference GPU per GPU


def test_the_ceilings_of_two_one_hour_jobs_on_one_gpu_by_hand(world: World) -> None:  # noqa: F811
    # Both arrive at 0 (one arrival time: no spread to scale); the window is 2 h. Alone on the one GPU
    # from arrival, each does its hour: 2 GPU-h of 2, 100 %; one model of speed 1: both capacities 100 %.
    bound = ceilings(_fleet(), [_job("j0", A, 3600), _job("j1", B, 3600)], world, ReplayConfig())  # type: ignore[arg-type]
    assert bound.no_queue_pct == pytest.approx(100.0)
    assert bound.mean_capacity_pct == pytest.approx(100.0) == bound.best_job_capacity_pct
    assert bound.strict_pct == pytest.approx(100.0)
    # At half the load the window doubles and the same work is half of it.
    half = ceilings(_fleet(), [_job("j0", A, 3600), _job("j1", B, 3600)], world, ReplayConfig(load=0.5))  # type: ignore[arg-type]
    assert half.no_queue_pct == pytest.approx(50.0)


def test_services_at_the_batch_priority_wait_without_the_reserve(world: World) -> None:  # noqa: F811
    # `+peer`: services arrive at the preemptible jobs' priority, as production's queue default puts them.
    # Without a reserve, equal priority displaces nobody: arriving services wait for jobs to end (29 % of
    # service-minutes violate, waiting). The forecast reserve keeps room for them (0 %).
    plain = _churn_run(world, "whalegen-aware+peer")
    kept = _churn_run(world, "whalegen-aware+peer+headroom")
    assert plain.service_preemptions == 0  # type: ignore[attr-defined]
    assert plain.sla_violation_pct > 5  # type: ignore[attr-defined]
    assert kept.sla_violation_pct < plain.sla_violation_pct / 4  # type: ignore[attr-defined]
