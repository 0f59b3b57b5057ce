"""An agent restarted with a wiped state directory finds its running task processes by their run marker:
it adopts the ones the desired state still lists (never starting them a second time) and stops the
others. The real agent process, on the simulated NVML, against the plane double."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from agents.runner import RUN_MARKER, Runner, find_launchers
from tests.agents.conftest import TOKEN
from whalegen.protocol import (
    ComputeUnit,
    DesiredState,
    DesiredTaskState,
    TaskSpec,
    TaskState,
    UnitKind,
)

pytestmark = pytest.mark.e2e

# One file per execution of the run, named by its pid: two files for one run is the run done twice.
RECORDING_SLEEP = (
    "import os, sys, time; d = os.environ['RECORD_DIR']; "
    "open(os.path.join(d, str(os.getpid())), 'w').close(); time.sleep(float(sys.argv[1]))"
)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wipe_state_dir(state_dir: Path) -> None:
    """Everything the agent keeps; the simulated host's driver state (`sim/`) is the hardware's, not the
    agent's, and stays."""
    for child in state_dir.iterdir():
        if child.name == "sim":
            continue
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def _long_task(task_id: str, gpu: str, record_dir: Path, sleep_s: float) -> TaskSpec:
    return TaskSpec(
        task_id,
        (sys.executable, "-c", RECORDING_SLEEP, str(sleep_s)),
        gpu,
        ComputeUnit(UnitKind.WHOLE),
        env={"RECORD_DIR": str(record_dir)},
        stop_grace_s=2.0,
    )


@pytest.fixture
def record_dir(shared_dir: Path) -> Path:
    return shared_dir


def _kill_recorded(record_dir: Path) -> None:
    for entry in record_dir.iterdir():
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(os.getpgid(int(entry.name)), signal.SIGKILL)


def test_an_agent_restarted_with_a_wiped_state_dir_adopts_the_listed_run_instead_of_starting_it_again(
    plane, agent_process, record_dir: Path
) -> None:
    agent = agent_process({"nodes": [{"name": "a", "gpus": [{"sku": "l40s"}]}]})
    agent.start()
    gpu = plane.wait_for(lambda: plane.heartbeats[-1] if plane.heartbeats else None).inventory[0].uuid
    desired = DesiredState(1, tasks=(_long_task("long", gpu, record_dir, 6.0),))
    plane.set_desired(TOKEN, desired)
    try:
        started = plane.wait_for(lambda: plane.task_reports("long"), what="the run to start")[0]
        plane.wait_for(lambda: list(record_dir.iterdir()), what="the run's record")
        agent.proc.kill()  # the host's agent dies without a word, and its state directory goes with it
        agent.proc.wait()
        _wipe_state_dir(agent.state_dir)
        assert _alive(started.pid)

        agent.start()  # the plane still lists the run: a stale agent would start it again now
        adopted = plane.wait_for(
            lambda: next((r for r in plane.task_reports("long") if "run marker" in r.reason), None),
            what="the re-adoption report",
        )
        assert adopted.state is TaskState.RUNNING and adopted.pid == started.pid
        listed = plane.wait_for(
            lambda: next((h for h in reversed(plane.heartbeats) if h.running), None),
            what="a heartbeat listing the adopted run",
        )
        assert [(r.task_id, r.attempt, r.pid) for r in listed.running] == [("long", 0, started.pid)]
        done = plane.wait_for(
            lambda: next((r for r in plane.task_reports("long") if r.state is TaskState.SUCCEEDED), None),
            timeout_s=30,
            what="the adopted run to succeed",
        )
        # The exit code came from the launcher's exit file, written into the re-created task directory.
        assert done.exit_code == 0
        assert len(list(record_dir.iterdir())) == 1, "the run was executed twice"
        assert [r.state for r in plane.task_reports("long")].count(TaskState.RUNNING) == 2  # start + adopt
    finally:
        _kill_recorded(record_dir)


def test_an_orphan_the_desired_state_no_longer_lists_is_stopped_after_a_wiped_restart(
    plane, agent_process, record_dir: Path
) -> None:
    agent = agent_process({"nodes": [{"name": "a", "gpus": [{"sku": "l40s"}]}]})
    agent.start()
    gpu = plane.wait_for(lambda: plane.heartbeats[-1] if plane.heartbeats else None).inventory[0].uuid
    plane.set_desired(TOKEN, DesiredState(1, tasks=(_long_task("orphan", gpu, record_dir, 60.0),)))
    try:
        started = plane.wait_for(lambda: plane.task_reports("orphan"), what="the run to start")[0]
        # Its command runs (not only its launcher, which reads its sandbox plan from the state directory
        # first): the wipe below must find a run to orphan.
        plane.wait_for(lambda: list(record_dir.iterdir()), what="the run's record")
        agent.proc.kill()
        agent.proc.wait()
        _wipe_state_dir(agent.state_dir)
        # Past the loss threshold the plane requeued the task elsewhere: this node's list is empty.
        plane.set_desired(TOKEN, DesiredState(2, tasks=()))
        agent.start()
        stopped = plane.wait_for(
            lambda: next((r for r in plane.task_reports("orphan") if r.state is TaskState.STOPPED), None),
            timeout_s=30,
            what="the orphan to be stopped",
        )
        assert stopped.reason == "no longer in the desired state"
        assert not _alive(started.pid)
    finally:
        _kill_recorded(record_dir)


