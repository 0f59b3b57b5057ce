"""`whalegen agent` and `whalegen agent inspect` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def whalegen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "whalegen", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_inspect_prints_inventory_and_mig_state_as_json_without_changing_anything(tmp_path: Path) -> None:
    spec = {"nodes": [{"name": "n", "gpus": [{"sku": "h200-141gb", "mig": "enabled"}, {"sku": "a100-40gb"}]}]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    done = whalegen("agent", "inspect", "--backend", "sim", "--sim-spec", str(tmp_path / "spec.yaml"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    h200, a100 = report["gpus"]
    assert (h200["inventory"]["model"], h200["inventory"]["mig_current"]) == ("H200-141GB", True)
    assert [p["name"] for p in h200["mig_profiles"]][:3] == ["1g.18gb", "2g.35gb", "3g.71gb"]
    assert h200["mig_profiles"][0]["remaining_capacity"] == 7
    assert (a100["inventory"]["mig_capable"], a100["inventory"]["mig_current"]) == (True, False)
    assert "mig_profiles" not in a100


def test_running_needs_a_server_and_a_token() -> None:
    done = whalegen("agent", "--backend", "sim")
    assert done.returncode == 2 and "--server and --token" in done.stderr


def test_the_agent_command_loads_no_django() -> None:
    code = (
        "import sys, whalegen.commands.agent, agents.agent, agents.sim.backend, agents.inspect\n"
        "banned = {'django', 'celery', 'rest_framework', 'apps'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
