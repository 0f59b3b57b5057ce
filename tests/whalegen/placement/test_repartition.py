"""The repartition planner and the claim verdict: pure, table-driven, every "no" with its reason."""

from __future__ import annotations

import pytest

from whalegen.gpus.mig import mig_profiles
from whalegen.gpus.mig_plan import Placement, occupancy
from whalegen.placement.repartition import (
    CarvedUnit,
    ClaimAction,
    ClaimFacts,
    GpuView,
    MigSlot,
    RepartitionPlan,
    RepartitionRefusal,
    WantedInstance,
    claim_verdict,
    plan_repartition,
)
from whalegen.placement.types import PartitionMode

H100 = "H100-80GB"
SEVEN_1G = tuple(CarvedUnit("1g.10gb", start, held=False) for start in range(7))


def gpu(**changes: object) -> GpuView:
    fields: dict[str, object] = {
        "name": "GPU 3 on eu-1/n7",
        "model": H100,
        "mode": PartitionMode.MIG,
        "units": SEVEN_1G,
    }
    fields.update(changes)
    return GpuView(**fields)  # type: ignore[arg-type]


def plan(view: GpuView, *wanted: WantedInstance) -> RepartitionPlan:
    result = plan_repartition(view, wanted)
    assert isinstance(result, RepartitionPlan), result
    return result


def valid(layout: tuple[MigSlot, ...]) -> bool:
    table = {p.name: p for p in mig_profiles(H100)}
    occupancy(list(table.values()), [Placement(table[s.mig_profile].profile_id, s.mig_start) for s in layout])
    return all(s.mig_start in table[s.mig_profile].starts for s in layout)


def compute_slices(layout: tuple[MigSlot, ...]) -> int:
    table = {p.name: p for p in mig_profiles(H100)}
    return sum(table[s.mig_profile].compute_slices for s in layout)


@pytest.mark.parametrize(
    "wanted, want_text, want_slot",
    [
        ([WantedInstance("7", "3g.40gb", 0)], "4g.40gb+3g.40gb", MigSlot("3g.40gb", 4)),
        ([WantedInstance("7", "7g.80gb", 0)], "7g.80gb", MigSlot("7g.80gb", 0)),
        ([WantedInstance("7", "1g.10gb", 6)], "4g.40gb+2g.20gb+1g.10gb", MigSlot("1g.10gb", 6)),
        ([WantedInstance("7", "4g.40gb", None)], "4g.40gb+3g.40gb", MigSlot("4g.40gb", 0)),
    ],
    ids=[
        "a 3g moves to slice 4 so a 4g fills the rest and all seven compute slices are carved",
        "a 7g takes the whole GPU",
        "a 1g keeps the engine's start and the rest is carved largest first",
        "a free start is chosen by the planner",
    ],
)
def test_an_idle_gpu_is_recarved_around_what_is_wanted(
    wanted: list[WantedInstance], want_text: str, want_slot: MigSlot
) -> None:
    result = plan(gpu(), *wanted)
    assert result.text == want_text
    assert result.for_tasks == (("7", want_slot),)
    assert want_slot in result.layout
    assert valid(result.layout)


def test_two_tasks_share_one_new_layout() -> None:
    result = plan(gpu(), WantedInstance("7", "3g.40gb", 0), WantedInstance("8", "3g.40gb", 0))
    slots = dict(result.for_tasks)
    assert {slots["7"], slots["8"]} == {MigSlot("3g.40gb", 0), MigSlot("3g.40gb", 4)}
    assert valid(result.layout) and result.text == "3g.40gb+3g.40gb"


def test_the_layout_carves_the_most_compute_the_geometry_allows() -> None:
    for profile in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb"):
        result = plan(gpu(units=()), WantedInstance("1", profile, None))
        assert compute_slices(result.layout) == 7, (profile, result.text)


