"""The agent's isolation decisions per run (agents/isolation/host.py): who may run here, with what
environment and what sandbox. Pure: no process is started."""

from __future__ import annotations

import dataclasses

import pytest

from agents.isolation import host
from whalegen.protocol import ComputeUnit, TaskRuntime, TaskSpec, UnitKind

ROOT = host.HostPolicy(is_root=True, agent_uid=0, container_ready=None)
NOT_ROOT = host.HostPolicy(is_root=False, agent_uid=1000)


def spec(**changes: object) -> TaskSpec:
    base = TaskSpec(
        "7",
        ("python", "train.py"),
        "GPU-1",
        ComputeUnit(UnitKind.WHOLE),
        env={"HF_TOKEN": "secret", "PATH": "/opt/conda/bin:/usr/bin"},
        tenant="speech",
        run_as_uid=200_002,
        run_as_gid=200_002,
        cpu_milli=2000,
        host_mem_mib=4096,
        pids_max=512,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "task", "live", "want"),
    [
        pytest.param(ROOT, spec(), [], None, id="a root agent runs a tenant's run in the uid range"),
        pytest.param(ROOT, spec(run_as_uid=None), [], "named no uid", id="no uid from the plane: refused"),
        pytest.param(ROOT, spec(run_as_uid=0), [], "uid 0 is outside", id="root asked for: refused"),
        pytest.param(ROOT, spec(run_as_gid=1000), [], "gid 1000 is outside", id="a gid outside the range"),
        pytest.param(NOT_ROOT, spec(), [], "is not root", id="not root, not declared single-tenant"),
        pytest.param(
            dataclasses.replace(NOT_ROOT, single_tenant=True), spec(), ["speech"], None,
            id="not root, single-tenant, the same tenant",
        ),
        pytest.param(
            dataclasses.replace(NOT_ROOT, single_tenant=True), spec(), ["vision"], "tenant 'vision' has runs",
            id="not root, single-tenant, another tenant's runs live here",
        ),
        pytest.param(
            ROOT, spec(runtime=TaskRuntime.CONTAINER), [], "without an image",
            id="a container run needs an image",
        ),
        pytest.param(
            dataclasses.replace(ROOT, container_ready="podman is not installed"),
            spec(runtime=TaskRuntime.CONTAINER, image="registry.example/ml/train:1"), [],
            "cannot run containers: podman is not installed", id="no engine: the reason is the engine's",
        ),
        pytest.param(
            dataclasses.replace(NOT_ROOT, single_tenant=True),
            spec(runtime=TaskRuntime.CONTAINER, image="registry.example/ml/train:1"), [],
            "cannot run containers", id="not root: no containers",
        ),
    ],
)  # fmt: skip
def test_who_may_run_here(policy: host.HostPolicy, task: TaskSpec, live: list[str], want: str | None) -> None:
    refused = host.refusal(task, policy, live)
    if want is None:
        assert refused is None
    else:
        assert refused is not None and want in refused


def test_a_runs_environment_is_its_own_and_the_devices_not_the_agents() -> None:
    env = host.task_env(
        spec(env={"HF_TOKEN": "secret", "CUDA_VISIBLE_DEVICES": "all"}),
        backend_env={"WHALEGEN_SIM_PROC_DIR": "/var/lib/sim/procs"},
        device_env={"CUDA_VISIBLE_DEVICES": "GPU-1"},
        home="/var/lib/whalegen-agent/runs/7",
    )
    assert env == {
        "PATH": host.DEFAULT_PATH,
        "HOME": "/var/lib/whalegen-agent/runs/7",
        "LANG": "C.UTF-8",
        "WHALEGEN_SIM_PROC_DIR": "/var/lib/sim/procs",
        "HF_TOKEN": "secret",
        "CUDA_VISIBLE_DEVICES": "GPU-1",  # the task cannot widen its devices through its own env
    }


def test_a_root_process_plan_carries_the_tenants_uid_limits_and_sandbox() -> None:
    plan = host.process_plan(
        spec(),
        ROOT,
        name="gpu-001-7-0-abc",
        expose=["/w", "/w"],
        mask=["/dev/nvidia1"],
        lease_file="/s/l",
    )
    assert (plan.uid, plan.gid, plan.cgroup) == (200_002, 200_002, "whalegen/gpu-001-7-0-abc")
    assert (plan.cpu_milli, plan.host_mem_mib, plan.pids_max) == (2000, 4096, 512)
    assert plan.private_tmp and plan.expose == ("/w",) and plan.mask == ("/dev/nvidia1",)
    assert plan.lease_file == "/s/l"


def test_a_non_root_plan_is_only_the_fence() -> None:
    plan = host.process_plan(
        spec(),
        dataclasses.replace(NOT_ROOT, single_tenant=True),
        name="n",
        expose=["/w"],
        mask=[],
        lease_file="/l",
    )
    assert (plan.uid, plan.cgroup, plan.private_tmp, plan.lease_file) == (None, "", False, "/l")


def test_run_names_differ_per_plane_node_task_and_attempt() -> None:
    names = {
        host.run_name(node, plane, task, attempt)
        for node in ("gpu-001", "gpu-002")
        for plane in ("http://a", "http://b")
        for task in ("7", "8")
        for attempt in (0, 1)
    }
    assert len(names) == 16


@pytest.mark.parametrize(
    ("text", "want"),
    [("200000-299999", (200_000, 299_999)), (" 5000-5000 ", (5000, 5000))],
)
def test_uid_ranges_parse(text: str, want: tuple[int, int]) -> None:
    assert host.parse_uid_range(text) == want


@pytest.mark.parametrize("text", ["0-100", "200000", "300-200", "a-b", "999-2000"])
def test_bad_uid_ranges_are_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="uid range"):
        host.parse_uid_range(text)
