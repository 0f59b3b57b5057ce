"""The headline fields (whalegen/goodput/headline.py): gap closed by hand, the prices, and a real run."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from whalegen.cli import main
from whalegen.goodput.data import GavelData, JobType
from whalegen.goodput.fleet import parse_fleet
from whalegen.goodput.headline import (
    Headline,
    best_baseline,
    gap_closed,
    gpu_hours_to_finish,
    headline_table,
    headlines,
)
from whalegen.goodput.interference import UtilisationFit
from whalegen.goodput.jobs import Job
from whalegen.goodput.replay import ReplayConfig, RunResult, World, run_goodput
from whalegen.goodput.truth import MeasuredPairs

# -- gap closed by hand ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("goodput", "reference", "ceiling", "want"),
    [
        (40.0, 40.0, 60.0, 0.0),
        (60.0, 40.0, 60.0, 1.0),
        (45.0, 40.0, 60.0, 0.25),
        (30.0, 40.0, 60.0, -0.5),
    ],
    ids=["the policy is the baseline: 0", "at the ceiling: 1", "a quarter of the way", "below the baseline"],
)
def test_gap_closed_by_hand(goodput: float, reference: float, ceiling: float, want: float) -> None:
    assert gap_closed(goodput, reference, ceiling) == pytest.approx(want)


def test_no_gap_means_no_share() -> None:
    assert gap_closed(50.0, 50.0, 50.0) is None
    assert gap_closed(50.0, 55.0, 50.0) is None


def _run(policy: str, seed: int, goodput: float, **more: float | None) -> RunResult:
    figures: dict[str, object] = {
        "policy": policy,
        "seed": seed,
        "load": 1.5,
        "gpus": 10,
        "jobs": 5,
        "services": 0,
        "window_h": 4.0,
        "goodput_pct": goodput,
        "allocated_pct": 0.0,
        "busy_pct": 0.0,
        "sla_violation_pct": 0.0,
        "mean_jct_h": 0.0,
        "p95_jct_h": 0.0,
        "mean_wait_h": 0.0,
        "p95_wait_h": 0.0,
        "preemptions": 0,
        "work_lost_gpu_h": 0.0,
        "finished": 5,
        "cpu_s": 0.0,
    }
    figures.update(more)
    return RunResult(**figures)  # type: ignore[arg-type]


def test_headlines_average_the_seeds_and_price_each_policy() -> None:
    runs = [
        _run("k8s-default", 1, 40.0, last_finish_h=30.0),
        _run("k8s-default", 2, 42.0, last_finish_h=32.0),
        _run("fgd", 1, 48.0, sla_violation_pct=2.0, p95_jct_h=3.0, last_finish_h=28.0),
        _run("fgd", 2, 50.0, sla_violation_pct=4.0, p95_jct_h=5.0, last_finish_h=None),
        _run("whalegen-aware", 1, 56.0, work_lost_gpu_h=1.5, last_finish_h=20.0),
        _run("whalegen-aware", 2, 58.0, work_lost_gpu_h=2.5, last_finish_h=22.0),
    ]
    by_policy = headlines(runs, ceiling_strict_pct=61.0)
    assert list(by_policy) == ["k8s-default", "fgd", "whalegen-aware"]
    # Reference 41, ceiling 61: a gap of 20. fgd (49) closes 8 of it, whalegen-aware (57) 16.
    assert by_policy["k8s-default"].gap_closed == pytest.approx(0.0)
    assert by_policy["fgd"].gap_closed == pytest.approx(0.4)
    assert by_policy["whalegen-aware"].gap_closed == pytest.approx(0.8)
    assert by_policy["fgd"].sla_violation_pct == pytest.approx(3.0)
    assert by_policy["fgd"].p95_jct_h == pytest.approx(4.0)
    assert by_policy["whalegen-aware"].work_lost_gpu_h == pytest.approx(2.0)
    # 10 GPUs × the hours to the last finish; fgd left a job unfinished in seed 2: no figure.
    assert by_policy["k8s-default"].gpu_hours_to_finish == pytest.approx(310.0)
    assert by_policy["whalegen-aware"].gpu_hours_to_finish == pytest.approx(210.0)
    assert by_policy["fgd"].gpu_hours_to_finish is None
    assert all(h.ceiling_strict_pct == 61.0 for h in by_policy.values())
    assert best_baseline(by_policy) == "fgd"  # whalegen-aware closes more, but it is not a baseline
    table = headline_table({"1.5": by_policy})
    assert "fgd 0.40" in table.splitlines()[3] and "0.80" in table.splitlines()[3]


def test_without_k8s_default_there_is_no_gap_and_no_best_baseline_without_baselines() -> None:
    by_policy = headlines([_run("fgd", 1, 48.0)], ceiling_strict_pct=61.0)
    assert by_policy["fgd"].gap_closed is None
    assert best_baseline(by_policy) is None
    assert best_baseline(headlines([_run("k8s-default", 1, 40.0)], 61.0)) is None
    assert gpu_hours_to_finish([]) is None


# -- the replay's last finish, by hand ---------------------------------------------------------------------

V100 = "V100M16"
A = JobType("ResNet-18 (batch size 32)", 1)


def _tiny_world() -> World:
    gavel = GavelData(solo={(V100, A): 10.0}, pairs={}, unfit=frozenset(), solo_unfit=frozenset())
    grid = range(0, 101, 5)
    pairs = MeasuredPairs(tuple((float(u), float(o), 0.9) for u in grid for o in grid), k=1)
    return World.build(gavel, UtilisationFit(contention=0.0, exponent=0.6), [V100], pairs)


def test_the_last_finish_is_when_the_last_job_ended_or_none() -> None:
    # Two one-hour jobs on one GPU at load 1: a 2 h window, the second ends at 2 h. At load 2 the window
    # is 1 h and the drain limit one window: the second job is still running at the end.
    fleet = parse_fleet(
        {
            "name": "one",
            "pools": [
                {"name": "p", "gpu_model": V100, "nodes": 1, "gpus_per_node": 1}
                | {"cpu_cores": 8, "mem_gib": 64}
            ],
        }
    )
    jobs = [Job(f"j{i}", 0, A, 1, 1000, 1000, 1024, False, 3600 * 10.0, 3600.0) for i in range(2)]
    world = _tiny_world()
    done = run_goodput(fleet, jobs, [], world, "k8s-default", 0, ReplayConfig(load=1.0))
    assert done.last_finish_h == pytest.approx(2.0, abs=1 / 60)
    cut = run_goodput(fleet, jobs, [], world, "k8s-default", 0, ReplayConfig(load=2.0, drain_factor=1.0))
    assert cut.finished == 1 and cut.last_finish_h is None


# -- a real run ---------------------------------------------------------------------------------------------

FLEET = """name: small
pools:
  - {name: h, gpu_model: H100, nodes: 1, gpus_per_node: 8, cpu_cores: 128, mem_gib: 1024,
     gpus: [{mode: mps, count: 1, max_shares: 2}]}
  - {name: p, gpu_model: P100, nodes: 1, gpus_per_node: 4, cpu_cores: 64, mem_gib: 512}
