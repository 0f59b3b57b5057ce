"""The demo's starving task, end to end: a 2-GPU whole task in a pool whose first GPU is an idle MIG GPU
(carved 3g.40gb@0 + 3g.40gb@4) beside free whole GPUs starts within two cycles, on the whole GPUs.
Real agent on simulated NVML, real Celery workers through Redis, PostgreSQL under it (before
`whalegen.scheduling.decide` the engine chose MIG GPU 0 + whole GPU 1 and the commit found no unit for
GPU 0, every cycle: `needs_layout_change` forever)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import CyclePump, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_two_gpu_whole_task_beside_an_idle_mig_gpu_starts_within_two_cycles(
    live_server: Any, agents: Any, cycle_pump: CyclePump, settings: Any
) -> None:
    from apps.fleet.nodes import node_token_issue
    from apps.inventory.models import Gpu, Node
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.scheduling.models import Assignment, Cycle
    from apps.tenants.services import tenant_create
    from apps.workloads.models import Task
    from apps.workloads.services import TaskSubmission, queue_create, quota_set, task_submit

    settings.WHALEGEN_AGENT_HEARTBEAT_S = 1.0
    speech = tenant_create(slug="speech", name="Speech")
    pool = pool_create(name="h100-train", runtime="process")
    node, _ = node_register(
        cluster=cluster_create(name="us-1"), pool=pool, name="h100-01", cpu_milli=64_000, mem_mib=524_288
    )
    gpu_add(
        node=node,
        index=0,
        model="H100-80GB",
        partition_mode=Gpu.PartitionMode.MIG,
        mig_layout=[("3g.40gb", 0), ("3g.40gb", 4)],
    )
    for index in (1, 2, 3):
        gpu_add(node=node, index=index, model="H100-80GB")
    quota_set(tenant=speech, pool=pool, guaranteed_milli=8_000, borrow_limit_milli=4_000)
    queue_create(tenant=speech, pool=pool, name="train", default_priority=10)
    agent = agents(
        token=node_token_issue(node=node),
        node_name="h100-01",
        gpus=[{"sku": "h100-80gb-sxm", "mig": "enabled"}] + [{"sku": "h100-80gb-sxm"}] * 3,
    )
    agent.start()
    wait_for(
        lambda: (
            Node.objects.filter(pk=node.pk, last_heartbeat_at__isnull=False).exists()
            and Gpu.objects.filter(node=node, uuid__startswith="GPU-").count() == 4
        ),
        timeout_s=60,
        what="the agent to register and heartbeat",
    )
    task, _ = task_submit(
        tenant=speech,
        request=TaskSubmission(
            queue="train",
            name="asr-finetune",
            gpu_count=2,
            gpu_mem_mib=60_000,
            kind="training",
            command=["python3", "-c", "import time; time.sleep(30)"],
        ),
        submitted_by=None,
    )
    cycle_pump.start()
    try:
        wait_for(
            lambda: Task.objects.get(pk=task.pk).state == Task.State.RUNNING,
            timeout_s=60,
            what="the 2-GPU task to run",
        )
    except AssertionError as exc:
        task.refresh_from_db()
        raise AssertionError(f"{exc}: {task.state} {task.why_pending_code} {task.why_pending}") from None
    assignment = Assignment.objects.get(task=task)
    cycles_before = Cycle.objects.filter(pool=pool, pk__lte=assignment.cycle_id).count()
    assert cycles_before <= 2, f"placed by the pool's cycle number {cycles_before}"
    indexes = sorted(u.gpu.index for u in assignment.units.select_related("gpu"))
    assert indexes and 0 not in indexes and len(indexes) == 2
    agent.stop()
