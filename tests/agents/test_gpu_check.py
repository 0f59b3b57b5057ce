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


def write_spec(path: Path, *gpus: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n", "gpus": list(gpus)}]}))
    return path


def test_a_dry_run_on_the_simulator_reads_everything_and_changes_nothing(
    tmp_path: Path, fake_bin: Path
) -> None:
    spec = write_spec(tmp_path / "spec.yaml", {"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "l40s"})
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", WHALEGEN_SIM_SPEC=str(spec))
    rc, report, output = run_check(tmp_path, "--sim-spec", str(spec), env=env)
    h100, l40s = report["nvml"]["gpus"]
    assert [p["id"] for p in h100["mig_profiles"]] == [19, 14, 9, 5, 0, 20, 15]  # walked by index
    assert h100["mig_profiles"][2]["placements"] == [[0, 4], [4, 4]]
    assert "utilization" in h100["telemetry"]["not_supported"] and "mig_profiles" not in l40s
    assert report["fixture_diffs"] == []  # the simulator serves the fixtures: nothing to correct
    assert report["invariants"]["unchanged"] is True
    # The (simulated) nvidia-smi agrees with NVML, placements included.
    assert report["nvidia_smi"]["query"]["rc"] == 0 and report["nvidia_smi"]["mismatches"] == []
    assert "Profile ID  9 Placements: {0,4}:4" in report["nvidia_smi"]["lgipp"]["stdout"]
    # No torch or cupy here: the MPS proof says so instead of pretending.
    assert report["mps"]["skipped"] == "neither torch nor cupy is importable"
    assert rc == 0 and report["ok"] is True and "modes unchanged: True" in output


def test_the_comparison_catches_nvidia_smi_disagreeing_with_nvml(tmp_path: Path, fake_bin: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", {"sku": "h100-80gb-sxm", "mig": "enabled"})
    other = write_spec(tmp_path / "other.yaml", {"sku": "h100-80gb-sxm", "mig": "disabled"})
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", WHALEGEN_SIM_SPEC=str(other))
    rc, report, _ = run_check(tmp_path, "--sim-spec", str(spec), "--skip-mps", env=env)
    fields = {m["field"] for m in report["nvidia_smi"]["mismatches"]}
    assert fields == {"mig_current", "mig_pending"} and rc == 1 and report["ok"] is False


def test_the_fake_nvidia_smi_resets_a_gpu_through_the_driver_state(tmp_path: Path, fake_bin: Path) -> None:
    from agents.sim.spec import build_system, load_spec

    spec = write_spec(tmp_path / "spec.yaml", {"sku": "a100-40gb"})
    state = tmp_path / "driver.json"
    system = build_system(load_spec(spec), state_path=state)
    system.gpus[0].mig_pending = 1  # an Ampere mode change waiting for a reset
    system._persist()
    env = dict(os.environ, WHALEGEN_SIM_SPEC=str(spec), WHALEGEN_SIM_STATE=str(state))
    done = subprocess.run(
        [str(fake_bin / "nvidia-smi"), "-r", "-i", "0"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "successfully reset" in done.stdout
    assert build_system(load_spec(spec), state_path=state).gpus[0].mig_current == 1
