"""The impossible request, end to end: a task larger than every node of its pool is refused at
submission with the reason and what would fit; one left pending anyway (its pool's large node went away
after it was accepted) holds no quota, gets no estimated start, and does not turn the pool's idle GPUs
into "fragments" (it read 29-31% fragmented before, for a pool that was all idle)."""

from __future__ import annotations

import pytest

from apps.inventory.models import Node
from apps.scheduling.models import Cycle
from apps.workloads.models import Task
from apps.workloads.services import CannotRunHere
from tests.apps.factories import held_milli
from tests.apps.scheduling.conftest import Fleet, run


def test_a_request_larger_than_every_node_is_refused_and_stores_nothing(fleet: Fleet) -> None:
    for _ in range(2):
        fleet.node(gpus=8)
    fleet.tenant("a", guaranteed=12_000)
    with pytest.raises(CannotRunHere) as refused:
        fleet.submit("a", gpu_count=9)
    (sentence,) = refused.value.message_dict["gpu_count"]
    assert "it asks 9 GPUs (the largest node has 8); a gang of 3 tasks with 3 GPUs each would fit" in sentence
    assert not Task.objects.exists()
    assert held_milli(fleet.tenants["a"].quotas.get()) == 0


def test_one_left_pending_holds_nothing_has_no_estimate_and_fragments_nothing(fleet: Fleet) -> None:
    fleet.node(gpus=8)
    big_node = fleet.node(gpus=16)
    fleet.tenant("a", guaranteed=16_000)
    waiting = fleet.submit("a", gpu_count=9)  # accepted: the 16-GPU node could take it
    Node.objects.filter(pk=big_node.pk).delete()  # …until that node left the pool

    report = run(fleet)
    assert report.placed == 0
    waiting.refresh_from_db()
    assert waiting.state == "pending" and waiting.predicted_start_at is None
    assert "estimated start unknown: no schedulable node could hold 9 GPUs" in waiting.why_pending
    assert held_milli(fleet.tenants["a"].quotas.get()) == 0
    stats = Cycle.objects.get(pk=report.cycle_id).stats
    assert stats["fragmentation_after"]["amount_pct"] == 0  # the idle 8-GPU node is not a fragment
