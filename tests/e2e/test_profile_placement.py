"""Profile-aware placement end to end (#14): in a mixed pool (an H200 node and an L40S node, each with its
real agent on simulated NVML), the real Celery workers run the production cycle under `whalegen-aware`;
a task whose profile key's telemetry (classified by the profile refresh, stored on the key's profile) says
bandwidth-bound runs on the HBM-rich H200, one whose telemetry
says compute-bound on the FLOPS-rich L40S, and each assigned event says why.

The keys' history is the simulator's own: a first run of each key (a fake CUDA program declaring its SM
and memory-controller duty cycles, `--sm-pct`/`--mem-pct`) is sampled from the agents' heartbeats, as NVML's
`utilization.gpu` and `utilization.memory`, and the profile refresh classifies the keys from those samples."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import CyclePump, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module", autouse=True)
def aware_cycle_policy() -> Iterator[None]:
    """The module's Celery workers (started once per module from this environment) run `whalegen-aware`."""
    before = os.environ.get("WHALEGEN_CYCLE_POLICY")
    os.environ["WHALEGEN_CYCLE_POLICY"] = "whalegen-aware"
    yield
    if before is None:
        os.environ.pop("WHALEGEN_CYCLE_POLICY", None)
    else:
        os.environ["WHALEGEN_CYCLE_POLICY"] = before


def test_a_bandwidth_bound_profile_runs_on_the_hbm_rich_model_of_a_mixed_pool(
    live_server: Any, agents: Any, cycle_pump: CyclePump, settings: Any
) -> None:
    from django.utils import timezone

    from apps.fleet.nodes import node_token_issue
    from apps.forecasting.services import profiles_refresh
    from apps.inventory.models import Gpu, Node
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.scheduling.models import Assignment
    from apps.tenants.services import tenant_create
    from apps.workloads.models import Task, TaskEvent, TaskProfile
    from apps.workloads.services import TaskSubmission, queue_create, quota_set, task_submit

    settings.WHALEGEN_AGENT_HEARTBEAT_S = 1.0
    settings.WHALEGEN_TELEMETRY_SAMPLE_S = 1.0  # a sample per heartbeat: a few seconds of run classify a key
    tenant = tenant_create(slug="llm", name="LLM")
    pool = pool_create(name="mixed", runtime="process")
    cluster = cluster_create(name="eu-1")
    nodes = {}
    for name, model, sku in (("h200-01", "H200-141GB", "h200-141gb"), ("l40s-01", "L40S", "l40s")):
        node, _ = node_register(cluster=cluster, pool=pool, name=name, cpu_milli=64_000, mem_mib=524_288)
        gpu_add(node=node, index=0, model=model)
        nodes[name] = node
        agents(token=node_token_issue(node=node), node_name=name, gpus=[{"sku": sku}]).start()
    quota_set(tenant=tenant, pool=pool, guaranteed_milli=2_000, borrow_limit_milli=0)
    queue_create(tenant=tenant, pool=pool, name="q", default_priority=10)
    wait_for(
        lambda: (
            Node.objects.filter(pool=pool, last_heartbeat_at__isnull=False).count() == 2
            and Gpu.objects.filter(node__pool=pool, uuid__startswith="GPU-").count() == 2
        ),
        timeout_s=60,
        what="both agents to register and heartbeat",
    )
    # 1. A first run of each key, side by side (one GPU each): a decode loop keeps the DRAM busy whenever
    #    its kernels run, a GEMM keeps it mostly quiet. The simulated NVML reports those duty cycles.
    duty = {"decode": ("90", "81"), "gemm": ("90", "9")}
    app = [
        sys.executable,
        "-m",
        "agents.sim.fake_cuda_app",
        "--alloc-mib",
        "20000",
        "--steps",
        "8",
        "--step-s",
        "1",
    ]
    first = {
        key: task_submit(
            tenant=tenant,
            request=TaskSubmission(
                queue="q", name=f"{key}-1", profile_key=key, command=[*app, "--sm-pct", sm, "--mem-pct", mem]
            ),
            submitted_by=None,
        )[0]
        for key, (sm, mem) in duty.items()
    }
    cycle_pump.start()
    for key, task in first.items():
        wait_for(
            lambda task=task: Task.objects.get(pk=task.pk).state == Task.State.SUCCEEDED,
            timeout_s=60,
            what=f"the first {key} run to finish",
        )
    # 2. The periodic profile refresh (apps.forecasting.tasks.profiles_refresh) classifies each key from
    #    the heartbeats' samples and stores the class; the cycle only reads it.
    profiles_refresh(now=timezone.now())
    classes = dict(TaskProfile.objects.filter(tenant=tenant).values_list("profile_key", "bound_class"))
    assert classes == {"decode": "bandwidth-bound", "gemm": "compute-bound"}, classes
    # 3. The second run of each key goes to the model its class runs fastest on.
    submitted = {}
    for key in ("gemm", "decode"):
        submitted[key], _ = task_submit(
            tenant=tenant,
            request=TaskSubmission(
                queue="q", name=key, profile_key=key, command=["python3", "-c", "import time; time.sleep(20)"]
            ),
            submitted_by=None,
        )
    for key, task in submitted.items():
        try:
            wait_for(
                lambda task=task: Task.objects.get(pk=task.pk).state == Task.State.RUNNING,
                timeout_s=60,
                what=f"the {key} task to run",
            )
        except AssertionError as exc:
            task.refresh_from_db()
            raise AssertionError(f"{exc}: {task.state} {task.why_pending_code} {task.why_pending}") from None
    placed_on = {
        key: Assignment.objects.get(task=task).units.select_related("gpu").get().gpu.model
        for key, task in submitted.items()
    }
    assert placed_on == {"decode": "H200-141GB", "gemm": "L40S"}
    reasons = {
        key: TaskEvent.objects.get(task=task, to_state=Task.State.ASSIGNED).reason
        for key, task in submitted.items()
    }
    assert "policy whalegen-aware: H200-141GB chosen" in reasons["decode"]
    assert "(bandwidth-bound, a = 0.10)" in reasons["decode"]
    assert "policy whalegen-aware: L40S chosen" in reasons["gemm"]
    assert "(compute-bound, a = 0.90)" in reasons["gemm"]
