"""Profile-aware placement end to end (#14): in a mixed pool (an H200 node and an L40S node, each with its
real agent on simulated NVML), the real Celery workers run the production cycle under `whalegen-aware`;
a task whose profile key's telemetry (classified by the profile refresh, stored on the key's profile) says
bandwidth-bound runs on the HBM-rich H200, one whose telemetry
says compute-bound on the FLOPS-rich L40S, and each assigned event says why.

The keys' history (GPU and process samples of earlier runs) is written as the heartbeat service stores it
rather than produced by the simulator: the simulated NVML reports memory *used* as its memory utilisation,
where real NVML reports memory-controller busy time, so it cannot tell the two classes apart."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.apps.scheduling.test_profile_cycle import seed_history
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

    from apps.fleet.services import node_token_issue
    from apps.forecasting.services import profiles_refresh
    from apps.inventory.models import Gpu, Node
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.scheduling.models import Assignment
    from apps.tenants.services import tenant_create
    from apps.workloads.models import Task, TaskEvent
    from apps.workloads.services import TaskRequest, queue_create, quota_set, task_submit

    settings.WHALEGEN_AGENT_HEARTBEAT_S = 1.0
    tenant = tenant_create(slug="llm", name="LLM")
    pool = pool_create(name="mixed")
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
    now = timezone.now()
    h200_gpu = Gpu.objects.get(node=nodes["h200-01"])
    l40s_gpu = Gpu.objects.get(node=nodes["l40s-01"])
    # Each key's history ran on the other model: the choice follows the profile, not where it ran before.
    seed_history(tenant=tenant, gpu=l40s_gpu, key="decode", sm_pct=90, mem_ctrl_pct=81, until=now)
    seed_history(tenant=tenant, gpu=h200_gpu, key="gemm", sm_pct=90, mem_ctrl_pct=9, until=now)
    # The periodic profile refresh (apps.forecasting.tasks.profiles_refresh) stores each key's class; the
    # cycle only reads it.
    profiles_refresh(now=now)
    submitted = {}
    for key in ("gemm", "decode"):
        submitted[key], _ = task_submit(
            tenant=tenant,
            request=TaskRequest(
                queue="q", name=key, profile_key=key, command=["python3", "-c", "import time; time.sleep(20)"]
            ),
            submitted_by=None,
        )
    cycle_pump.start()
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
