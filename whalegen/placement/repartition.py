"""Repartitioning as part of the plan: when the best place for a task needs a MIG layout its GPU does not
have, and that GPU is idle, the cycle re-carves it and the task waits for the agent to apply the layout.

Two pure decisions, both snapshot facts in, a verdict with a reason out:

- `plan_repartition(gpu, wanted)`: may this GPU be re-carved for these instances, and into what layout?
  Every "no" says why (not MIG, a unit in use, a stopping process, already promised, no layout fits).
- `claim_verdict(claim, …)`: what a later cycle does with a GPU an earlier cycle re-carved: bind the
  task to its new instance, keep waiting, or give the claim up (with the reason).

The layout: the wanted instances, at the engine's starts if those work, else wherever the geometry lets
them go, then the rest of the GPU filled with the largest instances that still fit, so nothing is left
uncarved. Among all starts for the wanted instances the layout that carves the most compute slices wins
(3g.40gb@4 + 4g.40gb@0 uses all seven; 3g@0 + 3g@4 only six), then the engine's own starts, then the
lowest starts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from whalegen.gpus.mig import MigProfile, mig_profiles
from whalegen.gpus.mig_plan import ME_PROFILE_ID, fits
from whalegen.placement.types import PartitionMode

# Enough for any wanted set on an 8-slice GPU; a bound so a pathological request cannot loop long.
MAX_CANDIDATES = 10_000


@dataclass(frozen=True)
class CarvedUnit:
    """One compute unit the GPU has now, as the plane planned it."""

    mig_profile: str  # "" outside MIG
    mig_start: int | None
    held: bool  # a task holds it


@dataclass(frozen=True)
class GpuView:
    """What the planner needs to know about one GPU."""

    name: str  # for reasons, e.g. "GPU 3 on eu-1/n7"
    model: str
    mode: PartitionMode
    units: tuple[CarvedUnit, ...]
    healthy: bool = True
    stopping: bool = False  # a released task's process may still run on it
    claimed_by: tuple[str, ...] = ()  # tasks an earlier cycle re-carved it for


@dataclass(frozen=True)
class WantedInstance:
    task_id: str
    mig_profile: str
    mig_start: int | None = None  # the engine's start; None lets the planner choose


@dataclass(frozen=True)
class MigSlot:
    mig_profile: str
    mig_start: int


@dataclass(frozen=True)
class RepartitionPlan:
    layout: tuple[MigSlot, ...]  # the GPU's whole new layout, by start
    for_tasks: tuple[tuple[str, MigSlot], ...]  # each wanted task and the instance it will get

    @property
    def text(self) -> str:
        """ "3g.40gb+4g.40gb": the layout as operators say it."""
        return "+".join(slot.mig_profile for slot in self.layout)


@dataclass(frozen=True)
class RepartitionRefusal:
    reason: str


def _layout_of(slots: Sequence[tuple[MigProfile, int]]) -> tuple[MigSlot, ...]:
    return tuple(MigSlot(p.name, s) for p, s in sorted(slots, key=lambda item: item[1]))


def _fill(profiles: Sequence[MigProfile], mask: int, counts: Counter[int]) -> list[tuple[MigProfile, int]]:
    """The rest of the GPU carved greedily, largest instances first (low starts for them)."""
    usable = sorted(
        (p for p in profiles if p.profile_id != ME_PROFILE_ID),
        key=lambda p: (-p.compute_slices, -p.memory_slices),
    )
    added: list[tuple[MigProfile, int]] = []
    placed = True
    while placed:
        placed = False
        for profile in usable:
            if counts[profile.profile_id] >= profile.max_instances:
                continue
            start = next((s for s in profile.starts if fits(profile, s, mask)), None)
            if start is not None:
                mask |= profile.slice_mask(start)
                counts[profile.profile_id] += 1
                added.append((profile, start))
                placed = True
                break
    return added


def plan_repartition(gpu: GpuView, wanted: Sequence[WantedInstance]) -> RepartitionPlan | RepartitionRefusal:
    """Re-carve an idle MIG GPU so that every wanted instance has a place; or the reason it may not be.

    Steps: 1. the GPU must be MIG, healthy, idle (no unit held, no process stopping) and not promised
    to another repartition; 2. the wanted profiles must exist on its model; 3. search the starts of the
    wanted instances, fill the rest, keep the best layout.
    """
    # 1. May this GPU be re-carved at all?
    if gpu.mode is not PartitionMode.MIG:
        return RepartitionRefusal(f"{gpu.name} is in {gpu.mode} mode; only MIG layouts are re-carved")
    if not gpu.healthy:
        return RepartitionRefusal(f"{gpu.name} is unhealthy")
    if gpu.claimed_by:
        return RepartitionRefusal(
            f"{gpu.name} is already being repartitioned for task {', '.join(gpu.claimed_by)}"
        )
    held = sum(1 for u in gpu.units if u.held)
    if held:
        return RepartitionRefusal(
            f"{gpu.name} has {held} of its {len(gpu.units)} compute units in use; a GPU is re-carved "
            "only when idle"
        )
    if gpu.stopping:
        return RepartitionRefusal(f"{gpu.name} still has a stopped task's process on it")
    if not wanted:
        return RepartitionRefusal("no instance asked for")
    # 2. Profiles.
    table = {p.name: p for p in mig_profiles(gpu.model)}
    missing = sorted({w.mig_profile for w in wanted if w.mig_profile not in table})
    if missing:
        return RepartitionRefusal(f"{gpu.model} has no MIG profile {', '.join(missing)}")
    asked = [table[w.mig_profile] for w in wanted]
    over = [p.name for p, n in Counter(asked).items() if n > p.max_instances]
    if over:
        return RepartitionRefusal(f"{gpu.model} holds fewer {', '.join(over)} instances than asked")

    # 3. Every assignment of starts to the wanted instances (bounded), each filled; the best wins.
    profiles = list(table.values())
    best: tuple[tuple[int, int, tuple[int, ...]], list[int], list[tuple[MigProfile, int]]] | None = None
    seen = 0

    def walk(k: int, mask: int, starts: list[int]) -> None:
        nonlocal best, seen
        if seen >= MAX_CANDIDATES:
            return
        if k == len(asked):
            seen += 1
            counts: Counter[int] = Counter(p.profile_id for p in asked)
            rest = _fill(profiles, mask, counts)
            compute = sum(p.compute_slices for p in asked) + sum(p.compute_slices for p, _ in rest)
            moved = sum(
                1 for w, s in zip(wanted, starts, strict=True) if w.mig_start is not None and w.mig_start != s
            )
            key = (-compute, moved, tuple(starts))
            if best is None or key < best[0]:
                best = (key, list(starts), rest)
            return
        profile = asked[k]
        for start in profile.starts:
            if fits(profile, start, mask):
                starts.append(start)
                walk(k + 1, mask | profile.slice_mask(start), starts)
                starts.pop()

    walk(0, 0, [])
    if best is None:
        return RepartitionRefusal(
            f"no MIG layout of {gpu.model} holds {'+'.join(p.name for p in asked)} at once"
        )
    _, starts, rest = best
    mine = list(zip(asked, starts, strict=True))
    return RepartitionPlan(
        layout=_layout_of(mine + rest),
        for_tasks=tuple((w.task_id, MigSlot(p.name, s)) for w, (p, s) in zip(wanted, mine, strict=True)),
    )


# -- claims -----------------------------------------------------------------------------------------


class ClaimAction(StrEnum):
    BIND = "bind"  # the layout is in place: bind the task to its new instance now
    WAIT = "wait"  # not applied yet: the task keeps waiting, nobody else gets the GPU
    ABANDON = "abandon"  # give the GPU back; the task (if still pending) is planned afresh


@dataclass(frozen=True)
class ClaimFacts:
    """One open repartition claim and what the node has said since."""

    task_pending: bool
    gpu_name: str
    layout: tuple[MigSlot, ...]
    generation: int
    age_s: float
    node_schedulable: bool
    gpu_healthy: bool
    unit_free: bool  # the task's new instance is still a free unit of the plan
    # The GPU's last partition report, if any: (state, generation, instances as (profile, start)).
    reported_state: str | None = None
    reported_generation: int | None = None
    reported_slots: frozenset[tuple[str, int]] = frozenset()
    reported_reason: str = ""
    reported_age_s: float = 0.0  # how long ago that report was made


@dataclass(frozen=True)
class ClaimVerdict:
    action: ClaimAction
    reason: str


def claim_verdict(claim: ClaimFacts, *, timeout_s: float, other_layout_s: float = 60.0) -> ClaimVerdict:
    """Bind, wait or abandon one claim; "ok" is the only partition state that means applied.

    An "ok" report of the claim's generation (or a later one) listing other instances is waited on for
    `other_layout_s` only: a long poll that raced the cycle can serve the old layout under the new number
    once, and the agent's next poll puts it right; a report that stays so means the GPU is carved
    otherwise for good, and the task is better planned afresh than held until `timeout_s`."""
    text = "+".join(slot.mig_profile for slot in claim.layout)
    where = f"{claim.gpu_name} is being repartitioned to {text} (generation {claim.generation})"
    if not claim.task_pending:
        return ClaimVerdict(ClaimAction.ABANDON, "the task is no longer pending")
    if not claim.gpu_healthy:
        return ClaimVerdict(ClaimAction.ABANDON, f"{claim.gpu_name} became unhealthy")
    if not claim.node_schedulable:
        return ClaimVerdict(ClaimAction.ABANDON, f"the node of {claim.gpu_name} takes nothing new")
    if not claim.unit_free:
        return ClaimVerdict(ClaimAction.ABANDON, f"the planned instance on {claim.gpu_name} is gone or taken")
    reported = claim.reported_generation is not None and claim.reported_generation >= claim.generation
    wanted = frozenset((s.mig_profile, s.mig_start) for s in claim.layout)
    if reported and claim.reported_state == "ok" and claim.reported_slots == wanted:
        return ClaimVerdict(ClaimAction.BIND, f"{claim.gpu_name} was repartitioned to {text}")
    if reported and claim.reported_state not in (None, "ok"):
        why = f": {claim.reported_reason}" if claim.reported_reason else ""
        return ClaimVerdict(
            ClaimAction.ABANDON,
            f"the agent could not repartition {claim.gpu_name} to {text} ({claim.reported_state}{why})",
        )
    if reported and claim.reported_state == "ok" and claim.reported_age_s > other_layout_s:
        theirs = "+".join(profile for profile, _ in sorted(claim.reported_slots, key=lambda s: s[1] or 0))
        return ClaimVerdict(
            ClaimAction.ABANDON,
            f"the agent has reported {claim.gpu_name} as {theirs or 'no instances'} for "
            f"{claim.reported_age_s:.0f} s (generation {claim.reported_generation}), not {text}",
        )
    if claim.age_s > timeout_s:
        return ClaimVerdict(
            ClaimAction.ABANDON,
            f"{claim.gpu_name} was not repartitioned to {text} within {timeout_s:g} s",
        )
    return ClaimVerdict(ClaimAction.WAIT, f"{where}; the task binds once the agent reports it applied")
