from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from whalegen.goodput.fleet import FleetError, GpuGroup, GpuMode, fleet_nodes, load_fleet, parse_fleet
from whalegen.placement.types import PartitionMode

FLEETS = Path(__file__).resolve().parents[3] / "docs" / "fleets"


def _pool(**overrides: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "name": "p",
        "gpu_model": "A100-80GB",
        "nodes": 2,
        "gpus_per_node": 8,
        "cpu_cores": 128,
        "mem_gib": 1024,
    }
    pool.update(overrides)
    return pool


def test_the_default_fleet_loads_with_the_five_models_the_issue_names() -> None:
    fleet = load_fleet(FLEETS / "default.yaml")
    assert fleet.name == "default-mixed"
    assert fleet.gpus_by_model() == {
        "H200-141GB": 16,
        "H100-80GB": 32,
        "A100-80GB": 32,
        "L4": 32,
        "V100M16": 32,
    }
    h200 = fleet.pools[0]
    assert (h200.cpu_milli, h200.mem_mib) == (112_000, 2048 * 1024)
    assert h200.gpus == (
        GpuGroup(GpuMode.MIG, 2, ("3g.71gb", "2g.35gb", "2g.35gb")),
        GpuGroup(GpuMode.WHOLE, 6),
    )


def test_the_holdout_fleet_differs_from_the_default() -> None:
    default = load_fleet(FLEETS / "default.yaml")
    holdout = load_fleet(FLEETS / "holdout.yaml")
    assert holdout.total_gpus == 108
    assert set(holdout.gpus_by_model()) != set(default.gpus_by_model())
    assert "P100" in holdout.gpus_by_model()


def test_the_older_mig_fleet_is_older_cards_with_most_a100s_carved() -> None:
    fleet = load_fleet(FLEETS / "older-mig.yaml")
    assert fleet.total_gpus == 144
    assert fleet.gpus_by_model() == {"A100-40GB": 64, "V100M32": 32, "P100": 16, "T4": 16, "K80": 16}
    mig = [gpu for node in fleet_nodes(fleet) for gpu in node.gpus if gpu.mode is PartitionMode.MIG]
    assert len(mig) == 48  # every GPU of the six a100-40-mig nodes
    assert not {"H100-80GB", "H200-141GB", "L4"} & set(fleet.gpus_by_model())


def test_gpus_not_listed_are_whole_and_shares_default_to_two() -> None:
    fleet = parse_fleet({"pools": [_pool(gpus=[{"mode": "mps", "count": 3}])]})
    assert fleet.pools[0].gpus == (GpuGroup(GpuMode.MPS, 3, max_shares=2), GpuGroup(GpuMode.WHOLE, 5))
    assert fleet.total_gpus == 16


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"pools": []}, "f.yaml: pools: required, a non-empty list"),
        ({"pools": [_pool(), _pool()]}, "f.yaml: pools[1].name: duplicate pool name 'p'"),
        ({"pools": [_pool(gpus_per_nod=8)]}, "f.yaml: pools[0].gpus_per_nod: unknown field"),
        ({"pools": [_pool(gpu_model="B300")]}, "f.yaml: pools[0].gpu_model: unknown GPU model 'B300'"),
        ({"pools": [_pool(gpu_model="G2")]}, "f.yaml: pools[0].gpu_model: G2 has no published figures"),
        ({"pools": [_pool(nodes=0)]}, "f.yaml: pools[0].nodes: must be a positive integer, got 0"),
        ({"pools": [_pool(cpu_cores=None)]}, "f.yaml: pools[0].cpu_cores: required"),
        (
            {"pools": [_pool(gpus=[{"mode": "mps", "count": 9}])]},
            "f.yaml: pools[0].gpus: the groups count 9 GPUs, more than gpus_per_node 8",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "nvlink", "count": 1}])]},
            "f.yaml: pools[0].gpus[0].mode: must be one of",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "time-slice", "count": 1, "max_shares": 49}])]},
            "f.yaml: pools[0].gpus[0].max_shares: must be 2 … 48, got 49",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "whole", "count": 1, "max_shares": 2}])]},
            "f.yaml: pools[0].gpus[0].max_shares: a whole GPU runs one task",
        ),
        (
            {"pools": [_pool(gpu_model="L4", gpus=[{"mode": "mig", "count": 1, "layout": ["1g.10gb"]}])]},
            "f.yaml: pools[0].gpus[0].layout: L4 has no MIG",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "mig", "count": 1, "layout": ["5g.50gb"]}])]},
            "f.yaml: pools[0].gpus[0].layout: A100-80GB has no MIG profile '5g.50gb'",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "mig", "count": 1, "layout": ["4g.40gb", "4g.40gb"]}])]},
            "f.yaml: pools[0].gpus[0].layout: 4g.40gb, 4g.40gb do not fit one A100-80GB together",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "mig", "count": 1}])]},
            "f.yaml: pools[0].gpus[0].layout: must be a non-empty list of MIG profile names",
        ),
        (
            {"pools": [_pool(gpus=[{"mode": "mps", "count": 1, "layout": ["3g.40gb"]}])]},
            "f.yaml: pools[0].gpus[0].layout: only mode mig takes a layout",
        ),
    ],
    ids=[
        "an empty pool list",
        "a duplicate pool name",
        "a misspelt field",
        "an unknown model",
        "an opaque trace model",
        "zero nodes",
        "a missing field",
        "more GPUs in groups than the node has",
        "an unknown mode",
        "too many shares",
        "shares on a whole GPU",
        "a layout on a model without MIG",
        "an unknown MIG profile",
        "a layout that does not fit the slice geometry",
        "a MIG group without a layout",
        "a layout on an MPS group",
    ],
)
def test_invalid_fleets_fail_with_one_line_naming_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(FleetError) as caught:
        parse_fleet(document, "f.yaml")
    text = str(caught.value)
    assert text.startswith(message)
    assert "\n" not in text


def test_a_missing_or_malformed_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="fleet file not found"):
        load_fleet(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(FleetError) as caught:
        load_fleet(bad)
    assert "not valid YAML" in str(caught.value) and "\n" not in str(caught.value)


def test_a_fleet_round_trips_through_yaml(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "pools": [_pool()]}))
    fleet = load_fleet(path)
    assert fleet.name == "one"
    assert fleet.pools[0].gpus == (GpuGroup(GpuMode.WHOLE, 8),)


def test_the_default_fleet_becomes_idle_placement_nodes_in_their_modes() -> None:
    fleet = load_fleet(FLEETS / "default.yaml")
    nodes = fleet_nodes(fleet)
    assert len(nodes) == sum(pool.nodes for pool in fleet.pools) == 18
    assert sum(len(node.gpus) for node in nodes) == fleet.total_gpus
    h200 = nodes[0]
    assert h200.name == "h200-train-0"
    assert (h200.cpu_free_milli, h200.mem_free_mib) == (112_000, 2048 * 1024)
    assert [g.mode for g in h200.gpus] == [PartitionMode.MIG] * 2 + [PartitionMode.WHOLE] * 6
    assert all(g.free_milli == 1000 and g.free_mem_mib == g.total_mem_mib == 143_771 for g in h200.gpus)
    l4 = next(n for n in nodes if n.name == "l4-infer-3")
    assert [g.mode for g in l4.gpus].count(PartitionMode.SHARED) == 4
