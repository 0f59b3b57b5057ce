"""`scripts/gpu-check` without a GPU: a clear failure without NVML, and a dry run on the simulator."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"


def run_check(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has NVML")
def test_without_nvml_it_fails_clearly_and_still_writes_a_report(tmp_path: Path) -> None:
    rc, report, output = run_check(tmp_path)
    assert rc == 2
    assert report["nvml"]["error"]["name"] == "LIBRARY_NOT_FOUND"
    assert "NVML unavailable" in output and "Traceback" not in output


def test_a_dry_run_on_the_simulator_reads_everything_and_changes_nothing(
    tmp_path: Path, fake_bin: Path
) -> None:
    spec = {"nodes": [{"name": "n", "gpus": [{"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "l40s"}]}]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}")
    rc, report, output = run_check(tmp_path, "--sim-spec", str(tmp_path / "spec.yaml"), env=env)
    h100, l40s = report["nvml"]["gpus"]
    assert [p["id"] for p in h100["mig_profiles"]] == [19, 14, 9, 5, 0, 20, 15]  # walked by index
    assert h100["mig_profiles"][2]["placements"] == [[0, 4], [4, 4]]
    assert "utilization" in h100["telemetry"]["not_supported"] and "mig_profiles" not in l40s
    assert report["fixture_diffs"] == []  # the simulator serves the fixtures: nothing to correct
    assert report["invariants"]["unchanged"] is True
    # No nvidia-smi and no torch/cupy here: the report says so instead of pretending.
    assert report["nvidia_smi"]["query"]["error"] == "not found"
    assert report["mps"]["skipped"] in {
        "neither torch nor cupy is importable",
        "nvidia-cuda-mps-control not on PATH",
    }
    assert rc == 1 and report["ok"] is False and "modes unchanged: True" in output