@pytest.mark.parametrize(
    "view, wanted, want_words",
    [
        (gpu(mode=PartitionMode.SHARED), ["3g.40gb"], "only MIG layouts"),
        (gpu(healthy=False), ["3g.40gb"], "unhealthy"),
        (gpu(claimed_by=("5",)), ["3g.40gb"], "already being repartitioned for task 5"),
        (
            gpu(units=(CarvedUnit("1g.10gb", 0, held=True), *SEVEN_1G[1:])),
            ["3g.40gb"],
            "1 of its 7 compute units in use",
        ),
        (gpu(stopping=True), ["3g.40gb"], "stopped task's process"),
        (gpu(), ["5g.50gb"], "no MIG profile 5g.50gb"),
        (gpu(), ["4g.40gb", "4g.40gb"], "fewer 4g.40gb instances than asked"),
        (gpu(), ["4g.40gb", "3g.40gb", "1g.10gb"], "no MIG layout of H100-80GB holds"),
        (gpu(), [], "no instance asked for"),
    ],
    ids=[
        "a shared GPU is not re-carved",
        "an unhealthy GPU is not re-carved",
        "a GPU promised to another task is not planned again",
        "a GPU with a unit in use is never re-carved",
        "a GPU a stopping process may use is not re-carved",
        "an unknown profile is refused",
        "more instances than the profile allows are refused",
        "instances that cannot fit together are refused",
        "nothing asked is refused",
    ],
)
def test_every_refusal_says_why(view: GpuView, wanted: list[str], want_words: str) -> None:
    result = plan_repartition(view, [WantedInstance(str(i), p) for i, p in enumerate(wanted)])
    assert isinstance(result, RepartitionRefusal)
    assert want_words in result.reason


LAYOUT = (MigSlot("4g.40gb", 0), MigSlot("3g.40gb", 4))


def facts(**changes: object) -> ClaimFacts:
    fields: dict[str, object] = {
        "task_pending": True,
        "gpu_name": "GPU 3 on eu-1/n7",
        "layout": LAYOUT,
        "generation": 5,
        "age_s": 10.0,
        "node_schedulable": True,
        "gpu_healthy": True,
        "unit_free": True,
    }
    fields.update(changes)
    return ClaimFacts(**fields)  # type: ignore[arg-type]


APPLIED = {"reported_state": "ok", "reported_slots": frozenset({("4g.40gb", 0), ("3g.40gb", 4)})}


@pytest.mark.parametrize(
    "changes, want_action, want_words",
    [
        ({}, ClaimAction.WAIT, "is being repartitioned to 4g.40gb+3g.40gb (generation 5)"),
        ({**APPLIED, "reported_generation": 5}, ClaimAction.BIND, "was repartitioned"),
        ({**APPLIED, "reported_generation": 7}, ClaimAction.BIND, "was repartitioned"),
        ({**APPLIED, "reported_generation": 4}, ClaimAction.WAIT, "generation 5"),
        (
            {**APPLIED, "reported_generation": 5, "reported_slots": frozenset({("7g.80gb", 0)})},
            ClaimAction.WAIT,
            "binds once the agent reports it applied",
        ),
        (
            {
                **APPLIED,
                "reported_generation": 5,
                "reported_slots": frozenset({("7g.80gb", 0)}),
                "reported_age_s": 59.0,
            },
            ClaimAction.WAIT,
            "binds once the agent reports it applied",
        ),
        (
            {
                **APPLIED,
                "reported_generation": 6,
                "reported_slots": frozenset({("7g.80gb", 0)}),
                "reported_age_s": 61.0,
            },
            ClaimAction.ABANDON,
            "the agent has reported GPU 3 on eu-1/n7 as 7g.80gb for 61 s (generation 6), not 4g.40gb+3g.40gb",
        ),
        (
            {"reported_state": "blocked", "reported_generation": 5, "reported_reason": "busy"},
            ClaimAction.ABANDON,
            "could not repartition GPU 3 on eu-1/n7 to 4g.40gb+3g.40gb (blocked: busy)",
        ),
        ({"task_pending": False}, ClaimAction.ABANDON, "no longer pending"),
        ({"gpu_healthy": False}, ClaimAction.ABANDON, "unhealthy"),
        ({"node_schedulable": False}, ClaimAction.ABANDON, "takes nothing new"),
        ({"unit_free": False}, ClaimAction.ABANDON, "gone or taken"),
        ({"age_s": 301.0}, ClaimAction.ABANDON, "within 300 s"),
    ],
    ids=[
        "no report yet: wait",
        "applied at its generation: bind",
        "applied at a later generation: bind",
        "a report of an older generation: wait",
        "a report of another layout: wait",
        "another layout reported for under a minute: wait (a raced long poll)",
        "another layout reported for over a minute: give it up",
        "the agent could not apply it: give it up with the agent's reason",
        "the task left pending: give it up",
        "the GPU failed: give it up",
        "the node was cordoned or lost: give it up",
        "the planned unit is gone: give it up",
        "not applied in time: give it up",
    ],
)
def test_a_claim_binds_waits_or_is_given_up(
    changes: dict[str, object], want_action: ClaimAction, want_words: str
) -> None:
    verdict = claim_verdict(facts(**changes), timeout_s=300)
    assert verdict.action is want_action
    assert want_words in verdict.reason
