"""The replay protocol on a small slice of the openb trace, the loaders, and the `whalegen replay` command."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from whalegen.commands.replay import parse_seeds
from whalegen.placement.types import TaskRequest
from whalegen.sim.replay import MAX_PCT, arrivals, run_replay
from whalegen.sim.trace import NODE_FILE, load_nodes, load_tasks, pod_file

TRACES = Path("/work/shared/traces/openb")
ROOT = Path(__file__).resolve().parents[3]
needs_trace = pytest.mark.skipif(not (TRACES / NODE_FILE).is_file(), reason="openb trace not present")


def _small(tmp_path: Path, workload: str = "mini") -> Path:
    """A 41-node cluster and 302 tasks cut from the trace, written in the trace's own format."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with (TRACES / NODE_FILE).open() as handle:
        rows = list(csv.reader(handle))
    (tmp_path / NODE_FILE).write_text("\n".join(",".join(r) for r in [rows[0], *rows[1::30]]) + "\n")
    with (TRACES / pod_file("gpuspec10")).open() as handle:
        pods = list(csv.reader(handle))
    (tmp_path / pod_file(workload)).write_text("\n".join(",".join(r) for r in [pods[0], *pods[1::27]]) + "\n")
    return tmp_path


def test_arrivals_reach_130_percent_of_capacity_and_no_further_than_one_task() -> None:
    tasks = [TaskRequest(f"t{i}", 1000, 1024, 1, 500) for i in range(10)]
    stream = arrivals(tasks, capacity_milli=8000, seed=3)
    total = sum(t.gpu_request_milli for t in stream)
    assert 1.3 * 8000 <= total < 1.3 * 8000 + 500
    assert len({t.task_id for t in stream}) == len(stream)
    assert arrivals(tasks, 8000, seed=3) == stream
    assert arrivals(tasks, 8000, seed=4) != stream


def test_seed_ranges_parse() -> None:
    assert parse_seeds("42-45,50") == [42, 43, 44, 45, 50]


@needs_trace
def test_loaders_read_models_constraints_and_multi_gpu_tasks() -> None:
    nodes = load_nodes(TRACES / NODE_FILE)
    assert len(nodes) == 1213 and sum(len(n.gpus) for n in nodes) == 6212
    tasks = load_tasks(TRACES / pod_file("gpuspec10"))
    specs = [t.allowed_models for t in tasks if t.allowed_models]
    assert len(specs) == 732
    assert frozenset({"V100M16", "V100M32"}) in specs  # "V100M16|V100M32|V100M32" de-duplicated
    assert {t.num_gpu for t in load_tasks(TRACES / pod_file("multigpu20"))} == {0, 1, 2, 4, 8}


@needs_trace
@pytest.mark.parametrize("policy", ["fgd", "whalegen", "random"])
def test_a_small_replay_runs_the_protocol_and_repeats_itself(tmp_path: Path, policy: str) -> None:
    folder = _small(tmp_path)
    nodes = load_nodes(folder / NODE_FILE)
    tasks = load_tasks(folder / pod_file("mini"))
    first = run_replay(nodes, tasks, policy, seed=42)
    again = run_replay(nodes, tasks, policy, seed=42)
    assert first.unallocated_pct == again.unallocated_pct and first.failed_tasks == again.failed_tasks
    assert len(first.unallocated_pct) == MAX_PCT + 1
    # Before anything arrives all capacity is idle; at the end some tasks failed and some GPU is used.
    assert first.at(first.unallocated_pct, 0) == pytest.approx(100.0, abs=1.5)
    assert 0 < first.at(first.unallocated_pct, 130) < 40
    assert first.failed_tasks > 0
    assert 0 <= first.at(first.frag_amount_pct, 100) <= 100


@needs_trace
def test_fgd_leaves_fewer_gpus_unallocated_than_random_on_a_small_replay(tmp_path: Path) -> None:
    folder = _small(tmp_path)
    nodes = load_nodes(folder / NODE_FILE)
    tasks = load_tasks(folder / pod_file("mini"))

    def unallocated_at_130(policy: str, seed: int) -> float:
        run = run_replay(nodes, tasks, policy, seed)
        return run.at(run.unallocated_pct, 130)

    fgd_mean = sum(unallocated_at_130("fgd", s) for s in (1, 2, 3))
    random_mean = sum(unallocated_at_130("random", s) for s in (1, 2, 3))
    assert fgd_mean < random_mean


@needs_trace
def test_the_replay_command_prints_json_and_writes_curves_and_a_plot(tmp_path: Path) -> None:
    folder = _small(tmp_path / "traces")
    args = [
        sys.executable,
        "-m",
        "whalegen",
        "replay",
        "--traces",
        str(folder),
        "--workload",
        "mini",
        "--policy",
        "fgd,bestfit",
        "--seeds",
        "42-43",
        "--json",
        "--curves",
        str(tmp_path / "curves.csv"),
        "--plot",
        str(tmp_path / "plot.png"),
    ]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    assert result["workload"] == "mini" and result["nodes"] == 41
    assert set(result["policies"]) == {"fgd", "bestfit"}
    fgd = result["policies"]["fgd"]
    for key in ("unallocated_pct_at_100", "unallocated_pct_at_130", "frag_pct_at_100", "failed_tasks"):
        assert set(fgd[key]) == {"mean", "sd"}
    assert [run["seed"] for run in fgd["runs"]] == [42, 43]
    assert "runs" in done.stderr  # the progress bar
    with (tmp_path / "curves.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0][:4] == ["workload", "policy", "seed", "metric"] and rows[0][-1] == "130"
    assert len(rows) == 1 + 2 * 2 * 3
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


@needs_trace
def test_the_replay_command_refuses_an_unknown_policy(tmp_path: Path) -> None:
    folder = _small(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "whalegen",
            "replay",
            "--traces",
            str(folder),
            "--workload",
            "mini",
            "--policy",
            "x",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "unknown policy" in done.stderr
