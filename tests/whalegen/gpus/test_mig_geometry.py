"""MIG tables, CI profiles, SKU fixtures and the placement planner against the geometry of §4.5."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whalegen.gpus import (
    SKUS,
    GpuModel,
    MigProfile,
    MigResetPolicy,
    ci_profiles,
    full_ci_profile,
    get_model,
    get_sku,
    mig_profiles,
    model_from_nvml_name,
    profile_by_id,
    profile_by_name,
)
from whalegen.gpus.mig_plan import (
    Placement,
    Wanted,
    complete_layouts,
    occupancy,
    plan_placements,
    remaining_capacity,
)

MIG_MODELS = ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"]
# §4.5 "Complete layouts", with 1g′ = the double-memory 1g (ID 15).
NAMES = {"7g": 0, "4g": 5, "3g": 9, "2g": 14, "1g": 19, "1g'": 15}
REFERENCE_LAYOUTS = [
    "7g",
    "4g+3g",
    "4g+2g+1g",
    "4g+2g+1g'",
    "4g+3*1g",
    "4g+2*1g+1g'",
    "3g+2*2g",
    "3g+2g+2*1g",
    "3g+4*1g",
    "3*2g+1g",
    "3*2g+1g'",
    "2*2g+3*1g",
    "2*2g+2*1g+1g'",
    "2g+5*1g",
    "2g+4*1g+1g'",
    "7*1g",
    "6*1g+1g'",
]


def _ids(layout: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in layout.split("+"):
        count, _, name = part.rpartition("*")
        ids += [NAMES[name]] * int(count or 1)
    return tuple(sorted(ids))


def test_existing_public_names_keep_working() -> None:
    assert isinstance(get_model("H100"), GpuModel)
    profile = profile_by_name("H100-80GB", "3g.40gb")
    assert isinstance(profile, MigProfile) and profile.profile_id == 9
    assert profile_by_id("H200-141GB", 15).name == "1g.35gb"
    assert mig_profiles("L40S") == ()


@pytest.mark.parametrize("model", MIG_MODELS)
def test_the_17_complete_layouts_of_the_reference_are_exactly_the_maximal_full_ones(model: str) -> None:
    assert complete_layouts(mig_profiles(model)) == sorted(_ids(layout) for layout in REFERENCE_LAYOUTS)


@pytest.mark.parametrize("model", MIG_MODELS)
@pytest.mark.parametrize("layout", REFERENCE_LAYOUTS)
def test_every_complete_layout_gets_a_plan_that_respects_the_geometry(model: str, layout: str) -> None:
    profiles = mig_profiles(model)
    plan = plan_placements(profiles, [], [Wanted(pid) for pid in _ids(layout)])
    assert plan is not None
    occupancy(profiles, plan)  # raises on overlap
    by_id = {p.profile_id: p for p in profiles}
    assert all(p.start in by_id[p.profile_id].starts for p in plan)
    assert sum(by_id[p.profile_id].compute_slices for p in plan) == 7


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("4*2g", "a fourth 2g"),
        ("2*3g+1g", "3g + 3g + 1g"),
        ("4g+4g", "two 4g"),
        ("7g+1g", "nothing beside a 7g"),
    ],
)
def test_impossible_layouts_have_no_plan(layout: str, why: str) -> None:
    assert plan_placements(mig_profiles("H100-80GB"), [], [Wanted(pid) for pid in _ids(layout)]) is None, why


def test_pinned_starts_are_honoured_and_checked() -> None:
    profiles = mig_profiles("H200-141GB")
    assert plan_placements(profiles, [], [Wanted(9, 4), Wanted(9)]) == (Placement(9, 4), Placement(9, 0))
    assert plan_placements(profiles, [], [Wanted(9, 2)]) is None  # 3g may only start at 0 or 4
    assert plan_placements(profiles, [Placement(19, 0)], [Wanted(9, 0)]) is None  # overlaps a kept 1g


def test_small_instances_are_placed_high_to_keep_room_for_large_ones() -> None:
    profiles = mig_profiles("H100-80GB")
    assert plan_placements(profiles, [], [Wanted(19), Wanted(14)]) == (Placement(19, 6), Placement(14, 4))


def test_ci_profiles_mirror_the_gi_placement_rules_in_compute_slices() -> None:
    seven = profile_by_name("H100-80GB", "7g.80gb")
    assert [(c.name, c.starts) for c in ci_profiles(seven)] == [
        ("1c.7g", (0, 1, 2, 3, 4, 5, 6)),
        ("2c.7g", (0, 2, 4)),
        ("3c.7g", (0, 4)),
        ("4c.7g", (0,)),
        ("7g", (0,)),
    ]
    three = profile_by_name("A100-40GB", "3g.20gb")
    assert full_ci_profile(three).compute_slices == 3 and full_ci_profile(three).profile_id == 2


def test_sku_fixtures_join_catalogue_and_mig_tables() -> None:
    assert set(SKUS) == {"a100-40gb", "a100-80gb", "h100-80gb-sxm", "h200-141gb", "l40s"}
    h200 = get_sku("h200-141gb")
    assert (
        h200.mig_reset_policy is MigResetPolicy.HOPPER
        and get_sku("a100-80gb").mig_reset_policy is MigResetPolicy.AMPERE
    )
    assert h200.total_mem_mib == get_model("H200").mem_mib
    assert [p.profile_id for p in h200.gi_profiles] == [19, 20, 15, 14, 9, 5, 0]
    assert not get_sku("l40s").mig_capable and get_sku("l40s").gi_profiles == ()
    assert h200.to_dict()["gi_profiles"][4]["ci_profiles"][-1]["name"] == "3g"
    with pytest.raises(LookupError):
        get_sku("b200")


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA H100 NVL", "H100-80GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_nvml_device_names_map_to_catalogue_models(nvml_name: str, model: str | None) -> None:
    assert model_from_nvml_name(nvml_name) == model


def _brute_force_capacity(profiles: tuple[MigProfile, ...], placed: list[Placement], profile_id: int) -> int:
    """The largest k such that k more instances fit, by trying every subset of starts."""
    profile = next(p for p in profiles if p.profile_id == profile_id)
    mask = occupancy(profiles, placed)
    room = profile.max_instances - sum(1 for p in placed if p.profile_id == profile_id)
    best = 0
    for k in range(1, min(room, len(profile.starts)) + 1):
        for starts in combinations(profile.starts, k):
            bits = [profile.slice_mask(s) for s in starts]
            if all(not b & mask for b in bits) and sum(bits) == _or(bits):
                best = k
                break
    return best


def _or(values: list[int]) -> int:
    out = 0
    for value in values:
        out |= value
    return out


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(MIG_MODELS),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 7)), max_size=25),
)
def test_random_create_destroy_keeps_geometry_and_capacity_honest(
    model: str, ops: list[tuple[bool, int, int]]
) -> None:
    """Create (explicit start) / destroy at random: no overlap ever, counts respected, and the fast
    remaining-capacity equals a brute-force recount after every step."""
    profiles = mig_profiles(model)
    placed: list[Placement] = []
    for create, profile_pick, start_pick in ops:
        if create:
            profile = profiles[profile_pick % len(profiles)]
            start = profile.starts[start_pick % len(profile.starts)]
            plan = plan_placements(profiles, placed, [Wanted(profile.profile_id, start)])
            if plan is not None:
                placed.append(plan[0])
        elif placed:
            placed.pop(start_pick % len(placed))
        occupancy(profiles, placed)
        counts = Counter(p.profile_id for p in placed)
        assert all(counts[p.profile_id] <= p.max_instances for p in profiles)
        for profile in profiles:
            assert remaining_capacity(profiles, placed, profile.profile_id) == _brute_force_capacity(
                profiles, placed, profile.profile_id
            )
