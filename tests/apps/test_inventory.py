"""Carving GPUs into compute units follows the catalogue and the MIG geometry tables."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.inventory.models import ComputeUnit, Gpu
from apps.inventory.services import gpu_add
from tests.apps.factories import NodeFactory


@pytest.fixture
def node(db: None):
    return NodeFactory()


def test_a_mig_layout_becomes_one_unit_per_instance_with_its_share_of_the_gpu(node) -> None:
    gpu = gpu_add(
        node=node, index=0, model="h100", partition_mode="mig", mig_layout=[("3g.40gb", 4), ("2g.20gb", 0)]
    )
    assert gpu.model == "H100-80GB" and gpu.mig_capable
    units = sorted(gpu.units.values_list("mig_profile", "mig_start", "gpu_milli"))
    assert units == [("2g.20gb", 0, 285), ("3g.40gb", 4, 428)]  # 2/7 and 3/7 of the SMs


@pytest.mark.parametrize(
    ("model", "mode", "layout", "field", "words"),
    [
        ("L4", "mig", [("1g.10gb", 0)], "partition_mode", "L4 does not support MIG"),
        ("H100-80GB", "mig", [("3g.40gb", 0), ("2g.20gb", 2)], "mig_layout", "cannot start at slice 2"),
        ("H100-80GB", "mig", [("3g.40gb", 1)], "mig_layout", "cannot start at slice 1"),
        ("H100-80GB", "mig", [("5g.50gb", 0)], "mig_layout", "no MIG profile '5g.50gb'"),
        ("B300", "whole", [], "model", "unknown GPU model 'B300'"),
    ],
    ids=[
        "MIG on an L4",
        "overlapping instances",
        "a start the profile forbids",
        "unknown profile",
        "unknown model",
    ],
)
def test_impossible_gpus_are_refused_and_leave_nothing_behind(
    node, model, mode, layout, field, words
) -> None:
    with pytest.raises(ValidationError) as caught:
        gpu_add(node=node, index=0, model=model, partition_mode=mode, mig_layout=layout)
    assert words in " ".join(caught.value.message_dict[field])
    assert not Gpu.objects.exists() and not ComputeUnit.objects.exists()


def test_mps_shares_split_compute_memory_and_thread_percentage(node) -> None:
    gpu = gpu_add(node=node, index=0, model="L4", partition_mode=Gpu.PartitionMode.MPS, mps_shares=4)
    assert gpu.units.count() == 4
    assert set(gpu.units.values_list("kind", "gpu_milli", "mps_thread_pct")) == {("mps", 250, 25)}
