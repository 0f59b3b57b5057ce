"""MPS daemons through the stateful fake `nvidia-cuda-mps-control` on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.enforce.mps import MpsError, MpsManager
from agents.sim import fake_mps
from whalegen.protocol import MpsSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mps(tmp_path: Path, fake_bin: Path):  # type: ignore[no-untyped-def]
    manager = MpsManager(tmp_path / "mps")
    yield manager
    for device in manager.running_devices():
        manager.shutdown(device)


def test_one_daemon_per_device_with_its_own_dirs_and_defaults(mps: MpsManager) -> None:
    assert mps.ensure("GPU-a", MpsSpec(50, 4096)) == [
        "start daemon",
        "default thread % 50",
        "default pinned memory 4096 MiB",
    ]
    assert mps.ensure("MIG-b", MpsSpec(100)) == ["start daemon"]
    assert mps.running_devices() == ["GPU-a", "MIG-b"]
    assert mps.dirs("GPU-a").pipe != mps.dirs("MIG-b").pipe
    assert mps.control("GPU-a", "get_default_device_pinned_mem_limit 0") == "4096M"
    assert mps.control("MIG-b", "get_default_active_thread_percentage") == "100.0"


def test_ensure_is_idempotent_and_only_queries_when_nothing_changed(mps: MpsManager) -> None:
    mps.ensure("GPU-a", MpsSpec(25, 1024))
    log = mps.dirs("GPU-a").log / "control.log"
    before = log.read_text()
    assert mps.ensure("GPU-a", MpsSpec(25, 1024)) == []
    added = log.read_text()[len(before) :]
    assert "set_" not in added and "Starting" not in added
    assert mps.ensure("GPU-a", MpsSpec(40, 1024)) == ["default thread % 40"]


def test_an_unhealthy_daemon_is_restarted(mps: MpsManager) -> None:
    mps.ensure("GPU-a", MpsSpec(50))
    (mps.dirs("GPU-a").pipe / fake_mps.STATE_FILE).unlink()  # the daemon stops answering
    assert not mps.healthy("GPU-a")
    assert mps.ensure("GPU-a", MpsSpec(50))[:2] == ["restart unhealthy daemon", "start daemon"]
    assert mps.healthy("GPU-a")


def test_clean_shutdown_removes_the_daemon(mps: MpsManager) -> None:
    mps.ensure("GPU-a", MpsSpec())
    pid = mps.daemon_pid("GPU-a")
    assert pid is not None and mps.shutdown("GPU-a")
    assert mps.daemon_pid("GPU-a") is None and mps.running_devices() == []
    with pytest.raises(MpsError):
        mps.control("GPU-a", "get_server_list")  # no daemon: the control binary says so and fails


def test_client_limits_are_the_minimum_of_server_and_environment(mps: MpsManager) -> None:
    mps.ensure("GPU-a", MpsSpec(25, 8192))
    base = dict(os.environ, PYTHONPATH=str(ROOT))

    def client(
        thread_pct: int | None, mem_mib: int | None, alloc_mib: int
    ) -> subprocess.CompletedProcess[str]:
        env = base | mps.client_env("GPU-a", thread_pct, mem_mib)
        command = [
            sys.executable,
            "-m",
            "agents.sim.fake_cuda_app",
            "--alloc-mib",
            str(alloc_mib),
            "--step-s",
            "0",
        ]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=20)

    asks_more = client(60, None, 100)  # a tenant asking for 60 % under a 25 % server cap gets 25 %
    assert asks_more.returncode == 0 and "thread_pct=25 pinned_limit_mib=8192" in asks_more.stdout
    lowered = client(10, 2048, 2000)
    assert lowered.returncode == 0 and "thread_pct=10 pinned_limit_mib=2048" in lowered.stdout
    over = client(10, 2048, 2049)
    assert over.returncode == 2 and "out of memory" in over.stderr
    servers = mps.control("GPU-a", "get_server_list").split()
    assert len(servers) == 1  # one server per UID


def test_server_setters_need_a_known_server_pid(mps: MpsManager) -> None:
    mps.ensure("GPU-a", MpsSpec())
    with pytest.raises(MpsError, match="not found"):
        mps.control("GPU-a", "set_active_thread_percentage 12345 50")
    server = mps.control("GPU-a", "start_server -uid 1000")
    assert mps.control("GPU-a", f"set_active_thread_percentage {server} 30") == "30.0"
    assert mps.control("GPU-a", f"get_active_thread_percentage {server}") == "30.0"
