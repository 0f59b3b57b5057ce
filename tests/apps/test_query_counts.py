"""Pinned query counts for list endpoints: a list costs the same number of queries for 2 rows as for 20
(no N+1). The count is auth/access (2) + page count (1) + page (1), plus prefetches where noted."""

from __future__ import annotations

import pytest

from apps.inventory.services import gpu_add
from tests.apps.factories import NodeFactory, OverrideFactory, TaskFactory


def _more_rows(world) -> None:
    for _ in range(20):
        TaskFactory(queue=world.queue_a)
        OverrideFactory(task=world.task_a, requested_by=world.alice)
    for index in range(2, 10):
        gpu_add(node=world.node, index=index, model="H100-80GB")
    for _ in range(5):
        NodeFactory(cluster=world.node.cluster, pool=world.h100)


@pytest.mark.parametrize(
    ("path", "queries"),
    [
        ("/api/v1/tasks/", 4),
        ("/api/v1/queues/", 4),
        ("/api/v1/quotas/", 4),
        ("/api/v1/overrides/", 4),
        ("/api/v1/pools/", 4),
        ("/api/v1/clusters/", 4),
        ("/api/v1/nodes/", 4),
        ("/api/v1/gpus/", 5),  # + the compute units of the page, in one prefetch
        ("/api/v1/tenants/", 4),
    ],
)
def test_list_endpoints_cost_a_fixed_number_of_queries(
    world, api, django_assert_num_queries, path, queries
) -> None:
    client = api(world.alice)
    OverrideFactory(task=world.task_a, requested_by=world.alice)  # an empty page skips its query
    with django_assert_num_queries(queries):
        small = client.get(path)
    _more_rows(world)
    with django_assert_num_queries(queries):
        large = client.get(path)
    assert small.status_code == large.status_code == 200
    assert large.json()["count"] >= small.json()["count"]
