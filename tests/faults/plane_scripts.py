"""Django-side helpers of the fault suite, run as subprocesses against the suite's own database
(`python -m tests.faults.plane_scripts seed|check …` with DATABASE_URL set): the suite's pytest process
keeps its own Django settings, so what touches the stack's database runs where the plane's code runs.

`seed` builds the world and prints it as JSON. `check` reads the database in one REPEATABLE READ
snapshot and prints what the fault checker needs: invariant violations, live work on lost nodes, and
each task's state and attempts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

NODES = ("n1", "n2", "n3")
GPUS_PER_NODE = 2


def seed() -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from apps.fleet.nodes import node_token_issue
    from apps.inventory.models import Pool
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.tenants.models import Membership
    from apps.tenants.services import membership_set, tenant_create, token_create
    from apps.workloads.services import queue_create, quota_set

    tenant = tenant_create(slug="faults", name="Faults")
    user = get_user_model().objects.create_user(username="fault-runner", password=None)
    membership_set(user=user, tenant=tenant, role=Membership.Role.MEMBER)
    cluster = cluster_create(name="f-1", region="lab")
    pool = pool_create(name="faults", runtime=Pool.Runtime.PROCESS)  # tasks are host commands
    nodes = {}
    for name in NODES:
        node, _ = node_register(cluster=cluster, pool=pool, name=name, cpu_milli=64_000, mem_mib=262_144)
        for index in range(GPUS_PER_NODE):
            gpu_add(node=node, index=index, model="L40S")
        nodes[name] = {
            "token": node_token_issue(node=node),
            "gpus": [{"sku": "l40s", "count": GPUS_PER_NODE}],
        }
    # Submission charges pending tasks too: the borrow limit leaves room for a stream of submissions; the
    # checker still compares every charge with what unfinished tasks hold.
    quota_set(tenant=tenant, pool=pool, guaranteed_milli=4000, borrow_limit_milli=40_000)
    queue_create(tenant=tenant, pool=pool, name="work")
    return {
        "token": token_create(user=user, tenant=tenant, name="faults")[1],
        "pool_id": pool.pk,
        "nodes": nodes,
    }


def seed_fleet(count: int, gpus: int) -> dict[str, Any]:
    """`count` nodes of `gpus` L40S each in one pool, with agent tokens (the heartbeat benchmark's fleet)."""
    from apps.fleet.nodes import node_token_issue
    from apps.inventory.models import Pool
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create

    cluster = cluster_create(name="bench-1", region="lab")
    pool = pool_create(name="bench", runtime=Pool.Runtime.PROCESS)
    tokens = {}
    for n in range(count):
        node, _ = node_register(
            cluster=cluster, pool=pool, name=f"b{n:05d}", cpu_milli=64_000, mem_mib=262_144
        )
        for index in range(gpus):
            gpu_add(node=node, index=index, model="L40S")
        tokens[node.name] = node_token_issue(node=node)
    return {"tokens": tokens}


def check(pool_id: int) -> dict[str, Any]:
    from django.db import connection, transaction

    from apps.inventory.models import Node
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Task
    from tests.apps.scheduling.invariants import violations

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        found = violations(pool_id)
        on_lost = list(
            Assignment.objects.filter(
                released_at__isnull=True,
                node__state=Node.State.LOST,
                task__state__in=[Task.State.ASSIGNED, Task.State.RUNNING],
            ).values_list("task_id", flat=True)
        )
        tasks = {
            str(pk): {"state": state, "attempts": attempts}
            for pk, state, attempts in Task.objects.filter(pool_id=pool_id).values_list(
                "pk", "state", "attempts"
            )
        }
        nodes = dict(Node.objects.filter(pool_id=pool_id).values_list("name", "state"))
    return {"violations": found, "live_on_lost_nodes": on_lost, "tasks": tasks, "nodes": nodes}


def main(argv: list[str]) -> int:
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    django.setup()
    if argv[0] == "seed":
        print(json.dumps(seed()))
    elif argv[0] == "seed-fleet":
        print(json.dumps(seed_fleet(int(argv[1]), int(argv[2]))))
    elif argv[0] == "check":
        print(json.dumps(check(int(argv[1]))))
    else:
        print(f"unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
