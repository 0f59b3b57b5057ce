"""Which free units carry a placement (`whalegen.scheduling.units`): hand-built GPUs, one rule each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.whalegen.placement.builders import task
from whalegen.placement.state import Request
from whalegen.placement.types import ComputeUnit, Isolation, Placement, TaskRequest, UnitKind
from whalegen.scheduling.types import FreeUnit
from whalegen.scheduling.units import Mapped, Need, map_placement


def shares(first_id: int, count: int, milli: int = 100, mem_mib: int = 1000) -> tuple[FreeUnit, ...]:
    return tuple(FreeUnit(first_id + i, "mps", milli, mem_mib) for i in range(count))


def share_placement(task_id: str, milli: int, *gpus: int) -> Placement:
    return Placement(task_id, "n1", gpus, ComputeUnit(UnitKind.SHARE, milli))


@pytest.mark.parametrize(
    ("milli", "gpu_mem_mib", "taken", "want_ids"),
    [
        pytest.param(
            500, 0, set(), (1, 2, 3, 4, 5), id="shares in the snapshot's order until the milli is covered"
        ),
        pytest.param(500, 0, {1, 3}, (2, 4, 5, 6, 7), id="units already bound this step are skipped"),
        pytest.param(200, 3000, set(), (1, 2, 3), id="the memory bound can take more units than the milli"),
        pytest.param(1000, 0, set(), tuple(range(1, 11)), id="a whole GPU's worth takes every share"),
    ],
)
def test_shares_add_up_in_order_and_say_what_they_hold(
    milli: int, gpu_mem_mib: int, taken: set[int], want_ids: tuple[int, ...]
) -> None:
    free = {("n1", 0): shares(1, 10)}
    req = Request.of(task("t", gpus=1, milli=milli, gpu_mem_mib=gpu_mem_mib))
    before = set(taken)
    got = map_placement(share_placement("t", milli, 0), req, free, taken)
    assert got == Mapped(want_ids, 100 * len(want_ids))
    assert taken == before | set(want_ids)


def test_a_gpu_that_cannot_carry_its_part_is_named_and_nothing_stays_taken() -> None:
    # GPU 0 carries its 1,000 milli; GPU 1 has 800 free: the placement fails on GPU 1 and GPU 0's units
    # are given back.
    free = {("n1", 0): shares(1, 10), ("n1", 1): shares(11, 8)}
    req = Request.of(task("t", gpus=2))
    taken: set[int] = set()
    got = map_placement(share_placement("t", 1000, 0, 1), req, free, taken)
    assert got == ("n1", 1)
    assert taken == set()


@pytest.mark.parametrize(
    ("taken", "want"),
    [
        pytest.param({1, 2}, ("n1", 0), id="every unit bound already: the GPU fails"),
        pytest.param(set(), Mapped((), 0), id="nothing asked of a GPU with free units: no unit"),
    ],
)
def test_edges_of_the_share_walk(taken: set[int], want: Mapped | tuple[str, int]) -> None:
    free = {("n1", 0): shares(1, 2)}
    req = Request.of(task("t", gpus=1, milli=0))
    assert map_placement(share_placement("t", 0, 0), req, free, taken) == want


def test_mig_takes_the_engines_own_instance_when_free_else_the_smallest_that_fits() -> None:
    free = {
        ("n1", 0): (
            FreeUnit(1, "mig", 428, 40_000, "3g.40gb", 0),
            FreeUnit(2, "mig", 142, 10_000, "1g.10gb", 4),
            FreeUnit(3, "mig", 142, 10_000, "1g.10gb", 5),
        )
    }
    req = Request.of(task("t", gpus=1, milli=142, gpu_mem_mib=9_000))
    own = Placement("t", "n1", (0,), ComputeUnit(UnitKind.MIG, 142, "1g.10gb", 5))
    assert map_placement(own, req, free, set()) == Mapped((3,), 142)
    elsewhere = Placement("t", "n1", (0,), ComputeUnit(UnitKind.MIG, 142, "1g.10gb", 6))
    assert map_placement(elsewhere, req, free, set()) == Mapped((2,), 142)
    assert map_placement(elsewhere, req, free, {2, 3}) == Mapped((1,), 428)


@pytest.mark.parametrize(
    "request_",
    [
        task("t", gpus=1, milli=250, gpu_mem_mib=9_000),
        task("t", gpus=2),
        task("t", gpus=0),
        replace(task("t", gpus=1, milli=300), isolation=Isolation.EXCLUSIVE),
    ],
)
def test_need_reads_what_binding_reads_of_the_request(request_: TaskRequest) -> None:
    """Binding reads a placement's need as `Need.of`, which must say what `Request.of` says."""
    full = Request.of(request_)
    assert Need.of(request_) == (full.gpu_milli, full.gpu_mem_mib)
