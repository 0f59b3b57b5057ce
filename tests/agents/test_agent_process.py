"""The real agent process against the simulated NVML and a live plane double, end to end."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.agents.conftest import TOKEN
from whalegen.protocol import (
    PROTOCOL_VERSION,
    ComputeUnit,
    DesiredState,
    DesiredTaskState,
    GpuLayout,
    MigInstanceSpec,
    MpsSpec,
    PartitionMode,
    PartitionState,
    TaskSpec,
    TaskState,
    UnitKind,
)

pytestmark = pytest.mark.e2e

APP = [sys.executable, "-m", "agents.sim.fake_cuda_app"]


def fake_app(*args: object) -> tuple[str, ...]:
    return (*APP, *(str(a) for a in args))


def spec(*gpus: dict[str, object]) -> dict[str, object]:
    return {"nodes": [{"name": "a", "gpus": list(gpus)}]}


def gpu_uuids(plane, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    heartbeat = plane.wait_for(lambda: plane.heartbeats[-1] if plane.heartbeats else None, what="a heartbeat")
    assert len(heartbeat.inventory) == count
    return [gpu.uuid for gpu in heartbeat.inventory]


def final(plane, task_id: str, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    terminal = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST, TaskState.REJECTED}
    return plane.wait_for(
        lambda: next((r for r in plane.task_reports(task_id) if r.state in terminal), None),
        timeout_s,
        f"task {task_id} to end",
    )


def partition(plane, gpu_uuid: str, generation: int):  # type: ignore[no-untyped-def]
    return plane.wait_for(
        lambda: next(
            (p for p in reversed(plane.partition_reports(gpu_uuid)) if p.generation == generation), None
        ),
        what=f"a partition report for generation {generation}",
    )


def test_agent_registers_heartbeats_and_applies_mig_layouts_on_h100_and_h200(plane, agent_process) -> None:
    agent = agent_process(
        spec({"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "h200-141gb", "mig": "enabled"})
    )
    agent.start()
    h100, h200 = gpu_uuids(plane, 2)
    registration = plane.registrations[0]
    assert registration.node_name == "a" and registration.protocol_version == PROTOCOL_VERSION
    assert [g.model for g in registration.inventory] == ["H100-80GB", "H200-141GB"]
    heartbeat = plane.heartbeats[-1]
    # MIG mode: device utilisation is NOT_SUPPORTED and reported as such, not as a failure.
    assert all("utilization" in t.not_supported for t in heartbeat.telemetry)

    desired = DesiredState(
        generation=1,
        gpus=(
            GpuLayout(
                h100,
                PartitionMode.MIG,
                (MigInstanceSpec("4g.40gb"), MigInstanceSpec("2g.20gb"), MigInstanceSpec("1g.10gb")),
            ),
            GpuLayout(
                h200, PartitionMode.MIG, (MigInstanceSpec("3g.71gb", start=0), MigInstanceSpec("3g.71gb"))
            ),
        ),
        tasks=(
            TaskSpec(
                "mig-task",
                fake_app("--alloc-mib", 1000, "--step-s", 0.1),
                h200,
                ComputeUnit(UnitKind.MIG, mig_profile="3g.71gb", mig_start=4),
            ),
        ),
    )
    plane.set_desired(TOKEN, desired)
    h100_report, h200_report = partition(plane, h100, 1), partition(plane, h200, 1)
    assert h100_report.state is PartitionState.OK
    assert sorted((i.profile, i.start, i.size) for i in h100_report.instances) == [
        ("1g.10gb", 6, 1),
        ("2g.20gb", 4, 2),
        ("4g.40gb", 0, 4),
    ]
    assert h200_report.state is PartitionState.OK
    assert [(i.profile, i.start) for i in h200_report.instances] == [("3g.71gb", 0), ("3g.71gb", 4)]
    assert all(
        i.mig_uuid and i.mig_uuid.startswith("MIG-") for i in h100_report.instances + h200_report.instances
    )

    done = final(plane, "mig-task")
    assert done.state is TaskState.SUCCEEDED and done.exit_code == 0
    mig_uuid = next(i.mig_uuid for i in h200_report.instances if i.start == 4)
    assert f"device {mig_uuid}" in agent.task_file("mig-task", "stdout.log")

    # Idempotency: periodic re-reconciles of an unchanged host make no mutating NVML call.
    made = agent.mutating_calls()
    assert made.count("nvmlDeviceCreateGpuInstanceWithPlacement") == 5
    reconciles_before = len([c for c in agent.calls() if c["function"] == "nvmlDeviceGetMigMode"])
    plane.wait_for(
        lambda: (
            len([c for c in agent.calls() if c["function"] == "nvmlDeviceGetMigMode"]) > reconciles_before + 4
        ),
        what="more reconcile passes",
    )
    assert agent.mutating_calls() == made
    assert agent.stop() == 0


def test_an_impossible_layout_is_refused_with_nvmls_error_and_nothing_changes(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "h100-80gb-sxm", "mig": "enabled"}))
    agent.start()
    (h100,) = gpu_uuids(plane, 1)
    layout = GpuLayout(
        h100,
        PartitionMode.MIG,
        (MigInstanceSpec("3g.40gb"), MigInstanceSpec("3g.40gb"), MigInstanceSpec("1g.10gb")),
    )
    plane.set_desired(TOKEN, DesiredState(1, gpus=(layout,)))
    report = partition(plane, h100, 1)
    assert report.state is PartitionState.INFEASIBLE
    assert [(e.code, e.name) for e in report.errors] == [(23, "INSUFFICIENT_RESOURCES")]
    assert agent.mutating_calls() == []


def test_mps_limits_reach_the_task_environment_and_bite(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "l40s"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    mps_unit = ComputeUnit(UnitKind.MPS, thread_pct=25, pinned_mem_mib=2048)
    desired = DesiredState(
        1,
        gpus=(
            GpuLayout(
                gpu, PartitionMode.MPS, mps=MpsSpec(default_thread_pct=50, default_pinned_mem_mib=8192)
            ),
        ),
        tasks=(
            TaskSpec("fits", fake_app("--alloc-mib", 1500, "--step-s", 0.1), gpu, mps_unit),
            TaskSpec("too-big", fake_app("--alloc-mib", 3000, "--step-s", 0.1), gpu, mps_unit),
            TaskSpec(
                "asks-more",
                fake_app("--alloc-mib", 10, "--step-s", 0.1),
                gpu,
                ComputeUnit(UnitKind.MPS, thread_pct=80),
            ),
        ),
    )
    plane.set_desired(TOKEN, desired)
    assert partition(plane, gpu, 1).state is PartitionState.OK
    fits, too_big, asks_more = final(plane, "fits"), final(plane, "too-big"), final(plane, "asks-more")
    assert fits.state is TaskState.SUCCEEDED and asks_more.state is TaskState.SUCCEEDED
    assert "thread_pct=25 pinned_limit_mib=2048" in agent.task_file("fits", "stdout.log")
    assert too_big.state is TaskState.FAILED and too_big.exit_code == 2
    assert "out of memory" in agent.task_file("too-big", "stderr.log")
    # A client can only lower the server's share: 80 % asked under a 50 % default gives 50 %.
    assert "thread_pct=50 pinned_limit_mib=8192" in agent.task_file("asks-more", "stdout.log")
    control_log = next(agent.state_dir.glob("mps/*/log/control.log")).read_text()
    time.sleep(2.5)  # two more reconcile passes
    again = next(agent.state_dir.glob("mps/*/log/control.log")).read_text()
    assert (
        again.count("set_default_active_thread_percentage")
        == control_log.count("set_default_active_thread_percentage")
        == 1
    )
    assert agent.mutating_calls() == ["nvmlDeviceSetComputeMode"]


def test_a_time_slice_overrun_is_stopped_with_the_reason(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "h100-80gb-sxm"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    slice_unit = ComputeUnit(UnitKind.TIMESLICE, mem_limit_mib=4000)
    plane.set_desired(
        TOKEN,
        DesiredState(
            1,
            gpus=(GpuLayout(gpu, PartitionMode.TIMESLICE),),
            tasks=(
                TaskSpec(
                    "grows",
                    fake_app("--alloc-mib", 1000, "--grow-mib", 1000, "--steps", 40, "--step-s", 0.25),
                    gpu,
                    slice_unit,
                    stop_grace_s=1,
                ),
                TaskSpec(
                    "stays", fake_app("--alloc-mib", 3000, "--steps", 4, "--step-s", 0.25), gpu, slice_unit
                ),
            ),
        ),
    )
    grows, stays = final(plane, "grows"), final(plane, "stays")
    assert grows.state is TaskState.FAILED
    assert grows.reason.startswith("timeslice_memory_exceeded: used ")
    assert "> slice 4000 MiB" in grows.reason
    assert grows.signal == 15  # SIGTERM was enough
    assert stays.state is TaskState.SUCCEEDED


def test_running_tasks_survive_a_plane_outage_and_reports_arrive_afterwards(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "l40s"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    plane.set_desired(
        TOKEN,
        DesiredState(
            1,
            tasks=(
                TaskSpec(
                    "long",
                    fake_app("--alloc-mib", 100, "--steps", 12, "--step-s", 0.25),
                    gpu,
                    ComputeUnit(UnitKind.WHOLE),
                ),
            ),
        ),
    )
    running = plane.wait_for(lambda: plane.task_reports("long"), what="the task to start")[0]
    assert running.state is TaskState.RUNNING
    plane.stop()
    time.sleep(4.5)  # the task ends during the outage
    assert not any(r.state is TaskState.SUCCEEDED for r in plane.task_reports("long"))
    assert list((agent.state_dir / "outbox").glob("*.json")), "the final report waits on disk"
    plane.start()
    done = final(plane, "long", timeout_s=40)
    assert done.state is TaskState.SUCCEEDED and done.pid == running.pid
    assert [r.state for r in plane.task_reports("long")].count(TaskState.RUNNING) == 1  # never restarted
    assert agent.proc.poll() is None


def test_a_restarted_agent_readopts_its_running_task(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "h200-141gb", "mig": "enabled"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    plane.set_desired(
        TOKEN,
        DesiredState(
            1,
            gpus=(GpuLayout(gpu, PartitionMode.MIG, (MigInstanceSpec("7g.141gb"),)),),
            tasks=(
                TaskSpec(
                    "survivor",
                    fake_app("--alloc-mib", 500, "--steps", 16, "--step-s", 0.25, "--exit-code", 3),
                    gpu,
                    ComputeUnit(UnitKind.MIG, mig_profile="7g.141gb"),
                ),
            ),
        ),
    )
    started = plane.wait_for(lambda: plane.task_reports("survivor"), what="the task to start")[0]
    assert agent.stop() == 0
    os.kill(started.pid, 0)  # still running without its agent
    created = agent.mutating_calls()
    agent.start()
    readopted = plane.wait_for(
        lambda: next((r for r in plane.task_reports("survivor") if "re-adopted" in r.reason), None),
        what="the re-adoption report",
    )
    assert readopted.state is TaskState.RUNNING and readopted.pid == started.pid
    done = final(plane, "survivor", timeout_s=30)
    assert done.state is TaskState.FAILED and done.exit_code == 3  # learned from the launcher's exit file
    assert agent.mutating_calls() == created  # the MIG instance it runs on was kept, not re-created


def test_a_lost_gpu_after_xid_79_is_reported(plane, agent_process) -> None:
    agent = agent_process(spec({"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "l40s"}))
    agent.start()
    h100, l40s = gpu_uuids(plane, 2)
    agent.sim_command(op="inject_xid", gpu=0, xid=79)
    heartbeat = plane.wait_for(
        lambda: next((h for h in reversed(plane.heartbeats) if h.lost_gpus), None),
        what="a heartbeat naming the lost GPU",
    )
    assert heartbeat.lost_gpus == (h100,)
    assert [t.gpu_uuid for t in heartbeat.telemetry] == [l40s]
    events = [e for h in plane.heartbeats for e in h.events if e.kind == "xid"]
    assert [(e.gpu_uuid, e.xid, e.fatal) for e in events] == [(h100, 79, True)]
    lost = plane.wait_for(lambda: plane.partition_reports(h100), what="a partition report")[-1]
    assert lost.state is PartitionState.GPU_LOST
    plane.set_desired(
        TOKEN,
        DesiredState(
            2,
            tasks=(
                TaskSpec("on-lost", fake_app("--alloc-mib", 10), h100, ComputeUnit(UnitKind.WHOLE)),
                TaskSpec(
                    "on-good",
                    fake_app("--alloc-mib", 10, "--step-s", 0.1),
                    l40s,
                    ComputeUnit(UnitKind.WHOLE),
                    desired=DesiredTaskState.RUN,
                ),
            ),
        ),
    )
    assert final(plane, "on-lost").state is TaskState.REJECTED
    assert final(plane, "on-good").state is TaskState.SUCCEEDED


def test_told_not_to_long_poll_the_agent_fetches_when_a_heartbeat_names_a_newer_generation(
    plane, agent_process
) -> None:
    """A plane of thousands of nodes answers `poll_wait_s` 0 (docs/fleet.md, "Change marks"): the agent
    holds no request open; it fetches once after registering, then only when a heartbeat's answer names
    a newer generation than it holds. Before: it long-polled whatever the plane said."""
    plane.poll_wait_s = 0.0
    agent = agent_process(spec({"sku": "l40s"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    plane.wait_for(lambda: plane.polls, what="the fetch after registering")
    time.sleep(2.0)  # four heartbeats with nothing new: no fetch
    assert plane.polls == [(0, 0.0)]
    task = TaskSpec("hinted", fake_app("--steps", 1, "--step-s", 0.1), gpu, ComputeUnit(UnitKind.WHOLE))
    plane.set_desired(TOKEN, DesiredState(1, tasks=(task,)))
    changed = time.monotonic()
    plane.wait_for(lambda: plane.task_reports("hinted"), what="the task to start")
    # A heartbeat every 0.5 s carries the hint; the fetch and the start follow within a tick or two.
    assert time.monotonic() - changed < 2.5
    assert final(plane, "hinted").state is TaskState.SUCCEEDED
    assert all(wait_s == 0.0 for _, wait_s in plane.polls)
    assert [generation for generation, _ in plane.polls] == [0, 0]  # registration, then the hint
