"""The FGD measure on hand-computed examples (reference/fragmentation.md §1)."""

from __future__ import annotations

import pytest

from tests.whalegen.placement.builders import mix, node, task
from whalegen.placement.fragmentation import (
    cluster_fragmentation,
    node_fragmentation,
    shape_mix_from_tasks,
    takeable_mix,
)
from whalegen.placement.types import Shape

SHARE_500 = Shape(cpu_milli=4000, num_gpu=1, gpu_milli=500)
WHOLE_16_CORES = Shape(cpu_milli=16000, num_gpu=1, gpu_milli=1000)
CPU_ONLY = Shape(cpu_milli=2000, num_gpu=0, gpu_milli=0)
MIX = mix((SHARE_500, 0.5), (WHOLE_16_CORES, 0.25), (CPU_ONLY, 0.25))


def test_node_fragmentation_matches_the_hand_computed_sum() -> None:
    # Free GPU 1000 + 600 + 200 = 1800 milli, 8 free cores.
    # CPU-only shape: all 1800 idle is fragment      → 0.25 × 1800 = 450
    # 500-milli share fits (8 ≥ 4 cores, a device ≥ 500): only the 200 device → 0.5 × 200 = 100
    # whole GPU needs 16 cores > 8: all idle           → 0.25 × 1800 = 450
    n = node("a", gpus=3, cpu=32, cpu_free=8, free=[1000, 600, 200])
    assert node_fragmentation(n, MIX) == pytest.approx(1000.0)


def test_a_whole_gpu_shape_counts_every_partly_used_device_as_fragment() -> None:
    whole_only = mix((Shape(cpu_milli=1000, num_gpu=1, gpu_milli=1000), 1.0))
    n = node("a", gpus=3, free=[1000, 999, 300])
    assert node_fragmentation(n, whole_only) == pytest.approx(1299.0)


def test_a_shape_the_node_cannot_host_sees_all_idle_gpu_as_fragment() -> None:
    eight_gpus = mix((Shape(cpu_milli=1000, num_gpu=8, gpu_milli=1000), 1.0))
    assert node_fragmentation(node("small", gpus=2), eight_gpus) == pytest.approx(2000.0)


def test_a_type_constraint_that_excludes_the_model_makes_all_idle_gpu_fragment() -> None:
    v100_only = mix(
        (Shape(cpu_milli=1000, num_gpu=1, gpu_milli=500, allowed_models=frozenset({"V100M32"})), 1.0)
    )
    assert node_fragmentation(node("t4", model="T4", free=[1000, 300]), v100_only) == pytest.approx(1300.0)
    assert node_fragmentation(node("v100", model="V100M32", free=[1000, 300]), v100_only) == pytest.approx(
        300.0
    )


def test_a_full_node_has_no_fragment() -> None:
    assert node_fragmentation(node("full", free=[0, 0]), MIX) == 0.0


def test_cluster_amount_and_ratio() -> None:
    # Node a: F = 1000 (above). Node b: idle 2000, 32 free cores: CPU-only 0.25 × 2000 = 500, the share
    # and the whole GPU fit with no small device → F = 500. Total 1500 over 5 GPUs, 3800 idle.
    a = node("a", gpus=3, cpu=32, cpu_free=8, free=[1000, 600, 200])
    b = node("b", gpus=2, cpu=32)
    result = cluster_fragmentation([a, b], MIX)
    assert result.frag_milli == pytest.approx(1500.0)
    assert result.amount_pct == pytest.approx(100 * 1500 / 5000)
    assert result.ratio_pct == pytest.approx(100 * 1500 / 3800)


def test_an_empty_cluster_is_already_fragmented_by_the_cpu_only_share() -> None:
    result = cluster_fragmentation([node("a"), node("b")], MIX)
    assert result.amount_pct == pytest.approx(25.0)


def test_the_shape_mix_keeps_the_most_popular_shapes_up_to_95_percent_and_renormalises() -> None:
    tasks = (
        [task(f"s{i}", cpu=4, gpus=1, milli=500) for i in range(60)]
        + [task(f"w{i}", cpu=8, gpus=1) for i in range(36)]
        + [task(f"c{i}", cpu=2) for i in range(3)]
        + [task("rare", cpu=96, gpus=8)]
    )
    result = shape_mix_from_tasks(tasks)
    # 60 + 36 = 96 % ≥ 95 %: the CPU-only and 8-GPU shapes are dropped.
    assert [(s.num_gpu, s.gpu_milli) for s in result.shapes] == [(1, 500), (1, 1000)]
    assert result.weights == pytest.approx((60 / 96, 36 / 96))


def test_the_shape_mix_of_no_tasks_is_empty() -> None:
    assert shape_mix_from_tasks([]).shapes == ()


def test_shapes_no_node_could_take_leave_the_mix_and_fragment_nothing() -> None:
    # Two idle 8-GPU nodes. A waiting 9-GPU task's shape is one no node takes: counted, it would call
    # every idle GPU a fragment it cannot use (the pool read 29-31% fragmented); left out, the pool is 0%.
    nodes = [node(f"n{i}", gpus=8, cpu=96) for i in range(2)]
    nine = Shape(cpu_milli=8000, num_gpu=9, gpu_milli=1000)
    one = Shape(cpu_milli=8000, num_gpu=1, gpu_milli=1000)
    both = mix((nine, 0.5), (one, 0.5))
    assert cluster_fragmentation(nodes, both).amount_pct > 0
    kept = takeable_mix(both, nodes)
    assert kept.shapes == (one,) and kept.weights == (1.0,)
    assert cluster_fragmentation(nodes, kept).amount_pct == 0
    assert takeable_mix(mix((one, 1.0)), nodes) == mix((one, 1.0))  # nothing to drop: the same mix
    assert takeable_mix(mix((nine, 1.0)), nodes).shapes == ()


def test_a_node_takes_a_shape_by_its_size_and_the_allowed_models() -> None:
    t4 = node("t4", model="T4", gpus=4, cpu=16, mem_gib=64)
    assert t4.takes(4, 16_000, 64 * 1024, frozenset())
    assert not t4.takes(5, 1000, 1024, frozenset())  # more GPUs than it has
    assert not t4.takes(1, 17_000, 1024, frozenset())  # more cores
    assert not t4.takes(1, 1000, 65 * 1024, frozenset())  # more host memory
    assert not t4.takes(1, 1000, 1024, frozenset({"H100-80GB"}))  # not of an allowed model
    assert t4.takes(0, 1000, 1024, frozenset({"H100-80GB"}))  # a CPU-only task needs no GPU model
