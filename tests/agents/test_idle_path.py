"""What an idle agent still does once its idle pass got cheaper (issue #42 item 2, benchmarks/agent_idle.py):
its state file saved on every change, a reconcile every `reconcile_s`, heartbeats on time, reports sent
after the outbox was seen empty; and the simulator's call log and process directory still seen live."""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import pytest

from agents import agent as agent_module
from agents.agent import Agent, AgentConfig
from agents.backend import NvmlBackend
from agents.sim import shim
from agents.sim.backend import simulated_backend
from agents.sim.core import SimSystem
from agents.sim.spec import build_system
from agents.state import Outbox
from whalegen.protocol import (
    DesiredState,
    GpuLayout,
    Heartbeat,
    HeartbeatAck,
    PartitionMode,
    Register,
    Registered,
    Report,
    ReportAck,
)

RECONCILE_S = 30.0
HEARTBEAT_S = 10.0


class FakeClock:
    def __init__(self, now_s: float = 1_000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class RecordingClient:
    """The plane as the agent's loop sees it: registration at the shipped pace, every message kept."""

    def __init__(self) -> None:
        self.heartbeats: list[Heartbeat] = []
        self.reports: list[Report] = []

    def register(self, message: Register) -> Registered:
        return Registered("node-a", heartbeat_interval_s=HEARTBEAT_S, poll_wait_s=0.0)

    def heartbeat(self, message: Heartbeat) -> HeartbeatAck:
        self.heartbeats.append(message)
        return HeartbeatAck(0)

    def report(self, message: Report) -> ReportAck:
        self.reports.append(message)
        return ReportAck(message.seq)

    def close(self) -> None:
        pass


def two_l40s() -> SimSystem:
    return build_system({"nodes": [{"name": "idle", "gpus": [{"sku": "l40s"}, {"sku": "l40s"}]}]})


def idle_agent(tmp_path: Path) -> tuple[Agent, RecordingClient, FakeClock, list[str]]:
    """A started agent on a simulated host of two GPUs, ticked by hand on a fake clock."""
    system = two_l40s()
    clock = FakeClock()
    # A node and cgroup root of its own: a root agent prunes its node's stale run cgroups at start.
    config = AgentConfig(server="http://127.0.0.1:9", token="t", state_dir=tmp_path / "state",
                         node_name="idle-test", cgroup_root="whalegen-idle-test", heartbeat_s=HEARTBEAT_S,
                         reconcile_s=RECONCILE_S)  # fmt: skip
    agent = Agent(config, simulated_backend(system), clock=clock)
    client = RecordingClient()
    agent.client = agent.poll_client = client  # type: ignore[assignment]
    agent.start()
    return agent, client, clock, [gpu.uuid for gpu in system.gpus]


def hand_over(agent: Agent, desired: DesiredState) -> None:
    """What the poller does with a fetched desired state."""
    with agent._inbox_lock:
        agent._inbox = desired


def saved(agent: Agent) -> dict[str, object]:
    data = json.loads(agent.state_file.path.read_text())
    assert isinstance(data, dict)
    return data


def run_for(agent: Agent, clock: FakeClock, seconds: int) -> None:
    """`seconds` passes of the loop, a tick apart (`tick_s` 1 s)."""
    for _ in range(seconds):
        agent.tick()
        clock.now_s += 1.0


def test_the_state_file_is_saved_on_each_new_desired_state_and_not_rewritten_while_idle(
    tmp_path: Path,
) -> None:
    agent, _, clock, (gpu0, gpu1) = idle_agent(tmp_path)
    writes: list[bool] = []
    save = agent.state_file.save
    agent.state_file.save = lambda data: writes.append(save(data)) or writes[-1]  # type: ignore[method-assign]
    first = DesiredState(1, gpus=(GpuLayout(gpu0), GpuLayout(gpu1)))
    hand_over(agent, first)
    run_for(agent, clock, 1)
    assert saved(agent)["desired"] == first.to_dict() and saved(agent)["generation_applied"] == 1
    written = writes.count(True)
    run_for(agent, clock, 40)  # idle: heartbeats, a reconcile, nothing changed
    assert writes.count(True) == written, "an idle agent rewrote its unchanged state file"
    # A new desired state is a new object: it is encoded and saved again, not the one remembered.
    second = DesiredState(2, gpus=(GpuLayout(gpu0, PartitionMode.TIMESLICE), GpuLayout(gpu1)))
    hand_over(agent, second)
    run_for(agent, clock, 1)
    assert saved(agent)["desired"] == second.to_dict() and saved(agent)["generation_applied"] == 2
    # One equal to the first again (a plane that went back): saved as it is, not as the last encoding.
    third = DesiredState(3, gpus=first.gpus)
    hand_over(agent, third)
    run_for(agent, clock, 1)
    assert saved(agent)["desired"] == third.to_dict()


def test_an_idle_agent_reconciles_every_reconcile_s_and_heartbeats_every_heartbeat_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, client, clock, (gpu0, gpu1) = idle_agent(tmp_path)
    reconciled_at: list[float] = []
    reconcile = agent_module.reconcile_mig

    def counting(backend: NvmlBackend, index: int, layout: GpuLayout, **kwargs: object):  # type: ignore[no-untyped-def]
        reconciled_at.append(clock.now_s)
        return reconcile(backend, index, layout, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_module, "reconcile_mig", counting)
    started_s = clock.now_s
    run_for(agent, clock, 1)  # registers, then heartbeats in the same pass
    hand_over(agent, DesiredState(1, gpus=(GpuLayout(gpu0), GpuLayout(gpu1))))
    run_for(agent, clock, 95)
    applied_s = started_s + 1
    # Both GPUs at the new desired state, then again at each reconcile_s, and not in between.
    want_reconciles = [applied_s + n * RECONCILE_S for n in range(4) for _ in (gpu0, gpu1)]
    assert reconciled_at == want_reconciles
    assert [h.sent_at_s - started_s for h in client.heartbeats] == [n * HEARTBEAT_S for n in range(10)]
    # The reconcile found the host as wanted: nothing to report after the first partition reports.
    assert sum(len(r.partitions) for r in client.reports) == 2


def test_a_report_queued_after_the_outbox_was_seen_empty_is_sent(tmp_path: Path) -> None:
    agent, client, clock, (gpu0, gpu1) = idle_agent(tmp_path)
    run_for(agent, clock, 5)  # registered, idle: the outbox was listed and found empty
    assert agent.outbox.pending() == [] and agent.outbox.count() == 0
    hand_over(agent, DesiredState(1, gpus=(GpuLayout(gpu0), GpuLayout(gpu1))))
    run_for(agent, clock, 1)
    assert [p.gpu_uuid for r in client.reports for p in r.partitions] == [gpu0, gpu1]
    assert agent.outbox.count() == 0 and list(agent.outbox.directory.glob("*.json")) == []


def test_the_outbox_sees_a_put_after_it_was_seen_empty_and_a_previous_agents_reports(tmp_path: Path) -> None:
    Outbox(tmp_path / "outbox").put(7, {"seq": 7})  # left by a previous agent
    outbox = Outbox(tmp_path / "outbox")
    assert outbox.count() == 1 and [seq for seq, _ in outbox.pending()] == [7]
    outbox.done(7)
    assert outbox.pending() == [] and outbox.count() == 0
    outbox.put(8, {"seq": 8})
    assert outbox.count() == 1 and outbox.pending() == [(8, {"seq": 8})]
    outbox.done(8)
    assert outbox.count() == 0
    outbox.put(9, {"seq": 9})
    assert outbox.pending() == [(9, {"seq": 9})]


# ---- the simulator -------------------------------------------------------------------------------------
def test_the_call_log_file_shows_each_call_as_it_is_made_and_is_closed_with_the_log(tmp_path: Path) -> None:
    sink = tmp_path / "calls.jsonl"
    system = build_system({"nodes": [{"name": "t", "gpus": [{"sku": "l40s"}]}]}, call_log_path=sink)
    backend = simulated_backend(system)
    assert not sink.exists(), "the file appears with the first call"
    backend.open()
    first = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [row["function"] for row in first] == ["nvmlInitWithFlags"]
    assert set(first[0]) == {"seq", "t_s", "function", "code", "args"}
    backend.inventory()  # read by another reader while the simulator goes on: every call is there
    rows = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [row["seq"] for row in rows] == list(range(len(rows))) and len(rows) > 2
    assert [row["function"] for row in rows] == [record.function for record in system.log.entries]
    fd = system.log._sink_fd
    assert fd is not None
    backend.close()
    shim.uninstall()  # pynvml's library slot holds the simulator
    del backend, system, rows, first
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def declare(proc_dir: Path, device_uuid: str) -> None:
    """What agents.sim.fake_cuda_app writes: this (live) process holds 512 MiB on the device."""
    (proc_dir / f"{os.getpid()}.json").write_text(json.dumps({"device_uuid": device_uuid, "used_mib": 512}))


def set_mtime_ns(path: Path, at_ns: int) -> None:
    os.utime(path, ns=(at_ns, at_ns))


@pytest.mark.parametrize(
    "last_change_s", [-10.0, 10.0], ids=["the directory settled long ago", "the directory changed just now"]
)
def test_a_program_declaring_itself_after_the_process_directory_was_seen_empty_is_seen(
    tmp_path: Path, last_change_s: float
) -> None:
    proc_dir = tmp_path / "procs"
    proc_dir.mkdir()
    system = build_system({"nodes": [{"name": "t", "gpus": [{"sku": "l40s"}]}]}, proc_dir=proc_dir)
    backend = simulated_backend(system)
    backend.open()
    # "just now": an mtime the listing cannot tell apart from its own moment (here: ahead of it).
    listed_mtime_ns = time.time_ns() + int(last_change_s * 1e9)
    set_mtime_ns(proc_dir, listed_mtime_ns)
    assert backend.processes(0) == []
    assert backend.processes(0) == []
    declare(proc_dir, system.gpus[0].uuid)
    if last_change_s > 0:
        # Created within the same timestamp tick as the change the empty listing saw: same mtime.
        set_mtime_ns(proc_dir, listed_mtime_ns)
    assert [(p.pid, p.used_mib) for p in backend.processes(0)] == [(os.getpid(), 512)]
    (proc_dir / f"{os.getpid()}.json").unlink()
    assert backend.processes(0) == []
    backend.close()
