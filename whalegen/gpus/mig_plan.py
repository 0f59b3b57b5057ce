"""Explicit MIG placement planning over the memory-slice geometry (reference §4.5, §5.4).

The driver's automatic placement can strand slices (§4.6), so the agent plans every GPU instance's
start itself and creates it with `nvmlDeviceCreateGpuInstanceWithPlacement`. A layout is feasible iff
every instance starts at an allowed start of its profile, no two overlap in memory slices, and no
profile exceeds its instance count. With 8 slots the exact search is tiny, so it backtracks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from whalegen.gpus.mig import MEMORY_SLICES, MigProfile

# The +me variant is one 1g with media engines, limited to one instance; complete-layout counting
# leaves it out as the reference table does (§4.5).
ME_PROFILE_ID = 20


@dataclass(frozen=True)
class Placement:
    profile_id: int
    start: int


@dataclass(frozen=True)
class Wanted:
    profile_id: int
    start: int | None = None  # None: the planner chooses


def _by_id(profiles: Sequence[MigProfile]) -> dict[int, MigProfile]:
    return {p.profile_id: p for p in profiles}


def occupancy(profiles: Sequence[MigProfile], placed: Sequence[Placement]) -> int:
    """Bitmask of occupied memory slices; raises ValueError on overlap or an unknown profile."""
    table = _by_id(profiles)
    mask = 0
    for item in placed:
        bits = table[item.profile_id].slice_mask(item.start)
        if mask & bits:
            raise ValueError(f"placement {item} overlaps occupied slices {mask:08b}")
        mask |= bits
    return mask


def fits(profile: MigProfile, start: int, mask: int) -> bool:
    return start in profile.starts and not (profile.slice_mask(start) & mask)


def remaining_capacity(profiles: Sequence[MigProfile], placed: Sequence[Placement], profile_id: int) -> int:
    """How many more instances of `profile_id` fit now (NVML's GetGpuInstanceRemainingCapacity).

    Every profile's starts are multiples of its size (1g starts anywhere, size 1), so taking free
    starts left to right is optimal for same-size intervals.
    """
    table = _by_id(profiles)
    profile = table[profile_id]
    mask = occupancy(profiles, placed)
    existing = sum(1 for p in placed if p.profile_id == profile_id)
    free = 0
    for start in profile.starts:
        if fits(profile, start, mask):
            mask |= profile.slice_mask(start)
            free += 1
    return max(0, min(free, profile.max_instances - existing))


def _start_order(profile: MigProfile) -> tuple[int, ...]:
    # Small instances (≤ 2 memory slices) go high and large ones low, so the low half stays whole
    # for a later 3g/4g — the heuristic that also reproduces the driver's observed 4-2-1 layout (§4.6).
    if profile.memory_slices <= 2:
        return tuple(sorted(profile.starts, reverse=True))
    return profile.starts


def plan_placements(
    profiles: Sequence[MigProfile], fixed: Sequence[Placement], wanted: Sequence[Wanted]
) -> tuple[Placement, ...] | None:
    """Choose a start for every wanted instance around the `fixed` ones; None when impossible.

    Steps: 1. validate fixed instances and pinned starts; 2. order the free ones most-constrained
    first (fewest allowed starts, then largest); 3. backtrack over allowed starts. The result keeps
    the order of `wanted`.
    """
    table = _by_id(profiles)
    if any(w.profile_id not in table for w in wanted):
        return None
    # 1. Fixed instances and pinned starts.
    try:
        mask = occupancy(profiles, fixed)
    except ValueError:
        return None
    counts = Counter(p.profile_id for p in fixed)
    chosen: dict[int, Placement] = {}
    for i, want in enumerate(wanted):
        if want.start is None:
            continue
        profile = table[want.profile_id]
        if not fits(profile, want.start, mask):
            return None
        mask |= profile.slice_mask(want.start)
        counts[want.profile_id] += 1
        chosen[i] = Placement(want.profile_id, want.start)
    if any(counts[pid] > table[pid].max_instances for pid in counts):
        return None
    # 2. Most constrained first.
    free = [i for i, w in enumerate(wanted) if w.start is None]
    free.sort(
        key=lambda i: (len(table[wanted[i].profile_id].starts), -table[wanted[i].profile_id].memory_slices)
    )

    # 3. Backtracking.
    def search(k: int, mask: int) -> bool:
        if k == len(free):
            return True
        i = free[k]
        profile = table[wanted[i].profile_id]
        if counts[profile.profile_id] >= profile.max_instances:
            return False
        for start in _start_order(profile):
            if fits(profile, start, mask):
                counts[profile.profile_id] += 1
                chosen[i] = Placement(profile.profile_id, start)
                if search(k + 1, mask | profile.slice_mask(start)):
                    return True
                counts[profile.profile_id] -= 1
                del chosen[i]
        return False

    if not search(0, mask):
        return None
    return tuple(chosen[i] for i in range(len(wanted)))


def complete_layouts(profiles: Sequence[MigProfile]) -> list[tuple[int, ...]]:
    """Every maximal layout (as a sorted multiset of profile IDs) that uses all 7 compute slices.

    Maximal: no further instance of any profile fits. The +me profile is left out (§4.5), so on
    A100/H100/H200 this gives the 17 layouts of the reference table.
    """
    usable = [p for p in profiles if p.profile_id != ME_PROFILE_ID]
    slots = [(p, s) for p in usable for s in p.starts]
    found: set[tuple[int, ...]] = set()

    def maximal(mask: int, counts: Counter[int]) -> bool:
        return not any(counts[p.profile_id] < p.max_instances and fits(p, s, mask) for p, s in slots)

    def walk(from_slot: int, mask: int, counts: Counter[int], chosen: list[MigProfile]) -> None:
        if maximal(mask, counts):
            if sum(p.compute_slices for p in chosen) == 7:
                found.add(tuple(sorted(p.profile_id for p in chosen)))
            return
        for k in range(from_slot, len(slots)):
            profile, start = slots[k]
            if counts[profile.profile_id] < profile.max_instances and fits(profile, start, mask):
                counts[profile.profile_id] += 1
                chosen.append(profile)
                walk(k + 1, mask | profile.slice_mask(start), counts, chosen)
                chosen.pop()
                counts[profile.profile_id] -= 1

    walk(0, 0, Counter(), [])
    return sorted(found)


__all__ = [
    "MEMORY_SLICES",
    "Placement",
    "Wanted",
    "complete_layouts",
    "fits",
    "occupancy",
    "plan_placements",
    "remaining_capacity",
]
