"""Profiles fill from agent telemetry: what `GET /api/v1/profiles/` shows after a refresh."""

from __future__ import annotations

from datetime import timedelta

import pytest

from apps.forecasting.tasks import profiles_refresh
from apps.inventory.models import Gpu
from apps.workloads.models import Task
from tests.apps.factories import GpuSampleFactory, TaskSampleFactory
from tests.apps.scheduling.conftest import NOW

# Three runs of "bert" on the H100 without MIG, one after the other, ten heartbeats a minute apart each.
# Run 1 holds 6000 MiB from its first sample on (two processes: 4000 + 2000), duty cycle 30 %.
# Run 2 holds 6000 MiB, duty cycle alternating 20 / 40 %. Run 3 grows 1000 → 10000 MiB at 30 %.
MEM = {
    1: [6_000] * 10,
    2: [6_000] * 10,
    3: [1_000 * (i + 1) for i in range(10)],
}
UTIL = {1: [30] * 10, 2: [20, 40] * 5, 3: [30] * 10}


def _runs(world) -> tuple[list[Task], Gpu]:
    gpu = Gpu.objects.get(node=world.node, index=1)
    tasks = []
    for run in (1, 2, 3):
        start = NOW - timedelta(hours=4 - run)
        task = Task.objects.create(
            tenant=world.tenant_a, queue=world.queue_a, pool=world.h100, priority=0, profile_key="bert",
            state=Task.State.RUNNING if run == 3 else Task.State.SUCCEEDED, started_at=start,
            sla_class="online" if run == 3 else "batch",
            finished_at=None if run == 3 else start + timedelta(minutes=20),
        )  # fmt: skip
        for i in range(10):
            at = start + timedelta(minutes=i)
            GpuSampleFactory(gpu=gpu, at=at, util_gpu_pct=UTIL[run][i], mem_used_mib=MEM[run][i])
            if run == 1:
                TaskSampleFactory(task=task, gpu=gpu, at=at, used_mib=4_000)
                TaskSampleFactory(task=task, gpu=gpu, at=at, used_mib=2_000)
            else:
                TaskSampleFactory(task=task, gpu=gpu, at=at, used_mib=MEM[run][i])
        tasks.append(task)
    # Another key's run on the same GPU must not leak into "bert".
    other = Task.objects.create(
        tenant=world.tenant_a, queue=world.queue_a, pool=world.h100, priority=0, profile_key="llama",
        state=Task.State.RUNNING, started_at=NOW - timedelta(minutes=30),
    )  # fmt: skip
    TaskSampleFactory(task=other, gpu=gpu, at=NOW - timedelta(minutes=30), used_mib=70_000)
    return tasks, gpu


def test_a_refreshed_profile_shows_the_telemetry_numbers_and_right_sizing(world, api, monkeypatch) -> None:
    _runs(world)
    monkeypatch.setattr("django.utils.timezone.now", lambda: NOW)
    assert profiles_refresh() == 2  # bert (runs and telemetry) and llama (telemetry of a running task)
    rows = {r["profile_key"]: r for r in api(world.alice).get("/api/v1/profiles/").json()["results"]}
    bert = rows["bert"]
    # 30 samples: 20 at 6000 MiB, then 1000 … 10000 MiB.
    assert bert["gpu_mem_peak_mib"] == 10_000
    assert bert["gpu_mem_typical_mib"] == 6_000  # the median
    assert bert["gpu_mem_p95_mib"] == 8_550  # 8000 + 0.55 × 1000 (linear interpolation, rank 27.55)
    assert bert["mem_growth"] == "static"  # two runs static from the start, one growing
    assert bert["sla_class"] == "batch"  # what most of the key's tasks asked for (two of three)
    # Duty cycle: 20 % × 5, 30 % × 20, 40 % × 5 → mean 30 %, P95 40 %, σ = √(1000/30).
    assert bert["gpu_util_mean"] == pytest.approx(0.30)
    assert bert["gpu_util_p95"] == pytest.approx(0.40)
    sigma = (1_000 / 30) ** 0.5
    assert bert["gpu_util_burstiness"] == pytest.approx((sigma - 30) / (sigma + 30))
    assert (bert["telemetry_samples"], bert["telemetry_tasks"], bert["sample_count"]) == (30, 3, 2)
    last = NOW - timedelta(hours=1) + timedelta(minutes=9)  # run 3's last heartbeat
    assert bert["last_sample_at"].startswith(last.isoformat()[:19])
    assert bert["duration_p50_s"] == pytest.approx(1_200.0)
    # Right-sizing: 10000 MiB × 1.15 = 11500 MiB with ≥ 40 % of the compute: on an H100 the smallest
    # MIG profile is 3g.40gb (3/7 of the SMs; 1g/2g profiles hold the memory but not the duty cycle);
    # on an L4 (no MIG) an MPS share of 45 × 256 MiB with 40 % × 1.15 → 50 % of the threads.
    advice = {a["gpu_model"]: a for a in bert["right_sizing"]}
    assert advice["H100-80GB"]["need_mib"] == 11_500
    assert (advice["H100-80GB"]["unit"], advice["H100-80GB"]["mig_profile"]) == ("mig", "3g.40gb")
    assert (advice["L4"]["unit"], advice["L4"]["mps_mem_limit_mib"], advice["L4"]["mps_thread_pct"]) == (
        "mps", 11_520, 50,
    )  # fmt: skip
    llama = rows["llama"]
    assert (llama["gpu_mem_peak_mib"], llama["telemetry_samples"], llama["sample_count"]) == (70_000, 1, 0)
    assert llama["mem_growth"] == "unknown"  # one sample cannot tell a pattern


def test_a_refresh_reads_only_the_latest_telemetry_rows(world, settings, monkeypatch) -> None:
    from apps.forecasting.services import task_profiles_refresh

    _runs(world)
    settings.WHALEGEN_PROFILE_SAMPLE_ROWS = 10  # run 3's ten samples: the latest
    profile = task_profiles_refresh(tenant=world.tenant_a, profile_key="bert", now=NOW)
    assert (profile.telemetry_samples, profile.telemetry_tasks) == (10, 1)
    assert (profile.gpu_mem_peak_mib, profile.gpu_mem_typical_mib) == (10_000, 5_500)
    assert profile.mem_growth == "growing"


def test_a_key_without_telemetry_keeps_empty_memory_fields_and_gets_no_advice(world, api) -> None:
    start = NOW - timedelta(hours=2)
    Task.objects.create(
        tenant=world.tenant_a, queue=world.queue_a, pool=world.h100, priority=0, profile_key="tiny",
        state=Task.State.SUCCEEDED, started_at=start, finished_at=start + timedelta(seconds=90),
    )  # fmt: skip
    from apps.forecasting.services import task_profiles_refresh

    profile = task_profiles_refresh(tenant=world.tenant_a, profile_key="tiny", now=NOW)
    assert (profile.gpu_mem_peak_mib, profile.gpu_util_mean, profile.mem_growth) == (None, None, "")
    assert profile.telemetry_samples == 0 and profile.last_sample_at is None
    row = api(world.alice).get("/api/v1/profiles/").json()["results"][0]
    assert row["right_sizing"] == [] and row["duration_p50_s"] == pytest.approx(90.0)
