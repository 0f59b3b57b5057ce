"""Each policy's choice on small clusters, worked out by hand from reference/fragmentation.md §2–§3."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.whalegen.placement.builders import mix, node, snapshot, task
from whalegen.placement.engine import EngineConfig, solve_cycle
from whalegen.placement.registry import POLICY_NAMES, make_policy
from whalegen.placement.types import NodeState, RunningTask, Shape, ShapeMix, TaskRequest, UnitKind

SHARE_600 = mix((Shape(cpu_milli=1000, num_gpu=1, gpu_milli=600), 1.0))
WHOLE_4_CORES = mix((Shape(cpu_milli=4000, num_gpu=1, gpu_milli=1000), 1.0))


@dataclass(frozen=True)
class Case:
    policy: str
    nodes: tuple[NodeState, ...]
    task: TaskRequest
    want_node: str
    want_gpus: tuple[int, ...]
    running: tuple[RunningTask, ...] = ()
    shape_mix: ShapeMix | None = field(default=None)


CASES = {
    # leftover a = .5·30/128 + .5·1600/8000 → score 78; b = .5·30/128 + .5·1100/8000 → 81; best-fit device.
    "bestfit picks the node with the least CPU and GPU left and the tightest device": Case(
        "bestfit",
        (node("a"), node("b", free=[1000, 500])),
        task("t", cpu=2, gpus=1, milli=400),
        "b",
        (1,),
    ),
    # dot a = .5·(4/128) + .25·(1/8) → 97; dot b = (8/128)(4/128) + .25·(1/8) → 98.
    "dotprod picks the node whose free resources align least with the task": Case(
        "dotprod",
        (node("a", cpu=64), node("b", cpu=8)),
        task("t", cpu=4, gpus=1),
        "b",
        (0,),
    ),
    # a hosts only shares: 75 + 25·6500/8000 → 95; c idle: 25 + 18.75 → 43; b hosts only whole GPUs: 21.
    "clustering joins the node that hosts only the task's class": Case(
        "clustering",
        (node("b", free=[0, 1000]), node("c"), node("a", free=[500, 1000])),
        task("t", gpus=1, milli=300),
        "a",
        (0,),
        running=(
            RunningTask("whole", "b", (0,), 1000, 1000, 1024),
            RunningTask("share", "a", (0,), 500, 1000, 1024),
        ),
    ),
    # b fits on a partly used device: max(50, 100 − 60/10) = 94; idle a: 33 − 2 = 31.
    "packing fills a partly used device first": Case(
        "packing",
        (node("a"), node("b", free=[600, 1000])),
        task("t", gpus=1, milli=500),
        "b",
        (0,),
    ),
    # b is partly used but the task needs a fully free device: max(33, 50 − 1) = 49 > idle a's 31.
    "packing prefers a partly used node for a whole GPU": Case(
        "packing",
        (node("a"), node("b", free=[600, 1000])),
        task("t", gpus=1),
        "b",
        (1,),
    ),
    # Mix: 600-milli shares. a: the 500 left on a device is a fragment, Δ = +500 → 37.
    # b: filling the 500 device removes a fragment, Δ = −500 → 62.
    "fgd picks the move that consumes an existing fragment": Case(
        "fgd",
        (node("a"), node("b", free=[1000, 500])),
        task("t", gpus=1, milli=500),
        "b",
        (1,),
        shape_mix=SHARE_600,
    ),
    "random can only pick the one feasible node": Case(
        "random",
        (node("a", cpu_free=0.5), node("b", free=[1000, 100])),
        task("t", cpu=1, gpus=1, milli=300),
        "b",
        (0,),
    ),
    # Least allocated after placement: a (20 of 32 cores free) vs b (30 of 32).
    "k8s-default spreads to the least allocated node": Case(
        "k8s-default",
        (node("a", cpu_free=20), node("b", cpu_free=30)),
        task("t", cpu=1, gpus=1, milli=300),
        "b",
        (0,),
    ),
    # Same Δ for FGD (both nodes still host the 4-core shape afterwards): the first node wins.
    "fgd ignores CPU that strands GPUs": Case(
        "fgd",
        (node("g2", model="G2", gpus=8, cpu=36), node("t4", cpu=104)),
        task("t", cpu=24, gpus=1),
        "g2",
        (0,),
        shape_mix=WHOLE_4_CORES,
    ),
    # whalegen: at the mix's 4 cores per GPU, g2 keeps 12 cores for 7 idle GPUs: 4 GPUs stranded (Δ +4000).
    # t4 has CPU to spare: Δ 0.
    "whalegen sends a CPU-heavy task to the CPU-rich node": Case(
        "whalegen",
        (node("g2", model="G2", gpus=8, cpu=36), node("t4", cpu=104)),
        task("t", cpu=24, gpus=1),
        "t4",
        (0,),
        shape_mix=WHOLE_4_CORES,
    ),
    # Gaps: one 700. Into it: Σ N² falls by 1; a fresh GPU leaves a 300 gap: rises by 1.
    "whalegen puts a share into the gap it fills exactly": Case(
        "whalegen",
        (node("a"), node("b", free=[1000, 700])),
        task("t", gpus=1, milli=700),
        "b",
        (1,),
        shape_mix=mix(
            (Shape(cpu_milli=1000, num_gpu=1, gpu_milli=700), 0.5),
            (Shape(cpu_milli=1000, num_gpu=1, gpu_milli=300), 0.5),
        ),
    ),
    # Half the expected work may only run on T4: any work on a T4 displaces it, so it goes to the G2.
    "whalegen keeps scarce models for the work that can only run there": Case(
        "whalegen",
        (node("t4"), node("g2", model="G2", gpus=2)),
        task("t", gpus=1),
        "g2",
        (0,),
        shape_mix=mix(
            (Shape(cpu_milli=1000, num_gpu=1, gpu_milli=1000, allowed_models=frozenset({"T4"})), 0.5),
            (Shape(cpu_milli=1000, num_gpu=1, gpu_milli=1000), 0.5),
        ),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_policy_choice(case: Case) -> None:
    snap = snapshot(case.nodes, [case.task], running=case.running, shape_mix=case.shape_mix)
    result = solve_cycle(snap, EngineConfig(policy=case.policy), now=0.0)
    assert result.unplaced == ()
    (placement,) = result.placements
    assert (placement.node, placement.gpu_indexes) == (case.want_node, case.want_gpus)


def test_k8s_default_gives_a_shared_request_a_whole_gpu() -> None:
    snap = snapshot([node("a"), node("b")], [task("t", gpus=1, milli=300), task("u", gpus=1, milli=300)])
    result = solve_cycle(snap, EngineConfig(policy="k8s-default"), now=0.0)
    assert [p.unit.kind for p in result.placements] == [UnitKind.WHOLE, UnitKind.WHOLE]
    assert len({(p.node, p.gpu_indexes) for p in result.placements}) == 2


def test_every_listed_policy_is_available_and_unknown_names_are_refused() -> None:
    for name in POLICY_NAMES:
        assert make_policy(name).name == name
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("tetris")
    with pytest.raises(ValueError):
        make_policy("whalegen:strand=maybe")
    assert make_policy("whalegen:strand=0:sumsq=0").name == "whalegen"
