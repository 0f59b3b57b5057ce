"""How a run is isolated, on its way to the agent (protocol 1.4): the runtime and image the task got,
the pool's pull policy, the tenant, the tenant's uid/gid and the host limits. An older agent gets the
1.3 spec, and never a container run (it would run the image's argv as a command of its host)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.inventory.models import Pool
from apps.workloads.models import Task
from tests.apps.fleet.conftest import assign
from tests.apps.fleet.test_agent_api import desired, register
from whalegen import protocol as p

pytestmark = pytest.mark.django_db

IMAGE = "registry.example.org/ml/trainer:1.4"


def _specs(fleet: Any, agent_client: Any, version: str, **task: Any) -> tuple[p.TaskSpec, ...]:
    client = agent_client(fleet.token_a)
    assert register(client, version=version).status_code == 200
    Task.objects.filter(pk=fleet.task_a.pk).update(cpu_milli=2500, host_mem_mib=8192, **task)
    fleet.task_a.refresh_from_db()
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    return p.DesiredState.from_dict(desired(client).json()).tasks


def test_a_current_agent_gets_the_runs_isolation(fleet: Any, agent_client: Any, settings: Any) -> None:
    settings.WHALEGEN_TASK_PIDS_MAX = 512
    Pool.objects.filter(pk=fleet.h100.pk).update(image_pull_policy=Pool.PullPolicy.NEVER)
    (spec,) = _specs(fleet, agent_client, p.PROTOCOL_VERSION, runtime="container", image=IMAGE)
    uid = settings.WHALEGEN_TASK_UID_BASE + fleet.tenant_a.pk
    assert (spec.runtime, spec.image, spec.pull_policy) == (
        p.TaskRuntime.CONTAINER,
        IMAGE,
        p.PullPolicy.NEVER,
    )
    assert (spec.tenant, spec.run_as_uid, spec.run_as_gid) == ("vision", uid, uid)
    assert (spec.cpu_milli, spec.host_mem_mib, spec.pids_max) == (2500, 8192, 512)


def test_a_process_run_names_no_image_and_takes_the_tenants_own_uid(fleet: Any, agent_client: Any) -> None:
    fleet.tenant_a.run_uid = 250_000
    fleet.tenant_a.save(update_fields=["run_uid"])
    (spec,) = _specs(fleet, agent_client, p.PROTOCOL_VERSION)
    assert (spec.runtime, spec.image, spec.run_as_uid, spec.run_as_gid) == (
        p.TaskRuntime.PROCESS,
        "",
        250_000,
        250_000,
    )


def test_a_uid_the_range_no_longer_holds_is_sent_as_none(
    fleet: Any, agent_client: Any, settings: Any
) -> None:
    settings.WHALEGEN_TASK_UID_COUNT = 1  # only the base itself: the tenant's base + id fell outside
    (spec,) = _specs(fleet, agent_client, p.PROTOCOL_VERSION)
    assert (spec.run_as_uid, spec.run_as_gid) == (None, None)


def test_an_older_agent_gets_the_13_spec(fleet: Any, agent_client: Any) -> None:
    (spec,) = _specs(fleet, agent_client, "1.3")
    assert (spec.runtime, spec.tenant, spec.run_as_uid, spec.pids_max) == (
        p.TaskRuntime.PROCESS,
        "",
        None,
        None,
    )


def test_an_older_agent_never_gets_a_container_run(fleet: Any, agent_client: Any) -> None:
    assert _specs(fleet, agent_client, "1.3", runtime="container", image=IMAGE) == ()


# ---- secrets: the values go to the node that runs the task, and only there ----------------------------
SECRET = "sekret-123"


def test_the_node_running_the_task_still_gets_the_values(fleet: Any, agent_client: Any) -> None:
    client = agent_client(fleet.token_a)
    assert register(client).status_code == 200
    fleet.task_a.env = {"HF_TOKEN": SECRET}
    fleet.task_a.save(update_fields=["env"])
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    (spec,) = p.DesiredState.from_dict(desired(client).json()).tasks
    assert spec.env["HF_TOKEN"] == SECRET


def test_another_node_does_not_get_the_task(fleet: Any, agent_client: Any) -> None:
    fleet.task_a.env = {"HF_TOKEN": SECRET}
    fleet.task_a.save(update_fields=["env"])
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    client = agent_client(fleet.token_b)
    assert register(client).status_code == 200
    assert SECRET not in desired(client).content.decode()


# ---- the fence: how long a run may outlive its agent's last acknowledged heartbeat ---------------------


@pytest.mark.parametrize(
    ("interval", "lost_after", "grace", "lease"),
    [(10.0, 3, 10.0, 20.0), (5.0, 10, 10.0, 35.0), (2.0, 6, 1.0, 9.0)],
    ids=["the defaults are floored at two heartbeats", "a long loss threshold", "a short grace"],
)
def test_register_sends_a_lease_that_ends_before_the_node_is_lost(
    fleet: Any, agent_client: Any, settings: Any, interval: float, lost_after: int, grace: float, lease: float
) -> None:
    settings.WHALEGEN_AGENT_HEARTBEAT_S = interval
    settings.WHALEGEN_NODE_LOST_HEARTBEATS = lost_after
    settings.WHALEGEN_AGENT_STOP_GRACE_S = grace
    answer = p.Registered.from_dict(register(agent_client(fleet.token_a)).json())
    assert answer.lease_s == lease
    assert answer.lease_s >= 2 * interval


def test_an_mps_gpus_daemon_defaults_are_its_share_so_a_task_cannot_raise_its_limits(
    fleet: Any, agent_client: Any
) -> None:
    from apps.inventory.models import Gpu
    from apps.inventory.services import gpu_add

    gpu = gpu_add(
        node=fleet.node, index=2, model="H100-80GB", partition_mode=Gpu.PartitionMode.MPS, mps_shares=4
    )
    client = agent_client(fleet.token_a)
    assert register(client, version=p.PROTOCOL_VERSION).status_code == 200
    layouts = {layout.gpu_uuid: layout for layout in p.DesiredState.from_dict(desired(client).json()).gpus}
    # A client's environment can only lower its server's limits: the server's default is the share itself.
    share = layouts[gpu.uuid].mps
    assert share is not None
    assert (share.default_thread_pct, share.default_pinned_mem_mib) == (25, gpu.units.first().mem_mib)
