"""`whalegen replay --goodput`: one-line errors for bad input, and one small run of the documented formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whalegen.cli import main
from whalegen.goodput.data import GAVEL_FILE, default_traces_dir

TINY = """name: tiny
pools:
  - {name: h, gpu_model: H100, nodes: 1, gpus_per_node: 2, cpu_cores: 64, mem_gib: 512,
     gpus: [{mode: mps, count: 1}]}
  - {name: v, gpu_model: V100M16, nodes: 1, gpus_per_node: 2, cpu_cores: 64, mem_gib: 512}
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--fleet FILE is required"),
        (["--fleet", "FLEET", "--load", "0"], "--load: positive numbers"),
        (["--fleet", "FLEET", "--policy", "fgd,nope"], "unknown policy 'nope'"),
        (["--fleet", "missing.yaml"], "missing.yaml: fleet file not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    fleet = tmp_path / "tiny.yaml"
    fleet.write_text(TINY)
    argv = ["replay", "--goodput", *[str(fleet) if a == "FLEET" else a for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_worker_count_is_not_a_job_source_without_goodput(capsys) -> None:
    assert main(["replay", "--jobs", "openb.csv"]) == 2
    assert "a job source needs --goodput" in capsys.readouterr().err


def test_a_small_run_prints_every_metric_per_policy(tmp_path: Path, capsys) -> None:
    # The one test that reads the real traces end to end (Gavel, Lucid, openb; no services, so not the
    # genai-2026 archives, which the replay tests stand in for).
    if not (default_traces_dir() / GAVEL_FILE).is_file():
        pytest.skip("public traces not found (set WHALEGEN_TRACES_DIR)")
    fleet = tmp_path / "tiny.yaml"
    fleet.write_text(TINY)
    argv = [
        "replay",
        "--goodput",
        "--fleet",
        str(fleet),
        "--policy",
        "k8s-default,whalegen-aware",
        "--seeds",
        "3",
    ]
    assert main([*argv, "--max-jobs", "30", "--services", "0", "--json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    keys = {
        "goodput_pct",
        "allocated_pct",
        "busy_pct",
        "sla_violation_pct",
        "mean_jct_h",
        "p95_jct_h",
        "p95_wait_h",
    }
    for name in ("k8s-default", "whalegen-aware"):
        figures = document["policies"][name]
        assert keys | {"preemptions", "work_lost_gpu_h"} <= set(figures)
        assert 0 < figures["allocated_pct"] <= 100 and figures["finished_jobs"] > 0
    assert "runs" in captured.err  # progress on stderr
