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


def test_a_cluster_update_changes_region_and_cordon_and_ignores_other_keys(db: None) -> None:
    from apps.inventory.services import cluster_update
    from tests.apps.factories import ClusterFactory

    cluster = ClusterFactory(name="fra", region="eu-west")
    cluster_update(cluster=cluster, values={"region": "eu-central", "cordoned": True, "name": "other"})
    cluster.refresh_from_db()
    assert (cluster.name, cluster.region, cluster.cordoned) == ("fra", "eu-central", True)


def test_a_cluster_with_nodes_refuses_deletion_and_says_how_many(node) -> None:
    from apps.inventory.services import cluster_delete_refusal
    from tests.apps.factories import ClusterFactory

    NodeFactory(cluster=node.cluster)
    assert cluster_delete_refusal(node.cluster) == (
        f"cluster {node.cluster.name!r} still has 2 nodes; remove them first"
    )
    assert cluster_delete_refusal(ClusterFactory()) == ""


def test_a_pool_update_validates_its_runtime(db: None) -> None:
    from apps.inventory.services import pool_update
    from tests.apps.factories import PoolFactory

    pool = PoolFactory()
    pool_update(pool=pool, values={"description": "train", "name": "renamed"})
    pool.refresh_from_db()
    assert (pool.description, pool.name != "renamed") == ("train", True)
    with pytest.raises(ValidationError):
        pool_update(pool=pool, values={"runtime": "vm"})


def test_changing_a_nodes_labels_raises_its_version_for_the_cycles_compare_and_set(node) -> None:
    from apps.inventory.services import node_settings_update

    before = node.version
    node_settings_update(node=node, values={"labels": {"rack": "a1"}, "state": "cordoned"})
    node.refresh_from_db()
    assert (node.labels, node.state, node.version) == ({"rack": "a1"}, "ready", before + 1)
