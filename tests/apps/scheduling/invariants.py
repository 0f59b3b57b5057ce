"""An invariant checker over the database: what must hold after any number of cycles, however they raced."""

from __future__ import annotations

from collections import defaultdict

from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.scheduling.models import Assignment
from apps.workloads.models import Quota, Task

LIVE = {Task.State.ADMITTED, Task.State.ASSIGNED, Task.State.RUNNING}


def violations(pool_id: int) -> list[str]:
    found: list[str] = []
    tasks = {t.pk: t for t in Task.objects.filter(pool_id=pool_id)}
    live = Assignment.objects.filter(released_at__isnull=True, node__pool_id=pool_id)
    live_by_task: dict[int, list[Assignment]] = defaultdict(list)
    for assignment in live:
        live_by_task[assignment.task_id].append(assignment)
    # One live assignment per task, and only for live tasks; every live task holds one.
    for task_id, rows in live_by_task.items():
        if len(rows) > 1:
            found.append(f"task {task_id} has {len(rows)} live assignments")
        if tasks[task_id].state not in LIVE:
            found.append(f"task {task_id} is {tasks[task_id].state} but holds an assignment")
    for task in tasks.values():
        if task.state in {Task.State.ASSIGNED, Task.State.RUNNING} and task.pk not in live_by_task:
            found.append(f"task {task.pk} is {task.state} without an assignment")
    # Units: each held by at most one task (the one whose live assignment lists it), on that assignment's
    # node; a GPU never gives more than it has.
    held_by: dict[int, int] = {}
    for task_id, rows in live_by_task.items():
        if len(set(rows[0].unit_ids)) != len(rows[0].unit_ids):
            found.append(f"task {task_id}'s assignment lists a unit twice: {rows[0].unit_ids}")
        for unit in rows[0].units.select_related("gpu"):
            if unit.pk in held_by:
                found.append(f"unit {unit.pk} is in the assignments of {held_by[unit.pk]} and {task_id}")
            held_by[unit.pk] = task_id
            if unit.gpu.node_id != rows[0].node_id:
                found.append(f"unit {unit.pk} of task {task_id} is on another node than its assignment")
    gpu_milli: dict[int, int] = defaultdict(int)
    gpu_mem: dict[int, int] = defaultdict(int)
    for unit in ComputeUnit.objects.filter(gpu__node__pool_id=pool_id, pk__in=list(held_by)):
        gpu_milli[unit.gpu_id] += unit.gpu_milli
        gpu_mem[unit.gpu_id] += unit.mem_mib
    for gpu in Gpu.objects.filter(node__pool_id=pool_id):
        if gpu_milli[gpu.pk] > 1000 or gpu_mem[gpu.pk] > gpu.mem_mib:
            found.append(f"GPU {gpu.pk} over-committed: {gpu_milli[gpu.pk]} milli, {gpu_mem[gpu.pk]} MiB")
    # Nodes: CPU and host memory of what they run fit the host.
    cpu: dict[int, int] = defaultdict(int)
    mem: dict[int, int] = defaultdict(int)
    for task_id, rows in live_by_task.items():
        cpu[rows[0].node_id] += tasks[task_id].cpu_milli
        mem[rows[0].node_id] += tasks[task_id].host_mem_mib
    for node in Node.objects.filter(pool_id=pool_id):
        if cpu[node.pk] > node.cpu_milli or mem[node.pk] > node.mem_mib:
            found.append(f"node {node.name} over-committed: {cpu[node.pk]} CPU milli, {mem[node.pk]} MiB")
    # Quotas: what live tasks hold never exceeds guarantee + borrow limit.
    usage: dict[int, int] = defaultdict(int)
    for task in tasks.values():
        if task.state in LIVE:
            usage[task.tenant_id] += task.charge_milli
    for quota in Quota.objects.filter(pool_id=pool_id):
        if usage[quota.tenant_id] > quota.limit_milli:
            found.append(
                f"tenant {quota.tenant_id} runs {usage[quota.tenant_id]} > limit {quota.limit_milli}"
            )
    # GPU-memory bounds: what live tasks state never exceeds a quota's bound (pending ones hold nothing).
    usage_mem: dict[int, int] = defaultdict(int)
    for task in tasks.values():
        if task.state in LIVE:
            usage_mem[task.tenant_id] += task.charge_mem_mib
    for quota in Quota.objects.filter(pool_id=pool_id, gpu_mem_limit_mib__isnull=False):
        if usage_mem[quota.tenant_id] > quota.gpu_mem_limit_mib:
            found.append(
                f"tenant {quota.tenant_id} holds {usage_mem[quota.tenant_id]} MiB GPU memory > bound "
                f"{quota.gpu_mem_limit_mib}"
            )
    return found


def consistent_violations(pool_id: int) -> list[str]:
    """`violations` over one REPEATABLE READ snapshot, for checks while workers and agents still commit:
    read query by query, a unit bound after the assignments were read would look held without one."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return violations(pool_id)