"""


def test_the_command_reports_the_headline_and_no_policy_passes_the_strict_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gavel: GavelData
) -> None:
    fleet = tmp_path / "small.yaml"
    fleet.write_text(FLEET)
    argv = ["replay", "--goodput", "--fleet", str(fleet), "--policy", "k8s-default,fgd,whalegen-aware"]
    argv += ["--seeds", "2", "--load", "0.8,1.5", "--max-jobs", "60", "--services", "0", "--json"]
    assert main([*argv, "--ceiling", "--ceiling-intervals", "8", "--drain-factor", "400"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    headline_fields = {f.name for f in fields(Headline)}
    for load in ("0.8", "1.5"):
        entry = document["loads"][load]
        ceiling = entry["ceiling"]
        assert ceiling["strict_pct"] <= ceiling["no_queue_pct"] + 1e-6 and ceiling["intervals"] == 8
        for name, figures in entry["policies"].items():
            assert headline_fields <= set(figures), name
            # The LP is an upper bound on the replay's own physics (retained work, true speeds).
            assert figures["goodput_retained_pct"] <= ceiling["strict_pct"] + 1e-6, name
            assert figures["ceiling_strict_pct"] == ceiling["strict_pct"]
        assert entry["policies"]["k8s-default"]["gap_closed"] == 0.0
    assert document["loads"]["1.5"]["policies"]["fgd"]["gpu_hours_to_finish"] > 0  # every job finished
    assert "gap closed" in captured.err and "best baseline" in captured.err  # the table, beside the JSON
