"""Counting in the goodput replay: retained work under preemption, `max_shares`, and a K80 fleet."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.whalegen.goodput.test_replay import RULE, V100, A, B, _fleet, _gavel, _job, measured_pairs
from whalegen.goodput.data import (
    LUCID_COLOCATE_FILE,
    LUCID_SINGLE_FILE,
    GavelData,
    JobType,
    load_lucid_colocate,
    load_lucid_single,
)
from whalegen.goodput.fleet import parse_fleet
from whalegen.goodput.interference import fit_utilisation, lucid_observations
from whalegen.goodput.jobs import load_jobs
from whalegen.goodput.replay import (
    ReplayConfig,
    World,
    dense_part,
    fleet_models,
    refuse_unrunnable,
    run_goodput,
)
from whalegen.goodput.truth import MeasuredPairs


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(_gavel(), RULE, [V100], measured_pairs())


def test_work_a_preemption_throws_away_is_not_counted(world: World) -> None:
    # One V100, 60 s steps. A best-effort job of 2 h starts at 0; a guaranteed 10-min job arrives at 47 s
    # (the arrivals scaled into the 7,860 s window) and preempts it at the 60 s step: no checkpoint yet, so
    # its 60 s are thrown away. The urgent job starts at the next step and runs 120–720 s; the victim
    # reruns from 720 s and has done 7,140 s of its 2 h when the window ends at 7,860 s (a best-effort
    # job arriving then does not preempt it). Done in the window: 60 + 600 + 7,140 s; retained: 7,740 s.
    best_effort = replace(_job("be", A, 7200), preemptible=True)
    urgent = _job("ls", B, 600, arrival_s=600)
    late = replace(_job("x", B, 60, arrival_s=100_000), preemptible=True)
    result = run_goodput(_fleet(), [best_effort, urgent, late], [], world, "fgd", 0, ReplayConfig(load=1.0))  # type: ignore[arg-type]
    assert result.window_h == pytest.approx(7860 / 3600)
    assert result.preemptions == 1
    assert result.work_lost_gpu_h == pytest.approx(60 / 3600)
    assert result.work_done_ref_gpu_h == pytest.approx(7800 / 3600)
    assert result.work_retained_ref_gpu_h == pytest.approx(7740 / 3600)
    assert result.goodput_pct == pytest.approx(100 * 7740 / 7860)


def test_a_preemption_after_the_last_checkpoint_takes_back_the_work_since_it(world: World) -> None:
    # As above, but the job arriving at the window's end is guaranteed and preempts the rerun at 7,860 s:
    # its last checkpoint was at 720 + 3 × 1,800 = 6,120 s, so 1,740 s more are thrown away: retained
    # 600 + 5,400 s, lost 60 + 1,740 s.
    best_effort = replace(_job("be", A, 7200), preemptible=True)
    jobs = [best_effort, _job("ls", B, 600, arrival_s=600), _job("x", B, 60, arrival_s=100_000)]
    result = run_goodput(_fleet(), jobs, [], world, "fgd", 0, ReplayConfig(load=1.0))  # type: ignore[arg-type]
    assert result.preemptions == 2
    assert result.work_lost_gpu_h == pytest.approx(1800 / 3600)
    assert result.work_retained_ref_gpu_h == pytest.approx(6000 / 3600)
    assert result.goodput_pct == pytest.approx(100 * 6000 / 7860)


def test_a_shared_gpu_takes_no_more_tasks_than_its_max_shares(world: World) -> None:
    # One time-sliced V100 of two shares, three 200-milli jobs of 1 h each at their share: two run together
    # (their utilisations add up to under 100 %: the measured factor 0.9, 1 / 0.9 h), the third waits for
    # a share and runs alone 1 h after (10 s steps). Without the bound all three would run at once.
    fleet = parse_fleet(
        {
            "name": "ts",
            "pools": [
                {"name": "p", "gpu_model": V100, "nodes": 1, "gpus_per_node": 1, "cpu_cores": 8,
                 "mem_gib": 64, "gpus": [{"mode": "time-slice", "count": 1, "max_shares": 2}]}
            ],
        }
    )  # fmt: skip
    jobs = [_job(f"j{i}", A, 3600, milli=200) for i in range(3)]
    result = run_goodput(fleet, jobs, [], world, "share-binpack", 0, ReplayConfig(load=0.25, step_s=10.0))
    together_h = 1 / 0.9
    assert result.finished == 3
    assert result.p95_wait_h == pytest.approx(round(together_h * 360) / 360, abs=0.01)
    assert result.mean_jct_h == pytest.approx((2 * together_h + together_h + 1.0) / 3, abs=0.01)


def _k80_world(traces_dir: Path, gavel: GavelData, models: list[str]) -> World:
    observations = lucid_observations(
        load_lucid_single(traces_dir / LUCID_SINGLE_FILE),
        load_lucid_colocate(traces_dir / LUCID_COLOCATE_FILE),
    )
    rule = fit_utilisation(observations)
    return World.build(gavel, rule, models, MeasuredPairs.from_lucid(observations), seed=1)


def _pool(name: str, model: str, nodes: int, shared: bool) -> dict[str, object]:
    gpus = [{"mode": "mps", "count": 1, "max_shares": 4}] if shared else []
    return {"name": name, "gpu_model": model, "nodes": nodes, "gpus_per_node": 4, "cpu_cores": 64,
            "mem_gib": 512, "gpus": gpus}  # fmt: skip


def test_a_fleet_with_k80s_runs_and_refuses_only_what_no_card_runs(
    traces_dir: Path, gavel: GavelData
) -> None:
    # Gavel measured ResNet-50 at batch 128 on 2+ K80s as not fitting (throughput 0). Before issue #41 a
    # K80 in the fleet made the learned profiles raise (log 0); now that type never goes to a K80, and a
    # K80-only fleet refuses its jobs at load with a line that says why.
    jobs = list(
        dense_part(load_jobs(traces_dir / "openb" / "openb_pod_list_default.csv", gavel, seed=1))[:150]
    )
    big = JobType("ResNet-50 (batch size 128)", 2)
    jobs.append(replace(jobs[-1], job_id="big", job_type=big, num_gpus=2, gpu_milli=1000))
    mixed = parse_fleet(
        {"name": "k80-mixed", "pools": [_pool("k80", "K80", 4, True), _pool("v100", V100, 2, False)]}
    )
    world = _k80_world(traces_dir, gavel, fleet_models(mixed))
    result = run_goodput(mixed, jobs, [], world, "whalegen-aware", 1, ReplayConfig(load=1.0))
    assert result.refused_jobs == 0 and result.finished > 100 and result.goodput_pct > 0
    k80_only = parse_fleet({"name": "k80", "pools": [_pool("k80", "K80", 6, True)]})
    kept, lines = refuse_unrunnable(jobs, k80_only, world)
    assert "big" not in {j.job_id for j in kept}
    assert any("ResNet-50 (batch size 128) x2" in line and "K80" in line for line in lines)
    result = run_goodput(k80_only, jobs, [], world, "fgd", 1, ReplayConfig(load=1.0))
    assert result.refused_jobs == len(jobs) - len(kept) >= 1
    assert result.finished > 100
