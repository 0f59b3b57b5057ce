"""`decide(snapshot, config, now_s) -> Decisions`: one scheduling cycle's every decision, pure.

The production cycle (`apps.scheduling.services.cycle_run`), the replays (`whalegen.sim`) and the
benchmarks call this; Django code around it only reads the snapshot and commits what it returns.

Steps of one decision (`Decider.step`):

1. **Claims.** GPUs re-carved by earlier cycles: a task whose new instance is in place binds to it
   (within its quota); one whose layout is not applied yet keeps waiting (`waiting_for_layout`). A gang
   binds when every member's instance is in place, all members at once.
2. **Order.** Guarantees first, then borrowing; effective priority; weighted dominant-resource fair
   share between queues and tenants; age (`whalegen.scheduling.order`). Gangs go as one unit.
3. **Present units.** The engine places the ordered tasks on the units GPUs have now, with quotas, gangs
   (all or nothing) and the online reserve checked inside it. A whole-GPU task first sees only GPUs
   outside MIG mode (a free whole GPU beats an idle MIG GPU, whose layout would have to go); what is
   left then tries every GPU, with preemption proposals where nothing fits.
4. **Units.** Every placement is mapped onto the free units that carry it (`whalegen.scheduling.units`).
   A placement no free units carry (the engine's slice model put it across or inside carved instances)
   is taken back, its GPU closed to it, and it is tried again, until every placement left is bound.
   So every decision names units the commit binds; none is handled later. Then a single whole-GPU task
   bound to a MIG instance moves to free whole GPUs if a gang taken back meanwhile left any, and what
   waits for room tries once more on the instances it left.
5. **Re-carve.** Tasks still left for capacity that a MIG instance could serve try the idle MIG GPUs
   nothing landed on, opened as fresh GPUs. A one-GPU task placed there gets a layout plan
   (`plan_repartition`) and waits for it; a gang of one-GPU tasks gets a plan for every member or for
   none (its members bind together in step 1 of a later cycle); a multi-GPU task only learns that a new
   layout would be needed (`needs_layout_change`). Re-carving comes after present units, so a task only
   a re-carve can serve never holds up the tasks behind it.
5b. **Pre-carve** (only with `Config.precarve` and a confident `Snapshot.forecast`): idle MIG GPUs that
   nothing in this decision touches, whose layout serves the forecast's expected MIG shapes worse than
   another layout of their model would, get that layout now, a few per cycle, each with its reason
   (`whalegen.scheduling.precarve`). The next task of such a shape finds its instance carved.
6. **Preemptions** proposed for tasks that were placed after all, or whose victims were placed this very
   cycle (not running, so not stoppable), are dropped.
7. **Reasons and estimates** for every task not placed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from whalegen.placement.engine import Engine
from whalegen.placement.recarve import CAPACITY_OUTCOMES, can_use_mig, with_gpus
from whalegen.placement.repartition import (
    ClaimAction,
    MigSlot,
    RepartitionPlan,
    WantedInstance,
    plan_repartition,
)
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ComputeUnit,
    GpuState,
    Isolation,
    NodeState,
    Outcome,
    PartitionMode,
    Placement,
    Preemption,
    RunningTask,
    TaskRequest,
    UnitKind,
    Unplaced,
)
from whalegen.scheduling.estimate import estimate_starts
from whalegen.scheduling.order import order_units
from whalegen.scheduling.precarve import Precarve, precarve
from whalegen.scheduling.reserve import Reservation, delays, is_large, pool_view, with_holders
from whalegen.scheduling.reserve import plan as plan_reservation
from whalegen.scheduling.snapshot import engine_gpu
from whalegen.scheduling.types import (
    Bound,
    Claim,
    Code,
    Config,
    Decisions,
    GpuKey,
    LayoutPlan,
    Reason,
    Snapshot,
)
from whalegen.scheduling.units import Mapped, Need, map_placement


@dataclass
class _Begun:
    """What `Decider.begin` hands `Decider.finish`: one step's state after the engine's pass."""

    unplaced: dict[str, Reason]
    bound: list[Bound]  # claims bound in step 1
    ordered: list[TaskRequest]
    requests: dict[str, TaskRequest]
    placements: list[Placement]
    left: dict[str, Unplaced]
    preemptions: list[Preemption]


@dataclass
class _Early:
    """Step 4 begun while the engine places (`begin` with `on_placed`): the placements as heard, mapped
    onto free units in that order. `_bind`'s first `_map` over the same placements, from nothing taken,
    maps each the same way, so `finish` takes these results instead of mapping again."""

    heard: list[Placement] = field(default_factory=list)
    bound: list[Bound] = field(default_factory=list)
    failed: list[tuple[Placement, GpuKey]] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)
    diverged: set[GpuKey] = field(default_factory=set)

    def covers(self, placements: Sequence[Placement]) -> bool:
        """Whether these are exactly the placements heard, in the order heard (the same objects)."""
        return len(placements) == len(self.heard) and all(
            a is b for a, b in zip(placements, self.heard, strict=True)
        )


def decide(snapshot: Snapshot, config: Config, now_s: float, *, estimates: bool = True) -> Decisions:
    """Every decision of one cycle over `snapshot` (see the module for the steps)."""
    return Decider(snapshot, config).step(snapshot.cluster.pending, now_s, estimates=estimates)


# Re-carve solves per step: a task refused a layout (its GPU cannot be carved so) gives the GPUs the
# engine put it on back to the tasks it kept out, in another solve. Refusals are rare, so a few do.
RECARVE_ROUNDS = 3


class Decider:
    """`decide` as a session: the engine's working copy stays alive between steps.

    The production cycle makes one step on a fresh snapshot. The replays keep one session and make a step
    per arrival (`step`) and a release per departure (`release`): after a step the working copy is exactly
    the snapshot the next cycle would read, so this is the same decision without rebuilding a thousand
    nodes per task.
    """

    def __init__(self, snapshot: Snapshot, config: Config) -> None:
        self.snapshot = snapshot
        self.config = config
        self.engine_config = config.engine()
        self.engine = Engine(snapshot.cluster, self.engine_config)
        # Nodes held for preemptors stay held through every solve of a decision (`Engine.held`).
        self.engine.decision_spans_solves = True
        self.has_mig = any(g.mode is PartitionMode.MIG for n in snapshot.cluster.nodes for g in n.gpus)
        # A pool of MIG GPUs only has no whole GPU to move a whole-GPU task to (`_whole_off_mig`).
        self.has_other = any(g.mode is not PartitionMode.MIG for n in snapshot.cluster.nodes for g in n.gpus)
        # Placements of earlier steps still running (an engine built later must carry them).
        self.live: dict[str, Placement] = {}
        self.requests: dict[str, TaskRequest] = {}
        self._needs_layout: set[str] = set()
        self._before_recarve: dict[GpuKey, GpuState] = {}
        self._diverged: set[GpuKey] = set()  # GPUs whose bound units differ from the engine's picture
        self._held: dict[str, Reason] = {}  # tasks the last step held back for a reservation
        self._begun: _Begun | None = None  # between `begin` and `finish`
        self._early: _Early | None = None  # units mapped as the engine placed (`begin` with `on_placed`)

    def release(self, task_id: str) -> None:
        """A task placed by an earlier step finished: its resources go back to the working copy."""
        self.engine.release(task_id)
        self.live.pop(task_id, None)

    # -- one step ----------------------------------------------------------------------------------

    def step(
        self,
        pending: Sequence[TaskRequest],
        now_s: float,
        *,
        estimates: bool = True,
        nodes_after: bool = True,
    ) -> Decisions:
        """One decision over `pending` on the working copy (which keeps what it places).

        `estimates` and `nodes_after` cost a sweep over the pool; a replay that steps once per arriving
        task and reads neither turns them off.
        """
        self.begin(pending, now_s)
        return self.finish(now_s, estimates=estimates, nodes_after=nodes_after)

    def begin(
        self,
        pending: Sequence[TaskRequest],
        now_s: float,
        on_placed: Callable[[list[Bound]], None] | None = None,
        batch: int = 1,
    ) -> tuple[Placement, ...]:
        """`step`'s steps 1-3 (claims, order, the engine on present units); `finish` does the rest. Returns
        the engine's placements: step 4 binds nearly all of them as they are, but may move one or take it
        back (and place others), so they are what the decision will most likely say, not what it says.

        `on_placed` hears the engine's placements as it makes them (its one pass; a pool where whole-GPU
        tasks first try GPUs outside MIG mode has two, and hears nothing), each already mapped onto free
        units as step 4 maps it first, `batch` or more at a time (the rest when the pass ends): the
        production cycle writes them while the engine goes on. A unit of work (a task, or a gang at
        once) with a placement no free units carry is not heard: step 4 takes it back and tries again."""
        snapshot = self.snapshot
        unplaced: dict[str, Reason] = {}
        bound: list[Bound] = []
        self._needs_layout = set()
        self._before_recarve = {}
        self._diverged = set()
        self._early = None
        self.engine.held = {}  # nodes held for the last decision's preemptors: their victims have stopped
        # 1. Claims.
        bound += self._claims(unplaced)
        # 2. Order: each task carries its place.
        if len(pending) == 1:
            ordered = [_with_order_key(pending[0], 0)]  # one task is its own order
        else:
            ordered = [
                _with_order_key(task, position)
                for position, unit in enumerate(
                    order_units(replace(snapshot.cluster, pending=tuple(pending)), snapshot.queues)
                )
                for task in unit
            ]
        # Later passes re-offer tasks in this order.
        requests = dict(snapshot.claimed_requests)
        requests.update({t.task_id: t for t in ordered})
        self.requests.update(requests)
        # 3. Present units (and step 4's first mapping as they are made, when someone listens).
        if on_placed is not None and snapshot.unit_exact:
            heard, flush = self._mapping_early(on_placed, batch)
            placements, left, preemptions = self._present(ordered, now_s, on_placed=heard)
            flush()
        else:
            placements, left, preemptions = self._present(ordered, now_s)
        self._begun = _Begun(unplaced, bound, ordered, requests, placements, left, preemptions)
        return tuple(placements)

    def _mapping_early(
        self, on_placed: Callable[[list[Bound]], None], batch: int
    ) -> tuple[Callable[[list[Placement]], None], Callable[[], None]]:
        """What the engine tells of each unit of work it places, and what passes on the rest at the end:
        mapped onto units `batch` placements at a time (a call per task cost more than the mapping)."""
        early = self._early = _Early()
        waiting: list[list[Placement]] = []  # units of work heard and not mapped yet
        count = 0

        def flush() -> None:
            nonlocal count
            placements = [p for unit in waiting for p in unit]
            start = len(early.bound)
            missed = self._map(placements, early.bound, early.taken, early.diverged)
            early.heard += placements
            early.failed += missed
            bound = early.bound[start:]
            if missed:  # a unit of work with a miss is not passed on, whole
                ids = {p.task_id for p, _ in missed}
                out = {p.task_id for unit in waiting if any(p.task_id in ids for p in unit) for p in unit}
                bound = [b for b in bound if b.task_id not in out]
            waiting.clear()
            count = 0
            if bound:
                on_placed(bound)

        def heard(made: list[Placement]) -> None:
            nonlocal count
            waiting.append(made)
            count += len(made)
            if count >= batch:
                flush()

        return heard, flush

    def placement_reason(self, task_id: str) -> str | None:
        """The policy's own words for where it put `task_id` last, when it explains its choices
        (`whalegen.placement.aware`; `Decisions.placement_reasons` keeps those of the step's placements)."""
        said: Mapping[str, str] = getattr(self.engine.policy, "reasons", {})
        return said.get(task_id)

    def finish(self, now_s: float, *, estimates: bool = True, nodes_after: bool = True) -> Decisions:
        """`step`'s steps 3b-7, after `begin` (see `step`)."""
        if self._begun is None:
            raise RuntimeError("finish() without begin()")
        begun, self._begun = self._begun, None
        snapshot = self.snapshot
        unplaced, bound, ordered, requests = begun.unplaced, begun.bound, begun.ordered, begun.requests
        placements, left, preemptions = begun.placements, begun.left, begun.preemptions
        # 3b. Reservation (only with `Config.reserve`): backfill that would delay the first large task
        #     left waiting is taken back (whalegen.scheduling.reserve).
        reservation: Reservation | None = None
        held: dict[str, Reason] = {}
        if self.config.reserve is not None:
            placements, reservation, held = self._reserve(ordered, placements, left, now_s)
            unplaced.update(held)
        # 4. Units.
        if snapshot.unit_exact:
            bound += self._bind_units(placements, left, now_s)
        else:
            bound += [Bound(p, ()) for p in placements]
        # 5. Re-carve.
        layouts = self._recarve(bound, left, requests, now_s)
        parts: dict[str, list[tuple[str, str, MigSlot, int | None]]] = defaultdict(list)
        for plan in layouts:
            for task_id, slot in plan.plan.for_tasks:
                parts[task_id].append((snapshot.gpu_views[plan.gpu].name, plan.plan.text, slot, None))
        for task_id, on in parts.items():
            left[task_id] = Unplaced(task_id, Outcome.NO_CAPACITY, repartition_sentence(on))
        layout_tasks = {t for plan in layouts for t, _ in plan.plan.for_tasks}
        # 5b. Pre-carve.
        precarves = self._precarve(bound, layouts, preemptions) if self.config.precarve is not None else ()
        # 6. Preemptions.
        placed_ids = {b.placement.task_id for b in bound} | layout_tasks
        # A task the policy deferred while units had room waits by choice: displacing work would free a
        # unit it declines too (a policy that defers keeps `deferred`: whalegen.placement.aware).
        # Victims on a model it would take are kept: they free a unit it accepts.
        waits: Mapping[str, tuple[float, str, frozenset[str]]] = getattr(self.engine.policy, "deferred", {})
        deferred = {
            t: (why, models)
            for t, (at_s, why, models) in waits.items()
            if at_s == now_s and t in left and t not in placed_ids
        }
        model_of = (
            dict(zip(self.engine.state.names, self.engine.state.models, strict=True)) if deferred else {}
        )
        running = {t.task_id for t in snapshot.cluster.running}
        proposals: dict[str, list[Preemption]] = defaultdict(list)
        for preemption in preemptions:
            for_task = preemption.for_task_id
            if for_task in deferred and model_of.get(preemption.node) not in deferred[for_task][1]:
                continue
            if for_task not in placed_ids:
                proposals[for_task].append(preemption)
        for task_id, (why, _) in deferred.items():
            if task_id not in proposals:
                unplaced[task_id] = Reason(Code.DEFERRED, why)
        kept: list[Preemption] = []
        for for_task, victims in proposals.items():
            if all(v.victim_task_id in running for v in victims):
                kept += victims
                continue
            message = left[for_task].message.split("; waiting for")[0]
            left[for_task] = Unplaced(
                for_task,
                Outcome.WAITING_FOR_PREEMPTION,
                message + "; the tasks it could displace were placed this cycle and are not running yet",
            )
            unplaced[for_task] = Reason(Code.VICTIM_CLAIMED, left[for_task].message)
        # 7. Reasons and estimates.
        for task_id, item in left.items():
            if task_id in placed_ids and task_id not in layout_tasks:
                continue
            if task_id in unplaced:
                continue
            if task_id in layout_tasks:
                code = Code.WAITING_FOR_LAYOUT
            elif task_id in self._needs_layout:
                code = Code.NEEDS_LAYOUT
            else:
                code = item.outcome.value
            unplaced[task_id] = Reason(code, item.message)
        self.live.update({b.placement.task_id: b.placement for b in bound})
        self._held = held
        # A policy that explains its choices (whalegen.placement.aware) keeps them by task id.
        said: Mapping[str, str] = getattr(self.engine.policy, "reasons", {})
        decisions = Decisions(
            placements=tuple(bound),
            preemptions=tuple(kept),
            layouts=tuple(layouts),
            unplaced=unplaced,
            reservation=reservation,
            placement_reasons={b.task_id: said[b.task_id] for b in bound if b.task_id in said}
            if said
            else {},
            precarves=precarves,
        )
        if estimates:
            return self.explain(decisions, now_s)
        return replace(decisions, nodes_after=self._nodes_after(bound, layouts)) if nodes_after else decisions

    # -- 7. estimates --------------------------------------------------------------------------------

    def explain(self, decisions: Decisions, now_s: float) -> Decisions:
        """`decisions` (this decider's last step, taken with `estimates=False`) with the pool after it
        and every unplaced task's estimated start. Nothing placed changes: the production cycle sends its
        placements to the database first and runs this while the server writes them."""
        bound, layouts = list(decisions.placements), list(decisions.layouts)
        after = self._nodes_after(bound, layouts)
        unplaced = dict(decisions.unplaced)
        starts: dict[str, float | None] = {}
        if unplaced:
            # Tasks left for one reason share its sentence (236 sentences for 3,220 tasks left in a
            # 10,000-task cycle): one Reason each, not one per task.
            told: dict[tuple[str, str, str], Reason] = {}
            for task_id, estimate in estimate_starts(
                self.snapshot, unplaced, now_s, nodes_after=after, placements=bound, requests=self.requests
            ).items():
                starts[task_id] = estimate.start_s
                if estimate.start_s is None and estimate.why_unknown:
                    reason = unplaced[task_id]
                    key = (reason.code, reason.message, estimate.why_unknown)
                    if key not in told:
                        told[key] = Reason(
                            reason.code, f"{reason.message}; estimated start unknown: {estimate.why_unknown}"
                        )
                    unplaced[task_id] = told[key]
            reservation = decisions.reservation
            if reservation is not None and reservation.start_s is not None:
                # The reserved task starts when its reservation says; what is held for it, not before.
                for task_id in reservation.task_ids:
                    starts[task_id] = reservation.start_s
                for task_id in unplaced.keys() & self._held.keys():
                    starts[task_id] = max(starts.get(task_id) or now_s, reservation.start_s)
        return replace(decisions, unplaced=unplaced, estimates=starts, nodes_after=after)

    # -- 1. claims --------------------------------------------------------------------------------

    def _claims(self, unplaced: dict[str, Reason]) -> list[Bound]:
        """GPUs re-carved by earlier cycles: a task whose new instances are all in place (one per GPU it
        asked for) binds to them, within its quota. A gang binds only when every member's instances are,
        all members at once; until then each keeps its instances and waits (`waiting_for_layout`)."""
        snapshot = self.snapshot
        groups: dict[str, list[tuple[TaskRequest, tuple[Claim, ...]]]] = defaultdict(list)
        for task_id, claims in snapshot.claims.items():
            request = snapshot.claimed_requests.get(task_id)
            if request is None or not claims or any(c.action is ClaimAction.ABANDON for c in claims):
                continue
            groups[request.gang_id or task_id].append((request, claims))
        bound: list[Bound] = []
        for group in groups.values():
            first = group[0][0]
            ready = [(request, claims) for request, claims in group if all(map(_in_place, claims))]
            if len(ready) < len(group) or (first.gang_id is not None and len(group) < first.gang_size):
                gang = (first.gang_id or "").split(":", 1)[-1]
                in_place = {request.task_id for request, _ in ready}
                for request, claims in group:
                    # The claim still waited on says why; a task whose claims are all ready waits for
                    # its gang.
                    message = next((c.reason for c in claims if not _in_place(c)), claims[0].reason)
                    if request.task_id in in_place:
                        message += f"; gang {gang} binds once every member's new layout is applied"
                    unplaced[request.task_id] = Reason(Code.WAITING_FOR_LAYOUT, message)
                continue
            if (spent := self.engine.budget_check(first.tenant)) is not None:
                for request, _ in group:
                    unplaced[request.task_id] = Reason(Outcome.BUDGET_SPENT.value, spent)
                continue
            need = sum(request.gpu_request_milli for request, _ in group)
            need_mem_mib = sum(request.gpu_request_mem_mib for request, _ in group)
            problem, borrowed = self.engine.quota_check(first.tenant, need, need_mem_mib)
            if problem is not None:
                for request, _ in group:
                    unplaced[request.task_id] = Reason(Outcome.QUOTA_EXCEEDED.value, problem)
                continue
            self.engine.usage_milli[first.tenant] += need
            self.engine.usage_mem_mib[first.tenant] += need_mem_mib
            for request, claims in ready:
                bound.append(_claimed_placement(request, claims, borrowed))
        return bound

    # -- 3b. reservation ---------------------------------------------------------------------------

    def _reserve(
        self,
        ordered: Sequence[TaskRequest],
        placements: list[Placement],
        left: dict[str, Unplaced],
        now_s: float,
    ) -> tuple[list[Placement], Reservation | None, dict[str, Reason]]:
        """Reserve for the first large task (or gang) in order that found no room; hold the placements of
        tasks behind it that would delay its predicted start."""
        config = self.config.reserve
        assert config is not None
        head = next(
            (
                t
                for t in ordered
                if t.task_id in left and left[t.task_id].outcome in CAPACITY_OUTCOMES and is_large(t, config)
            ),
            None,
        )
        if head is None:
            return placements, None, {}
        members = [
            t for t in ordered if t is head or (head.gang_id is not None and t.gang_id == head.gang_id)
        ]
        position = {t.task_id: i for i, t in enumerate(ordered)}
        behind = position[head.task_id]
        backfills = [p for p in placements if position.get(p.task_id, -1) > behind]
        placed_now = {p.task_id for p in placements}
        backfill_ids = {p.task_id for p in backfills}
        rooms_now, holders = pool_view(
            self.engine.state, head, lambda task_id: self._end_of(task_id, task_id in placed_now, now_s)
        )
        others = [h for task_id, h in holders.items() if task_id not in backfill_ids]
        rooms = with_holders(rooms_now, [holders[task_id] for task_id in backfill_ids], +1)
        reservation = plan_reservation(members, rooms, others, now_s, config)
        kept = [p for p in placements if p.task_id not in backfill_ids]
        held: dict[str, Reason] = {}
        units: dict[str, list[Placement]] = defaultdict(list)  # a gang is kept or held as a whole
        for p in backfills:
            gang = self.requests[p.task_id].gang_id
            units[gang if gang is not None else p.task_id].append(p)
        when = (
            "until its nodes drain (no expected end frees enough)"
            if reservation.start_s is None
            else f"predicted to start in {(reservation.start_s - now_s) / 60:.0f} min"
        )
        for unit in units.values():
            trial_rooms, trial_others = rooms, list(others)
            for p in unit:
                if delays(reservation, members, trial_rooms, trial_others, holders[p.task_id], now_s, config):
                    break
                trial_rooms = with_holders(trial_rooms, [holders[p.task_id]], -1)
                trial_others.append(holders[p.task_id])
            else:
                rooms, others = trial_rooms, trial_others
                kept += unit
                continue
            for p in unit:
                self.engine.release(p.task_id)
                held[p.task_id] = Reason(
                    Code.HELD_FOR_RESERVATION,
                    f"it would delay {head.task_id}, which holds a reservation on "
                    f"{len(reservation.nodes)} node(s) {when}",
                )
        return kept, reservation, held

    def _end_of(self, task_id: str, placed_now: bool, now_s: float) -> float | None:
        """A bound task's expected end: the snapshot's, else (placed this step) now + its run time."""
        end_s = self.snapshot.expected_end_s.get(task_id)
        if end_s is None and placed_now:
            runtime_s = self.snapshot.expected_runtime_s.get(task_id)
            end_s = None if runtime_s is None else now_s + runtime_s
        return end_s

    # -- 3. present units --------------------------------------------------------------------------

    def _present(
        self,
        ordered: Sequence[TaskRequest],
        now_s: float,
        *,
        preemption: bool = True,
        on_placed: Callable[[list[Placement]], None] | None = None,
    ) -> tuple[list[Placement], dict[str, Unplaced], list[Preemption]]:
        """Placements on present units; the tasks left with the engine's reason; preemption proposals."""
        engine = self.engine
        config = (
            self.engine_config
            if preemption or not self.engine_config.preemption
            else replace(self.engine_config, preemption=False)
        )
        engine.config = config
        whole_first = self.has_mig and any(_whole_any(t) for t in ordered)
        if not whole_first:
            result = engine.solve(tuple(ordered), now_s, on_placed)
            engine.config = self.engine_config
            return list(result.placements), {u.task_id: u for u in result.unplaced}, list(result.preemptions)
        # A whole-GPU task first sees whole GPUs outside MIG mode only (EXCLUSIVE asks exactly that of a
        # request of 1000 milli per GPU), and nobody proposes victims yet: a task that fits on an idle MIG
        # GPU's 7g instance must not displace work first.
        engine.config = replace(config, preemption=False)
        first = engine.solve(
            tuple(replace(t, isolation=Isolation.EXCLUSIVE) if _whole_any(t) else t for t in ordered), now_s
        )
        by_id = {t.task_id: t for t in ordered}
        # Tried again: what lacked capacity, and every whole task whatever its first answer (that answer
        # spoke of GPUs outside MIG mode only).
        retried = [
            u for u in first.unplaced if u.outcome in CAPACITY_OUTCOMES or _whole_any(by_id[u.task_id])
        ]
        again = tuple(by_id[u.task_id] for u in retried)
        # By id: `u not in retried` compared dataclasses pairwise, quadratic in what waits (1.1 s of a
        # 2.3 s decide at 3,000 tasks on a MIG pool).
        tried = {u.task_id for u in retried}
        done = {u.task_id: u for u in first.unplaced if u.task_id not in tried}
        engine.config = config
        second = engine.solve(_whole_gangs(again, list(ordered)), now_s)
        engine.config = self.engine_config
        placements = list(first.placements) + list(second.placements)
        done.update({u.task_id: u for u in second.unplaced})
        return placements, done, list(second.preemptions)

    # -- 4. units ----------------------------------------------------------------------------------

    def _bind_units(
        self, placements: list[Placement], left: dict[str, Unplaced], now_s: float
    ) -> list[Bound]:
        """Every placement on free units (`_bind`); then whole-GPU tasks off MIG GPUs (`_whole_off_mig`),
        and what waits for room tries once more on the instances they left (a gang that wanted one)."""
        taken: set[int] = set()
        bound: list[Bound] = []
        mapped: list[tuple[Placement, GpuKey]] | None = None
        early, self._early = self._early, None
        if early is not None and early.covers(placements):  # mapped already, as the engine placed
            bound, taken, mapped = early.bound, early.taken, early.failed
            self._diverged |= early.diverged
        self._last_try(self._bind(placements, left, now_s, bound, taken, mapped), left, now_s, bound, taken)
        if self._whole_off_mig(bound, taken, now_s):
            again = self._offer_room_again(left, now_s)
            self._last_try(self._bind(again, left, now_s, bound, taken), left, now_s, bound, taken)
        return bound

    def _last_try(
        self, given_up: set[str], left: dict[str, Unplaced], now_s: float, bound: list[Bound], taken: set[int]
    ) -> None:
        """The single tasks `_bind` gave up on (three misses) try once more on what is left. A miss can come
        from a unit another task held in that round and gave back later (a placement of its own that missed
        too), so a task given up may find a free unit now."""
        retry = [
            self.requests[t]
            for t in given_up
            if t in left and left[t].outcome in CAPACITY_OUTCOMES and self.requests[t].gang_id is None
        ]
        if not retry:
            return
        keys = touched_keys(bound) | self._diverged | set(self.snapshot.free_units)
        self._rebuild(dict(self._exact(keys, taken)), [b.placement for b in bound], now_s)
        before = {t.task_id: left[t.task_id] for t in retry}
        for placement, _ in self._map(self._reoffer(retry, left, now_s), bound, taken):
            self.engine.release(placement.task_id)
            left[placement.task_id] = before[placement.task_id]  # it keeps the reason it had

    def _offer_room_again(self, left: dict[str, Unplaced], now_s: float) -> list[Placement]:
        """Offer the tasks left for room once more (a gang with every member left), on the working copy as
        it is now; what finds room leaves `left`, and the rest take the new answer."""
        retry = {t for t, u in left.items() if u.outcome in CAPACITY_OUTCOMES}
        gangs = {self.requests[t].gang_id for t in retry} - {None}
        retry |= {t for t in left if self.requests[t].gang_id in gangs}
        return self._reoffer([self.requests[t] for t in retry], left, now_s)

    def _reoffer(
        self, tasks: Iterable[TaskRequest], left: dict[str, Unplaced], now_s: float
    ) -> list[Placement]:
        """Offer `tasks` again in order, without preemption; what is placed leaves `left`, the rest take the
        new answer (a task that had victims proposed and still finds no room keeps its proposal)."""
        placed, unplaced, _ = self._present(
            sorted(tasks, key=lambda t: t.order_key or 0), now_s, preemption=False
        )
        for placement in placed:
            left.pop(placement.task_id, None)
        for task_id, item in unplaced.items():
            if left[task_id].outcome is not Outcome.WAITING_FOR_PREEMPTION:
                left[task_id] = item
        return placed

    def _bind(
        self,
        placements: list[Placement],
        left: dict[str, Unplaced],
        now_s: float,
        bound: list[Bound],
        taken: set[int],
        mapped: list[tuple[Placement, GpuKey]] | None = None,
    ) -> set[str]:
        """Map every placement onto free units (into `bound`, their ids into `taken`); retry the ones no
        units carry until all are bound. Returns the tasks given up on (three misses). `mapped`: the
        placements' first mapping is done already (into `bound` and `taken`), and these missed.

        A. The tasks whose placement no units carry (and their gang mates) are taken back and tried again
           with those GPUs closed to them, until each is bound or left waiting.
        B. Then every task that found no room before tries again with every GPU as its free units are
           (the exact view); a miss there goes through A. A task that misses a third time is not offered
           again (every round counts at least one miss), so the loop ends. In a round where a gang member
           missed, only gang members' misses count: a single task beside it may have lost a unit to a
           mate of that gang, which goes back now.
        """
        misses: dict[str, int] = defaultdict(int)
        todo = placements
        while True:
            failed = self._map(todo, bound, taken) if mapped is None else mapped
            mapped = None
            closing: set[GpuKey] = set()  # GPUs closed to some task in A: opened again for B
            if not failed:
                # Bound, but perhaps on bigger units than the engine chose (a 1g request on a free 3g): the
                # engine then thinks room is left that is not, or misses room that is. Tasks left for room
                # try again on the exact view while that view differs from the engine's.
                if not todo or not any(u.outcome in CAPACITY_OUTCOMES for u in left.values()):
                    return {t for t, n in misses.items() if n >= 3}
                if not self._diverged or not self._room_missed(self._diverged & touched_keys(bound), taken):
                    return {t for t, n in misses.items() if n >= 3}
            # A. Each task whose placement no units carry (a gang with its mates) alone, with the GPUs
            # where its own placements missed closed to it, until it is bound or left waiting.
            # A single task that missed beside a gang taken back may have missed a unit only that gang's
            # member took: the gang's misses count (so the loop still ends), the single keeps its tries.
            gang_missed = any(self.requests[p.task_id].gang_id is not None for p, _ in failed)
            for placement, _ in failed:
                if not gang_missed or self.requests[placement.task_id].gang_id is not None:
                    misses[placement.task_id] += 1
            released = self._take_back(failed, bound, taken)
            groups: dict[str, list[str]] = defaultdict(list)
            own: dict[str, set[GpuKey]] = defaultdict(set)
            for task_id in released:
                request = self.requests[task_id]
                groups[request.gang_id or task_id].append(task_id)
            for placement, gpu in failed:
                request = self.requests[placement.task_id]
                own[request.gang_id or request.task_id].add(gpu)
            for key, members in groups.items():
                while True:
                    closing |= own[key]
                    # GPUs closed to earlier groups open again, as their free units are: closed only to
                    # them, they stayed closed in the working copy this group inherits.
                    change: dict[GpuKey, GpuState | str] = dict(
                        self._exact(touched_keys(bound) | (closing - own[key]), taken)
                    )
                    change.update(dict.fromkeys(own[key], "close"))
                    self._rebuild(change, [b.placement for b in bound], now_s)
                    again = sorted((self.requests[t] for t in members), key=lambda t: t.order_key or 0)
                    placed, unplaced, _ = self._present(again, now_s, preemption=False)
                    left.update(unplaced)
                    missed = self._map(placed, bound, taken)
                    if not missed:
                        break
                    members = self._take_back(missed, bound, taken)
                    own[key] |= {gpu for _, gpu in missed}
            # B. Closed GPUs open again, as their free units are.
            self._rebuild(
                dict(self._exact(touched_keys(bound) | closing, taken)), [b.placement for b in bound], now_s
            )
            retry = [
                self.requests[t] for t, u in left.items() if u.outcome in CAPACITY_OUTCOMES and misses[t] < 3
            ]
            todo = self._reoffer(retry, left, now_s)

    def _whole_off_mig(self, bound: list[Bound], taken: set[int], now_s: float) -> bool:
        """Move single whole-GPU tasks (isolation any) bound to a MIG GPU onto free whole GPUs outside MIG
        mode, where binding left any: a gang taken back in `_bind` may have held the whole GPUs such a task
        was after when it took the instance. A task tries whole GPUs only; one that finds none keeps its
        instance. A gang member stays where it is: its gang binds whole or not at all. Whether any moved."""
        if not (self.has_mig and self.has_other):
            return False
        views = self.snapshot.gpu_views
        on_mig = [
            b
            for b in bound
            if _whole_any(request := self.requests[b.task_id])
            and request.gang_id is None
            and any(views[(b.placement.node, i)].mode is PartitionMode.MIG for i in b.placement.gpu_indexes)
        ]
        if not on_mig or not self._whole_gpu_free(taken):
            return False
        position = {b.task_id: i for i, b in enumerate(bound)}  # the order stays as it was
        for b in on_mig:
            self.engine.release(b.task_id)
            taken.difference_update(b.unit_ids)
        leaving = {b.task_id for b in on_mig}
        bound[:] = [b for b in bound if b.task_id not in leaving]
        keys = touched_keys(bound) | touched_keys(on_mig)
        self._rebuild(dict(self._exact(keys, taken)), [b.placement for b in bound], now_s)
        engine = self.engine
        engine.config = replace(self.engine_config, preemption=False)
        result = engine.solve(
            tuple(replace(self.requests[b.task_id], isolation=Isolation.EXCLUSIVE) for b in on_mig), now_s
        )
        engine.config = self.engine_config
        failed = self._map(result.placements, bound, taken)
        for placement, _ in failed:
            engine.release(placement.task_id)
        moved = {p.task_id for p in result.placements} - {p.task_id for p, _ in failed}
        stay = [b for b in on_mig if b.task_id not in moved]
        # The rest keep their instances: their units and their quota use come back.
        for b in stay:
            bound.append(b)
            taken.update(b.unit_ids)
            request = self.requests[b.task_id]
            engine.usage_milli[request.tenant] += request.gpu_request_milli
            engine.usage_mem_mib[request.tenant] += request.gpu_request_mem_mib
        if stay:
            self._rebuild(dict(self._exact(touched_keys(bound), taken)), [b.placement for b in bound], now_s)
        bound.sort(key=lambda b: position[b.task_id])
        return bool(moved)

    def _whole_gpu_free(self, taken: set[int]) -> bool:
        """Whether some GPU outside MIG mode has a whole GPU's worth of free units nobody took."""
        views = self.snapshot.gpu_views
        return any(
            views[key].mode is not PartitionMode.MIG
            and sum(u.gpu_milli for u in units if u.unit_id not in taken) >= WHOLE_GPU_MILLI
            for key, units in self.snapshot.free_units.items()
        )

    def _map(
        self,
        todo: Iterable[Placement],
        bound: list[Bound],
        taken: set[int],
        diverged: set[GpuKey] | None = None,
    ) -> list[tuple[Placement, GpuKey]]:
        """Bind what free units carry (appended to `bound`); the rest with the GPU that could not. GPUs
        whose units now differ from the engine's picture go to `diverged` (default: the step's)."""
        failed: list[tuple[Placement, GpuKey]] = []
        diverged = self._diverged if diverged is None else diverged
        requests = self.requests
        free_units = self.snapshot.free_units
        bindings = self.engine.state.bindings
        for placement in todo:
            mapped = map_placement(placement, Need.of(requests[placement.task_id]), free_units, taken)
            if not isinstance(mapped, Mapped):
                failed.append((placement, mapped))
                continue
            bound.append(Bound(placement, mapped.unit_ids))
            # Units that hold more (or other slices) than the engine took leave its picture wrong there.
            if mapped.gpu_milli != sum(bindings[placement.task_id].held_milli) or (
                placement.unit.kind is UnitKind.MIG
            ):
                diverged.update((placement.node, i) for i in placement.gpu_indexes)
        return failed

    def _take_back(
        self, failed: list[tuple[Placement, GpuKey]], bound: list[Bound], taken: set[int]
    ) -> list[str]:
        """Release failed placements and, a gang going whole or not at all, their bound gang mates."""
        gangs = {self.requests[p.task_id].gang_id for p, _ in failed} - {None}
        back = [b for b in bound if self.requests[b.task_id].gang_id in gangs]
        for b in back:
            taken.difference_update(b.unit_ids)
        bound[:] = [b for b in bound if self.requests[b.task_id].gang_id not in gangs]
        released = [p.task_id for p, _ in failed] + [b.task_id for b in back]
        for task_id in released:
            self.engine.release(task_id)
        return released

    def _engine_gpu(self, key: GpuKey) -> GpuState:
        """One GPU of the working copy, read without building the node."""
        state = self.engine.state
        n = state.index[key[0]]
        d = state.gpu_index[n].index(key[1])
        return GpuState(
            key[1],
            state.models[n] or "",
            state.gpu_free[n][d],
            state.gpu_mem_free[n][d],
            state.gpu_mem_total[n][d],
            state.modes[n][d],
            state.mig_used[n][d],
            state.mig_free[n][d],
            *(state.share_size[n][d] or (0, 0)),
        )

    def _exact(self, keys: set[GpuKey], taken: set[int]) -> dict[GpuKey, GpuState]:
        """These GPUs as the engine should see them: their free units, less those bound this step."""
        out: dict[GpuKey, GpuState] = {}
        for key in keys:
            free = [u for u in self.snapshot.free_units.get(key, ()) if u.unit_id not in taken]
            out[key] = engine_gpu(self._engine_gpu(key), free)
        return out

    def _room_missed(self, keys: set[GpuKey], taken: set[int]) -> bool:
        """Whether the units left on these GPUs offer room the engine's picture does not show (more milli,
        more memory on a GPU with milli left, or MIG slices it counts as used). Room it shows and the
        units lack does no harm now: nothing more is placed on present units after step 4."""
        for key, exact in self._exact(keys, taken).items():
            seen = self._engine_gpu(key)
            if exact.free_milli > seen.free_milli:
                return True
            if exact.free_milli and exact.free_mem_mib > seen.free_mem_mib:
                return True
            if seen.mig_used_slices & ~exact.mig_used_slices:
                return True
            if set(exact.mig_free_instances or ()) - set(seen.mig_free_instances or ()):
                return True
        return False

    def _rebuild(
        self, change: dict[GpuKey, GpuState | str], placed: Iterable[Placement], now_s: float
    ) -> None:
        """A new engine on the working copy with some GPUs opened or closed; quota use carried over."""
        base = self.snapshot.cluster
        placed = [*self.live.values(), *placed]
        running = base.running + tuple(_as_running(p, self.requests[p.task_id], now_s) for p in placed)
        nodes = with_gpus(self.engine.state.nodes(), change)
        engine = Engine(replace(base, nodes=nodes, pending=(), running=running), self.engine_config)
        engine.usage_milli = defaultdict(int, self.engine.usage_milli)
        engine.usage_mem_mib = defaultdict(int, self.engine.usage_mem_mib)
        engine.held, engine.decision_spans_solves = self.engine.held, True
        self.engine = engine

    # -- 5. re-carve -------------------------------------------------------------------------------

    def _recarve(
        self,
        bound: list[Bound],
        left: dict[str, Unplaced],
        requests: dict[str, TaskRequest],
        now_s: float,
    ) -> list[LayoutPlan]:
        snapshot = self.snapshot
        if not snapshot.idle_mig:
            return []  # nothing to re-carve (every trace replay step, most production cycles)
        touched = {(b.placement.node, i) for b in bound for i in b.placement.gpu_indexes}
        opened = [key for key in snapshot.idle_mig if key not in touched]
        candidates = [
            requests[t]
            for t, u in left.items()
            if u.outcome in CAPACITY_OUTCOMES and can_use_mig(requests[t])
        ]
        ids = {t.task_id for t in candidates}
        gangs_out = {t.gang_id for t in requests.values() if t.gang_id is not None and t.task_id not in ids}
        candidates = [t for t in candidates if t.gang_id is None or t.gang_id not in gangs_out]
        if not opened or not candidates:
            return []
        # Only the opened GPUs: present units had their turn in steps 3 and 4, so a placement here is a
        # re-carve and nothing else.
        change: dict[GpuKey, GpuState | str] = {}
        for node in self.engine.state.nodes():
            for g in node.gpus:
                self._before_recarve[(node.name, g.index)] = g
                change[(node.name, g.index)] = "close"
        change.update(dict.fromkeys(opened, "open"))
        self._rebuild(change, [b.placement for b in bound], now_s)
        self.engine.config = replace(self.engine_config, preemption=False)
        plans: list[LayoutPlan] = []
        refused: dict[str, str] = {}  # task → why no new layout is planned for it
        rest = candidates
        for _ in range(RECARVE_ROUNDS):
            planned, refused_now = self._recarve_round(rest, {plan.gpu for plan in plans}, requests, now_s)
            plans += planned
            refused.update(refused_now)
            if not refused_now:
                break
            # The GPUs a refused task took in the engine are open again for the tasks it kept out.
            for task_id in refused_now:
                if task_id in self.engine.records:
                    self.engine.release(task_id)
            done = {t for plan in planned for t, _ in plan.plan.for_tasks} | set(refused)
            rest = [t for t in rest if t.task_id not in done]
        self.engine.config = self.engine_config
        for task_id, why in refused.items():
            left[task_id] = Unplaced(task_id, Outcome.NO_CAPACITY, why)
            self._needs_layout.add(task_id)
        return plans

    def _recarve_round(
        self,
        candidates: Sequence[TaskRequest],
        planned: set[GpuKey],
        requests: Mapping[str, TaskRequest],
        now_s: float,
    ) -> tuple[list[LayoutPlan], dict[str, str]]:
        """One solve over the opened GPUs: the new layouts, and the tasks refused one (with why). A GPU
        planned in an earlier round keeps its plan: what the engine adds there now waits for a later
        cycle (its task stays left, with its own reason)."""
        snapshot = self.snapshot
        result = self.engine.solve(tuple(candidates), now_s)
        wanted: dict[GpuKey, list[Placement]] = defaultdict(list)
        refused: dict[str, str] = {}
        # A gang goes whole here too: one member on a planned GPU takes its mates off with it.
        late = {
            requests[p.task_id].gang_id or p.task_id
            for p in result.placements
            if planned.intersection((p.node, i) for i in p.gpu_indexes)
        }
        for placement in result.placements:
            keys = [(placement.node, i) for i in placement.gpu_indexes]
            if (requests[placement.task_id].gang_id or placement.task_id) in late:
                self.engine.release(placement.task_id)
                continue
            if placement.unit.kind is UnitKind.MIG and all(k in snapshot.gpu_views for k in keys):
                for key in keys:
                    wanted[key].append(placement)
                continue
            refused[placement.task_id] = (
                f"only a new MIG layout on {placement.node} GPU "
                f"{','.join(map(str, placement.gpu_indexes))} would hold it, and none can be planned there"
            )
        return self._plans(wanted, refused, requests), refused

    def _plans(
        self,
        wanted: dict[GpuKey, list[Placement]],
        refused: dict[str, str],
        requests: Mapping[str, TaskRequest],
    ) -> list[LayoutPlan]:
        """A new layout for each GPU from the instances the engine put there. A task on several GPUs and
        a gang go whole: when one GPU cannot be carved so, the task comes off its other GPUs too, and a
        gang member's mates come off theirs; those GPUs are planned again for what is left on them. Each
        round takes at least one task off, so it ends."""
        snapshot = self.snapshot
        plans: dict[GpuKey, RepartitionPlan] = {}
        todo = set(wanted)
        while todo:
            # In the engine's order, not the set's (which changes with the process's string hashing).
            for key in [k for k in wanted if k in todo]:
                placements = wanted[key]
                plans.pop(key, None)
                if not placements:
                    continue
                plan = plan_repartition(
                    snapshot.gpu_views[key],
                    [
                        # A task on several GPUs has one start in its placement, not one per GPU: the
                        # planner chooses each GPU's.
                        WantedInstance(
                            p.task_id,
                            p.unit.mig_profile or "",
                            p.unit.mig_start_slice if len(p.gpu_indexes) == 1 else None,
                        )
                        for p in placements
                    ],
                )
                if isinstance(plan, RepartitionPlan):
                    plans[key] = plan
                    continue
                for p in placements:
                    refused[p.task_id] = (
                        f"only a new layout on {snapshot.gpu_views[key].name} ({p.unit.mig_profile}) would "
                        f"hold it, and the GPU cannot be re-carved: {plan.reason}"
                    )
            out = {requests[t].gang_id: t for t in refused if requests[t].gang_id is not None}
            todo = set()
            for key, placements in wanted.items():
                keep = [
                    p
                    for p in placements
                    if p.task_id not in refused and requests[p.task_id].gang_id not in out
                ]
                if len(keep) == len(placements):
                    continue
                for p in placements:
                    mate = out.get(requests[p.task_id].gang_id)
                    if p.task_id not in refused and mate is not None:
                        refused[p.task_id] = (
                            f"only a new layout on {snapshot.gpu_views[key].name} would hold it, and its "
                            f"gang binds whole: member {mate} gets none ({refused[mate]})"
                        )[:500]
                wanted[key] = keep
                todo.add(key)
        return [LayoutPlan(key, plans[key]) for key in wanted if key in plans]

    # -- 5b. pre-carve -----------------------------------------------------------------------------

    def _precarve(
        self, bound: list[Bound], layouts: list[LayoutPlan], preemptions: Sequence[Preemption]
    ) -> tuple[Precarve, ...]:
        """Idle MIG GPUs re-carved for the forecast; every GPU this decision uses is left alone."""
        config = self.config.precarve
        snapshot = self.snapshot
        if config is None or snapshot.forecast is None or not snapshot.idle_mig:
            return ()
        touched = touched_keys(bound) | {plan.gpu for plan in layouts}
        touched |= {(p.node, i) for p in preemptions for i in self._victim_gpus(p.victim_task_id)}
        taken = {u for b in bound for u in b.unit_ids}
        free_mig: list[int] = []
        free_whole = 0
        for key, units in snapshot.free_units.items():
            if key in snapshot.idle_mig or key in touched:
                continue
            free_mig += [u.gpu_milli for u in units if u.kind == "mig" and u.unit_id not in taken]
            free_whole += sum(1 for u in units if u.kind == "whole" and u.unit_id not in taken)
        return precarve(
            idle=snapshot.idle_mig,
            views=snapshot.gpu_views,
            touched=touched,
            free_mig_milli=free_mig,
            free_whole_gpus=free_whole,
            forecast=snapshot.forecast,
            config=config,
        )

    def _victim_gpus(self, task_id: str) -> tuple[int, ...]:
        running = next((t for t in self.snapshot.cluster.running if t.task_id == task_id), None)
        return () if running is None else running.gpu_indexes

    def _nodes_after(self, bound: list[Bound], layouts: list[LayoutPlan]) -> tuple[NodeState, ...]:
        """The pool after this step: GPUs the re-carve pass closed as they were, re-carved GPUs taken, idle
        MIG GPUs nothing landed on open."""
        idle_mig = self.snapshot.idle_mig
        change: dict[GpuKey, GpuState | str] = {
            k: g for k, g in self._before_recarve.items() if k not in idle_mig
        }
        # What this step touched matters only to idle MIG GPUs: without any, its thousands of placements
        # are not walked.
        if idle_mig:
            touched = touched_keys(bound) | {plan.gpu for plan in layouts}
            change.update({k: "open" for k in idle_mig if k not in touched})
        return with_gpus(self.engine.state.nodes(), change)


def nodes_before(snapshot: Snapshot) -> tuple[NodeState, ...]:
    """The pool as `Decisions.nodes_after` pictures it, before anything is placed: idle MIG GPUs open (a
    re-carve may give them any layout). Fragmentation before and after a decision is measured on this
    one picture; with idle MIG GPUs as carved before and open after, a decision that placed nothing
    showed fragmentation falling (7.31 % -> 1.78 % on a demo pool's what-if)."""
    return with_gpus(snapshot.cluster.nodes, {k: "open" for k in snapshot.idle_mig})


def touched_keys(bound: Iterable[Bound]) -> set[GpuKey]:
    return {(b.placement.node, i) for b in bound for i in b.placement.gpu_indexes}


def _with_order_key(task: TaskRequest, order_key: int) -> TaskRequest:
    """`replace(task, order_key=order_key)`, without its cost: `dataclasses.replace` rebuilds the request
    field by field through `__init__` (TaskRequest has no `__post_init__` to run again), which made a
    tenth of a replay step's own time and a fifth of a second of a 10,000-task cycle."""
    if task.order_key == order_key:
        return task
    # The copy takes a copy of the task's dict, key changed, in one step (copying a dict whole is cheaper
    # than filling an empty one field by field); it stays frozen.
    fields = task.__dict__.copy()
    fields["order_key"] = order_key
    copy = object.__new__(TaskRequest)
    object.__setattr__(copy, "__dict__", fields)
    return copy


def _whole_any(task: TaskRequest) -> bool:
    return task.num_gpu > 0 and task.gpu_milli >= WHOLE_GPU_MILLI and task.isolation is Isolation.ANY


def _whole_gangs(tasks: tuple[TaskRequest, ...], ordered: list[TaskRequest]) -> tuple[TaskRequest, ...]:
    """`tasks`, with every gang either complete (as ordered) or absent."""
    gangs = {t.gang_id for t in tasks if t.gang_id is not None}
    singles = [t for t in tasks if t.gang_id is None]
    members = [t for t in ordered if t.gang_id in gangs]
    return tuple(sorted(singles + members, key=lambda t: t.order_key or 0))


def _as_running(placement: Placement, request: TaskRequest, now_s: float) -> RunningTask:
    return RunningTask(
        task_id=placement.task_id,
        node=placement.node,
        gpu_indexes=placement.gpu_indexes,
        gpu_milli=placement.unit.gpu_milli,
        cpu_milli=request.cpu_milli,
        mem_mib=request.mem_mib,
        gpu_mem_mib=request.gpu_mem_mib,
        priority=request.priority,
        tenant=request.tenant,
        preemptible=request.preemptible,
        started_at_s=now_s,
        borrowed=placement.borrowed,
        mig_profile=placement.unit.mig_profile if placement.unit.kind is UnitKind.MIG else None,
        mig_start_slice=placement.unit.mig_start_slice if placement.unit.kind is UnitKind.MIG else None,
        sla_online=request.sla_online,
    )


def repartition_sentence(parts: Sequence[tuple[str, str, MigSlot, int | None]]) -> str:
    """Why a task waits for new layouts. `parts`: each GPU re-carved for it as (GPU name, the new layout,
    the task's instance there, the node's desired-state generation that carries it, once written)."""

    def one(name: str, text: str, slot: MigSlot, generation: int | None) -> str:
        carried = f" (generation {generation})" if generation is not None else ""
        return (
            f"{name} is being repartitioned to {text}{carried} for it ({slot.mig_profile} at slice "
            f"{slot.mig_start})"
        )

    if len(parts) == 1:
        return f"{one(*parts[0])}; it binds once the agent reports the layout applied"
    said = "; ".join(one(*part) for part in parts)
    return f"{said}; it binds once every layout is reported applied"[:500]


def _in_place(claim: Claim) -> bool:
    """The claim's new instance is there to bind (the agent reported the layout)."""
    return claim.action is ClaimAction.BIND and claim.slot is not None and claim.unit_id is not None


def _claimed_placement(request: TaskRequest, claims: tuple[Claim, ...], borrowed: bool) -> Bound:
    """A task on the instances its claims planned, one per GPU, in GPU order (all on one node)."""
    ordered = sorted(claims, key=lambda c: c.gpu_index)
    first = ordered[0]
    profile, start = (first.slot.mig_profile, first.slot.mig_start) if first.slot else (None, None)
    unit = ComputeUnit(UnitKind.MIG, first.gpu_milli, profile, start)
    indexes = tuple(c.gpu_index for c in ordered)
    placement = Placement(request.task_id, first.node, indexes, unit, borrowed)
    return Bound(placement, tuple(c.unit_id for c in ordered if c.unit_id is not None))