def test_a_desired_stop_reaches_an_orphan_adopted_by_its_marker(
    plane, agent_process, record_dir: Path
) -> None:
    agent = agent_process({"nodes": [{"name": "a", "gpus": [{"sku": "l40s"}]}]})
    agent.start()
    gpu = plane.wait_for(lambda: plane.heartbeats[-1] if plane.heartbeats else None).inventory[0].uuid
    task = _long_task("cancelled", gpu, record_dir, 60.0)
    plane.set_desired(TOKEN, DesiredState(1, tasks=(task,)))
    try:
        started = plane.wait_for(lambda: plane.task_reports("cancelled"), what="the run to start")[0]
        plane.wait_for(lambda: list(record_dir.iterdir()), what="the run's record")  # its command runs
        agent.proc.kill()
        agent.proc.wait()
        _wipe_state_dir(agent.state_dir)
        agent.start()
        plane.wait_for(
            lambda: any("run marker" in r.reason for r in plane.task_reports("cancelled")), what="adoption"
        )
        plane.set_desired(
            TOKEN, DesiredState(2, tasks=(dataclasses.replace(task, desired=DesiredTaskState.STOP),))
        )
        stopped = plane.wait_for(
            lambda: next((r for r in plane.task_reports("cancelled") if r.state is TaskState.STOPPED), None),
            timeout_s=30,
            what="the adopted run to be stopped",
        )
        assert stopped.reason == "stopped by the plane" and not _alive(started.pid)
        assert len(list(record_dir.iterdir())) == 1
    finally:
        _kill_recorded(record_dir)


def test_scan_adopts_only_this_nodes_launchers(tmp_path: Path, record_dir: Path) -> None:
    """Several agents may share a host (the simulated fleets do): each takes back only its own runs."""
    mine, other = Runner(tmp_path / "a", node_name="node-a"), Runner(tmp_path / "b", node_name="node-b")
    env = dict(os.environ, RECORD_DIR=str(record_dir))
    command = [sys.executable, "-c", RECORDING_SLEEP, "30"]
    try:
        ours = mine.start("7", command, env, device_uuid=None, now_s=time.time(), attempt=2)
        theirs = other.start("7", command, env, device_uuid=None, now_s=time.time(), attempt=2)
        # A launcher just started may still be inside exec (its /proc cmdline not yet the launcher's): wait
        # until both show, as an agent restarting beside long-running launchers never has to.
        deadline = time.monotonic() + 10
        markers = {f.pid: f.marker for f in find_launchers()}
        while {ours.pid, theirs.pid} - set(markers) and time.monotonic() < deadline:
            time.sleep(0.05)
            markers = {f.pid: f.marker for f in find_launchers()}
        assert markers[ours.pid] == ("node-a", "7", 2) and markers[theirs.pid] == ("node-b", "7", 2)
        # The task's own process inherits the marker but is not a launcher.
        deadline = time.monotonic() + 10
        while len(list(record_dir.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        task_pids = {int(p.name) for p in record_dir.iterdir()}
        assert task_pids and not task_pids & set(markers)
        assert os.environ.get(RUN_MARKER) is None

        fresh = Runner(tmp_path / "a-again", node_name="node-a")
        adopted = fresh.scan()
        assert [(p.key, p.pid, p.attempt) for p in adopted] == [("7#2", ours.pid, 2)]
        assert fresh.scan() == []  # already adopted
        assert Path(adopted[0].task_dir).is_dir()
    finally:
        for proc in (mine, other):
            for task in proc.tasks.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(task.pid, signal.SIGKILL)


def test_scan_leaves_another_planes_node_of_the_same_name_alone(tmp_path: Path, record_dir: Path) -> None:
    """Two planes' agents on one host (a demo beside the test suite's demos) may both run a node called
    `us-h200-01`: an agent started with a fresh state directory takes back only its own plane's runs, so
    it never stops the other plane's work as an orphan."""
    node = f"us-h200-01-{tmp_path.name}"  # one name for both planes, not a demo's running on this host
    ours = Runner(tmp_path / "a", node_name=node, plane="http://127.0.0.1:8000")
    theirs = Runner(tmp_path / "b", node_name=node, plane="http://127.0.0.1:9000")
    env = dict(os.environ, RECORD_DIR=str(record_dir))
    command = [sys.executable, "-c", RECORDING_SLEEP, "30"]
    try:
        mine = ours.start("7", command, env, device_uuid=None, now_s=time.time())
        other = theirs.start("7", command, env, device_uuid=None, now_s=time.time())
        fresh = Runner(tmp_path / "a-again", node_name=node, plane="http://127.0.0.1:8000")
        assert [p.pid for p in fresh.scan()] == [mine.pid]
        assert _alive(other.pid)
    finally:
        for runner in (ours, theirs):
            for task in runner.tasks.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(task.pid, signal.SIGKILL)
