"""The fence (issue 37 item 5): a run goes on only while the plane acknowledges its node's heartbeats.
The real agent process against the plane double, which asks for a 2 s lease and then stops answering
heartbeats, as a plane that has lost touch with the node would."""

from __future__ import annotations

import time

import pytest

from tests.agents.conftest import TOKEN
from tests.agents.test_agent_process import final, gpu_uuids, spec
from whalegen.protocol import ComputeUnit, DesiredState, TaskSpec, TaskState, UnitKind

pytestmark = pytest.mark.e2e

LEASE_S = 2.0


def _sleeper(task_id: str, gpu: str) -> TaskSpec:
    return TaskSpec(task_id, ("sleep", "60"), gpu, ComputeUnit(UnitKind.WHOLE), stop_grace_s=1.0)


def test_a_run_is_stopped_on_its_node_once_heartbeats_go_unacknowledged_and_new_runs_wait(
    plane, agent_process
) -> None:
    plane.lease_s = LEASE_S
    agent = agent_process(spec({"sku": "l40s"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    plane.set_desired(TOKEN, DesiredState(1, tasks=(_sleeper("long", gpu),)))
    started = plane.wait_for(lambda: plane.task_reports("long"), what="the run to start")[0]
    assert started.state is TaskState.RUNNING

    plane.refuse_heartbeats = True  # the plane is away: no heartbeat is acknowledged from now on
    away_at = time.time()
    ended = final(plane, "long", timeout_s=20)
    # Stopped by its own launcher within the lease (and the grace), not left running while the plane
    # runs its work elsewhere; the agent says why, as a lost run the plane may run again.
    assert ended.state is TaskState.LOST
    assert "lease ran out" in ended.reason
    assert ended.finished_at_s is not None and ended.finished_at_s - away_at < LEASE_S + 1.0 + 2.0
    # A run the plane hands over now (its poll still answers) waits: it would be fenced at once.
    plane.set_desired(TOKEN, DesiredState(2, tasks=(_sleeper("long", gpu), _sleeper("later", gpu))))
    plane.wait_for(
        lambda: any(g == 2 for g, _ in plane.polls) or None, what="the new desired state to be fetched"
    )
    time.sleep(2.0)
    assert not plane.task_reports("later"), "a run was started with the fence down"

    plane.refuse_heartbeats = False  # the plane is back: the next acknowledged heartbeat lifts the fence
    later = plane.wait_for(lambda: plane.task_reports("later"), timeout_s=20, what="the held run to start")
    assert later[0].state is TaskState.RUNNING


def test_a_working_directory_under_the_hosts_tmp_stays_reachable_behind_the_private_tmp(
    plane, agent_process, tmp_path
) -> None:
    # tmp_path is under /tmp/pytest-of-root (root's alone): the run gets it as its working directory, by
    # the path it named, although its /tmp is its own.
    work = tmp_path / "job"
    work.mkdir()
    work.chmod(0o777)
    agent = agent_process(spec({"sku": "l40s"}))
    agent.start()
    (gpu,) = gpu_uuids(plane, 1)
    task = TaskSpec(
        "in-dir",
        ("sh", "-c", "pwd; echo made > out"),
        gpu,
        ComputeUnit(UnitKind.WHOLE),
        working_dir=str(work),
    )
    plane.set_desired(TOKEN, DesiredState(1, tasks=(task,)))
    assert final(plane, "in-dir").state is TaskState.SUCCEEDED
    assert agent.task_file("in-dir", "stdout.log") == f"{work}\n"
    assert (work / "out").read_text() == "made\n"
