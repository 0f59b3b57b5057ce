"""Django-side helper of the production-stack test, run as a subprocess against the stack's own database
(`python -m tests.ops.plane_scripts seed` with DATABASE_URL set): builds the world and prints it as JSON.

Two nodes: `ops-example` has the GPUs of the example simulated host (agents/sim/example-host.yaml: two
H100 80GB and an L40S), so its agent runs with no `--sim-spec`; `ops-l40s` has two L40S and an agent
given a spec of its own.
"""

from __future__ import annotations

import json
from typing import Any

NODES = {"ops-example": ("H100-80GB", "H100-80GB", "L40S"), "ops-l40s": ("L40S", "L40S")}


def seed() -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from apps.fleet.nodes import node_token_issue
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.tenants.models import Membership
    from apps.tenants.services import membership_set, tenant_create, token_create
    from apps.workloads.services import queue_create, quota_set

    tenant = tenant_create(slug="ops", name="Ops")
    user = get_user_model().objects.create_user(username="ops-runner", password=None)
    membership_set(user=user, tenant=tenant, role=Membership.Role.MEMBER)
    cluster = cluster_create(name="ops-1", region="lab")
    pool = pool_create(name="ops", runtime="process")
    nodes = {}
    for name, models in NODES.items():
        node, _ = node_register(cluster=cluster, pool=pool, name=name, cpu_milli=64_000, mem_mib=262_144)
        for index, model in enumerate(models):
            gpu_add(node=node, index=index, model=model)
        nodes[name] = {"token": node_token_issue(node=node)}
    quota_set(tenant=tenant, pool=pool, guaranteed_milli=5000, borrow_limit_milli=5000)
    queue_create(tenant=tenant, pool=pool, name="work")
    return {"token": token_create(user=user, tenant=tenant, name="ops")[1], "nodes": nodes}


if __name__ == "__main__":
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")

    django.setup()
    print(json.dumps(seed()))
