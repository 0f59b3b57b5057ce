"""Fixtures for the agent side of the plane: node credentials, assignments made directly (as a cycle
would commit them), and wire messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest


def assign(task: Any, node: Any, units: Iterable[Any]) -> Any:
    """Bind a pending task to units of `node` the way a scheduling cycle commits it."""
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Task
    from apps.workloads.services import task_transition

    units = list(units)
    task_transition(task=task, to_state=Task.State.ADMITTED, actor="scheduler", reason="admitted (test)")
    task_transition(task=task, to_state=Task.State.ASSIGNED, actor="scheduler", reason="placed (test)")
    # The live assignment listing the units is what makes the task their holder.
    assignment = Assignment.objects.create(task=task, node=node, unit_ids=[u.pk for u in units])
    task.refresh_from_db()
    return assignment


@pytest.fixture(autouse=True)
def _no_heartbeat_liveness_left() -> Iterable[None]:
    """Heartbeats recorded in Redis (apps.fleet.liveness) by one test are not another test's: the test
    database's keys go before and after each test."""
    from apps.fleet import liveness

    liveness._redis.reset()
    liveness.clear()
    yield
    liveness.clear()


@pytest.fixture
def fleet(world: Any) -> Any:
    """`world` plus agent credentials: node A (gpu-001, H100 MIG + whole) and node B (l4-001)."""
    from apps.fleet.nodes import node_token_issue
    from apps.inventory.models import Node

    node_b = Node.objects.get(name="l4-001")
    world.token_a = node_token_issue(node=world.node)
    world.token_b = node_token_issue(node=node_b)
    world.node_b = node_b
    world.mig_unit = world.node.gpus.get(index=0).units.get()
    world.whole_unit = world.node.gpus.get(index=1).units.get()
    return world


@pytest.fixture
def agent_client() -> Any:
    """`agent_client(token)` → an API client speaking as a node agent (or with no token at all)."""
    from rest_framework.test import APIClient

    def make(token: str | None) -> APIClient:
        client = APIClient()
        if token is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return client

    return make
