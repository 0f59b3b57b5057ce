"""The operator's node changes `whalegen apply` makes: a node moves pool or goes only while it runs nothing,
and its cordon goes through the fleet's cordon and uncordon."""

from __future__ import annotations

import pytest

from apps.common.errors import Conflict
from apps.fleet.nodes import node_delete_refusal, node_update
from apps.inventory.models import Node
from apps.inventory.selectors import node_cordoned
from apps.scheduling.models import Assignment
from tests.apps.factories import NodeFactory, PoolFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_a_node_running_a_task_neither_moves_pool_nor_goes_until_the_task_is_released() -> None:
    node = NodeFactory()
    assignment = Assignment.objects.create(task=TaskFactory(), node=node, unit_ids=[])
    other = PoolFactory()
    with pytest.raises(Conflict, match=r"runs 1 task in pool .*drain it before moving it"):
        node_update(node=node, values={"pool": other}, actor="user:root")
    assert node_delete_refusal(node) == f"node {node.name} runs 1 task; drain it first"
    Assignment.objects.filter(pk=assignment.pk).update(released_at=assignment.created_at)
    assert node_delete_refusal(node) == (
        f"node {node.name} has task history (assignments keep it); cordon it instead"
    )
    assert node_update(node=node, values={"pool": other}, actor="user:root").pool_id == other.pk
    assert node_delete_refusal(NodeFactory()) == ""


def test_cordoning_and_uncordoning_a_node_moves_its_state_and_a_lost_node_keeps_its_cordon() -> None:
    node = NodeFactory()
    assert node_update(node=node, values={"cordoned": True}, actor="user:root").state == Node.State.CORDONED
    assert node_cordoned(node)
    assert node_update(node=node, values={"cordoned": False}, actor="user:root").state == Node.State.READY
    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST, state_before_lost=Node.State.READY)
    node.refresh_from_db()
    with pytest.raises(Conflict, match="is lost; its cordon can change once its agent heartbeats"):
        node_update(node=node, values={"cordoned": True}, actor="user:root")
    assert not node_cordoned(node)
