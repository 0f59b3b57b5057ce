"""`solve_cycle`: one scheduling pass from an immutable snapshot to placements, preemptions and reasons.

The production cycle builds an `Engine` from the snapshot a selector reads and calls `solve` once.
The replay and the benchmarks keep one `Engine` alive and call `solve` once per arriving task: after a
cycle commits, the engine's working copy is exactly the snapshot the next cycle would read, so this is
the same code path without rebuilding 1,000 nodes per task.

Speed: a node's best move for a request only changes when something lands on (or leaves) that node.
Scores are cached per (request, node) and recomputed for the nodes whose version moved since; selection
is one numpy argmax over the cached scores (the first maximum is the first node in snapshot order).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from whalegen.placement.fragmentation import shape_mix_from_tasks
from whalegen.placement.policies import NEG_INF, Policy, ScoreCache
from whalegen.placement.registry import make_policy
from whalegen.placement.state import Binding, ClusterState, Request
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    CycleResult,
    Isolation,
    Outcome,
    Placement,
    Preemption,
    Quota,
    SlaRefusal,
    SlaRemedy,
    TaskRequest,
    Unplaced,
)
from whalegen.placement.words import quota_mem_wait_text, quota_wait_text

# Class scores kept over all requests (8 bytes each); dropped when exceeded so a long-lived engine stays
# bounded (about the memory the earlier dict memo of a million entries took).
MEMO_LIMIT = 16_000_000
# A score cache reads the change log when it names at most 1/LOG_READ_FRACTION of the nodes (a Python
# pass over that many entries costs about one numpy sweep of all versions).
LOG_READ_FRACTION = 16


@dataclass(frozen=True)
class EngineConfig:
    policy: str = "whalegen"
    seed: int = 0  # drives the policies that draw at random (`random`); the rest are deterministic
    preemption: bool = True  # propose victims for tasks that cannot place
    # Idle GPU milli the pool keeps for online-SLA tasks (`TaskRequest.sla_online`): a batch task is not
    # placed if afterwards less than this would be idle on schedulable nodes. 0 = no reserve. An online
    # task asking no more than the reserve that finds no room may displace preemptible batch work of its
    # own priority or below (`_victim_candidates`): the reserve is honoured, not only kept.
    online_reserve_milli: int = 0
    # How the reserve was sized, for the reasons ("1.5 GPUs forecast for online arrivals (…)"); "" = static.
    online_reserve_why: str = ""


@dataclass
class _Record:
    """What preemption and quotas need to know about a task bound in the working copy."""

    task_id: str
    tenant: str
    priority: int
    preemptible: bool
    started_at_s: float
    borrowed: bool
    request_milli: int
    online: bool = False  # an online-SLA task (never displaced to honour the online reserve)
    request_mem_mib: int = 0  # what it counts against a quota's GPU-memory bound


class Engine:
    def __init__(self, snapshot: ClusterSnapshot, config: EngineConfig) -> None:
        self.config = config
        self.policy: Policy = make_policy(config.policy)
        self.state = ClusterState.from_snapshot(snapshot, whole_gpus_only=self.policy.whole_gpus_only)
        # Without a forecast mix, the tasks the snapshot knows of (pending and running) stand in for it.
        mix = snapshot.shape_mix
        if mix is None:
            known = list(snapshot.pending) + [
                TaskRequest(t.task_id, t.cpu_milli, t.mem_mib, len(t.gpu_indexes), t.gpu_milli)
                for t in snapshot.running
            ]
            mix = shape_mix_from_tasks(known)
        self.rng = random.Random(config.seed)
        self.policy.attach(self.state, mix, self.rng)
        self.caches: dict[Request, ScoreCache] = {}
        self.allowed: dict[Request, npt.NDArray[np.bool_]] = {}
        # Per request that found no place: the working copy's release count then (see `choose`).
        self.failed_at: dict[Request, int] = {}
        # Per request, the last explanation and the working copy's change count it was counted at.
        self.explained: dict[Request, tuple[int, tuple[Outcome, str]]] = {}
        # Nodes in the same state score a request the same way (for policies whose score reads only the
        # node), so each request's cache keeps a score per node state class (`ScoreCache.class_scores`):
        # identical nodes are common in real fleets, and a filling cluster keeps revisiting the same
        # states. Their total size is bounded by MEMO_LIMIT.
        self.memo_entries = 0
        self.quotas: dict[str, Quota] = {q.tenant: q for q in snapshot.quotas}
        self.usage_milli: dict[str, int] = defaultdict(int)
        self.usage_mem_mib: dict[str, int] = defaultdict(int)
        self.records: dict[str, _Record] = {}
        # Only preemptible or borrowing tasks can ever be victims; keeping them apart keeps a failure cheap.
        self.victim_pool: dict[str, _Record] = {}
        # Node name → the task victims were proposed for there, in the decision under way (`hold`). Until
        # the victims stop, what is idle on that node is part of the room the preemptor was promised:
        # another task placed there would leave it short at the next cycle, which would stop more work
        # for it, and so on (issue #41's ping-pong). Each `solve` is a decision of its own and starts with
        # none, unless `decision_spans_solves` (a `Decider` solves several times per decision and clears
        # it when a decision begins).
        self.held: dict[str, str] = {}
        self.decision_spans_solves = False
        self.choosing: str | None = None  # the task `choose` is asked for (its own held node stays open)
        for task in snapshot.running:
            self.policy.know_running(task)
            # As asked, like a placement made here (below): one measure for quota use, whichever unit.
            milli = task.quota_milli
            self.usage_milli[task.tenant] += milli
            self.usage_mem_mib[task.tenant] += task.quota_mem_mib
            self._remember(
                _Record(
                    task.task_id,
                    task.tenant,
                    task.priority,
                    task.preemptible,
                    task.started_at_s,
                    task.borrowed,
                    milli,
                    task.sla_online,
                    task.quota_mem_mib,
                )
            )

    # -- selection ---------------------------------------------------------------------------------

    def _cache_for(self, req: Request) -> ScoreCache:
        state = self.state
        cache = self.caches.get(req)
        if cache is None:
            cache = ScoreCache(len(state))
            self.caches[req] = cache
            self.allowed[req] = state.allowed_mask(req)
        # 1. Only nodes that changed since this request was last scored need a look. When few changes
        #    happened since, the state's change log names them (ascending, as a sweep would); otherwise
        #    one sweep compares every node's version. Both give the same nodes.
        log = state.change_log
        start = cache.log_position - state.log_start
        cache.log_position = state.log_start + len(log)
        if start >= 0 and (len(log) - start) * LOG_READ_FRACTION <= len(state):
            if start == len(log):
                return cache
            stale = np.array(sorted(set(log[start:])), np.int64)
        else:
            stale = np.flatnonzero(cache.versions != state.version)
            if len(stale) == 0:
                return cache
        cache.versions[stale] = state.version[stale]
        # 2. A numpy pre-filter drops nodes that surely cannot host the request (model, CPU, memory and,
        #    for shared-mode nodes, free milli); most stale nodes late in a run are full ones.
        possible = (
            self.allowed[req][stale]
            & (state.np_cpu_free[stale] >= req.cpu_milli)
            & (state.np_mem_free[stale] >= req.mem_mib)
        )
        if req.num_gpu:
            threshold = self.policy.device_threshold(req)
            devices_ok = state.has_devices(stale, req.num_gpu, threshold)
            possible &= devices_ok | ~state.np_plain[stale]
        cache.scores[stale[~possible]] = NEG_INF
        stale = stale[possible]
        # 3. Score the rest. A node-pure policy scores each distinct node state once (one node stands
        #    for its class, through the request's memo kept across cycles) and numpy spreads the score.
        score_nodes = self.policy.score_nodes
        if not self.policy.node_pure:
            devices_of = cache.devices
            scored: list[float] = []
            order = stale.tolist()
            for n, (value, devices) in zip(order, score_nodes(order, req), strict=True):
                scored.append(value)
                devices_of[n] = devices
            cache.scores[stale] = scored
            return cache
        # 4. Classes this request has met before are one gather; only new ones are scored, each once.
        classes = state.class_id[stale]
        known = cache.class_scores
        if len(known) < state.class_count:
            grown = np.full(state.class_count + max(1024, state.class_count // 4), np.nan)
            grown[: len(known)] = known
            self.memo_entries += len(grown) - len(known)
            known = cache.class_scores = grown
            if self.memo_entries > MEMO_LIMIT:
                # Scores are a pure function of the class: forgetting them changes no decision.
                self._forget_memos(keep=cache)
        values = known[classes]
        missing = np.flatnonzero(np.isnan(values))
        if len(missing):
            # One node per new class (its first stale one) is scored; the scores go back in one store.
            first: dict[int, int] = {}
            for cls, n in zip(classes[missing].tolist(), stale[missing].tolist(), strict=True):
                first.setdefault(cls, n)
            choices = score_nodes(list(first.values()), req)
            class_devices = cache.class_devices
            for cls, (_, devices) in zip(first, choices, strict=True):
                class_devices[cls] = devices
            known[list(first)] = [value for value, _ in choices]
            values = known[classes]
        cache.scores[stale] = values
        cache.classes[stale] = classes
        return cache

    def _forget_memos(self, keep: ScoreCache) -> None:
        """Drop every request's class memo but `keep`'s; their nodes are rescored when next asked."""
        for req, other in list(self.caches.items()):
            if other is not keep:
                del self.caches[req]
        self.memo_entries = len(keep.class_scores)

    def choose(self, req: Request) -> tuple[int, tuple[int, ...]] | None:
        """The node (position) and devices the policy picks for `req`, or None when nothing fits.

        A policy answers None only when no node and device can take the request, and binding only takes
        CPU, memory, GPU milli and MIG slices away: a request that found nothing finds nothing again
        until something is released. A saturated pool sees the same requests fail over and over
        (docs/notes/placement-speed.md), so they are answered without scoring a node.
        """
        releases = self.state.releases
        aware = self.policy.task_aware  # its "no" is for one task, not for every equal request
        if not aware and self.failed_at.get(req) == releases:
            return None
        pick = self.policy.select(req, lambda: self._cache_for(req))
        if pick is not None and self.held.get(self.state.names[pick[0]], self.choosing) != self.choosing:
            # The policy's choice is a node held for a preemptor: its best node that is not held instead
            # (a "no" here is not remembered in `failed_at`, since the hold ends without a release).
            return self._unheld_pick(req)
        if pick is None and not aware:
            self.failed_at[req] = releases
        return pick

    def _unheld_pick(self, req: Request) -> tuple[int, tuple[int, ...]] | None:
        """The highest-scored node for `req` outside the nodes held for preemptors, or None."""
        cache = self._cache_for(req)
        scores = cache.scores.copy()
        held = [self.state.index[name] for name, task_id in self.held.items() if task_id != self.choosing]
        scores[held] = NEG_INF
        n = int(np.argmax(scores))
        if scores[n] == NEG_INF:
            return None
        return n, cache.devices_of(n)

    def hold(self, node: str, task_id: str) -> None:
        """Keep `node` for `task_id` for the rest of this decision: victims were proposed for it there."""
        self.held[node] = task_id

    # -- the cycle ---------------------------------------------------------------------------------

    def solve(
        self,
        pending: tuple[TaskRequest, ...],
        now: float,
        on_placed: Callable[[list[Placement]], None] | None = None,
    ) -> CycleResult:
        """Place what fits, in priority order, and commit it to the working copy.

        `on_placed`, when given, hears each unit's placements as they are committed (a gang's at once):
        they stay in this result, so a caller may start on them while the rest is placed (the production
        cycle sends their task moves to the database meanwhile).

        Steps: 1. order tasks: the caller's `order_key` first where given (lowest first), then priority,
        then submission time; gangs go as one unit at the position of their first member. 2. For each
        unit: gang completeness, quota (guarantee, then borrow limit), then the online reserve for batch
        work. 3. Place members one by one; a gang that cannot place every member, or a batch unit that
        would end below the online reserve, is undone. 4. For each task left over, an explanation and,
        where allowed, a preemption proposal.
        """
        placements: list[Placement] = []
        unplaced: list[Unplaced] = []
        preemptions: list[Preemption] = []
        claimed: set[str] = set()
        if not self.decision_spans_solves:
            self.held = {}
        # 1. Order.
        for unit in _units_in_order(pending):
            # 2. Gang completeness, budget, quota and the online reserve.
            need_milli = sum(t.num_gpu * t.gpu_milli for t in unit)
            batch = not all(t.sla_online for t in unit)
            refused, borrowed = self._admit(unit, need_milli, batch)
            if refused:
                unplaced += refused
                continue
            # 3. Place every member or none.
            bound, failed = self._bind_all(unit, now)
            if failed is None and batch and self.state.free_milli_total < self.config.online_reserve_milli:
                # Whole-mode GPUs and MIG profiles can hold more than was asked: check what was taken.
                self._unbind(bound)
                problem = self._reserve_message(unit, need_milli)
                unplaced += [Unplaced(t.task_id, Outcome.ONLINE_RESERVE, problem) for t in unit]
                continue
            if failed is None:
                made = [self._commit(task, binding, borrowed, now) for task, binding in bound]
                placements += made
                if on_placed is not None:
                    on_placed(made)
                continue
            self._unbind(bound)
            # 4. Explain, and propose preemption for single tasks.
            left, victims = self._left_over(unit, failed, now, claimed)
            unplaced += left
            preemptions += victims
        return CycleResult(tuple(placements), tuple(preemptions), tuple(unplaced))

    def _admit(self, unit: list[TaskRequest], need_milli: int, batch: bool) -> tuple[list[Unplaced], bool]:
        """Why the unit is not tried at all (one entry per member; empty when it is tried), and whether
        it would borrow above its tenant's guarantee."""
        head = unit[0]
        if head.gang_id is not None and len(unit) < head.gang_size:
            message = f"gang {head.gang_id} has {len(unit)} of {head.gang_size} members pending"
            return [Unplaced(t.task_id, Outcome.GANG_INCOMPLETE, message) for t in unit], False
        spent = self.budget_check(head.tenant)
        if spent is not None:
            return [Unplaced(t.task_id, Outcome.BUDGET_SPENT, spent) for t in unit], False
        need_mem_mib = sum(t.gpu_request_mem_mib for t in unit)
        quota_problem, borrowed = self.quota_check(head.tenant, need_milli, need_mem_mib)
        if quota_problem is not None:
            return [Unplaced(t.task_id, Outcome.QUOTA_EXCEEDED, quota_problem) for t in unit], False
        reserve_problem = self._reserve_check(unit, need_milli) if batch else None
        if reserve_problem is not None:
            return [Unplaced(t.task_id, Outcome.ONLINE_RESERVE, reserve_problem) for t in unit], False
        return [], borrowed

    def _bind_all(
        self, unit: list[TaskRequest], now: float
    ) -> tuple[list[tuple[TaskRequest, Binding]], TaskRequest | None]:
        """Bind the members one by one on the working copy, up to the first that finds no place: the
        bindings made, and that member (None when all are bound)."""
        bound: list[tuple[TaskRequest, Binding]] = []
        for task in unit:
            req = Request.of(task)
            self.policy.begin_task(task, now)
            self.choosing = task.task_id
            pick = self.choose(req)
            self.choosing = None
            if pick is None:
                return bound, task
            bound.append((task, self.state.bind(task.task_id, pick[0], pick[1], req)))
        return bound, None

    def _unbind(self, bound: list[tuple[TaskRequest, Binding]]) -> None:
        for _, binding in reversed(bound):
            self.state.release(binding.task_id)

    def _left_over(
        self, unit: list[TaskRequest], failed: TaskRequest, now: float, claimed: set[str]
    ) -> tuple[list[Unplaced], list[Preemption]]:
        """Why each member of a unit that could not be placed is left, and the preemptions proposed for a
        single task. A co-location the policy refused for an SLA is not a shortage: victims by resources
        would free a unit it refuses again, so only the batch neighbours whose leaving honours the SLA
        are proposed (`_propose_for_sla`)."""
        victims: list[Preemption] = []
        refusal = self.policy.sla_refusal(failed.task_id)
        if refusal is not None:
            outcome, message = Outcome.SLA_REFUSED, refusal.message
        else:
            outcome, message = self.explain(Request.of(failed))
        if len(unit) == 1 and self.config.preemption and outcome in _PREEMPTS_FOR:
            victims, message = self._victims_for(failed, refusal, message, now, claimed)
            if victims:
                outcome = Outcome.WAITING_FOR_PREEMPTION
        left: list[Unplaced] = []
        for task in unit:
            if task is failed:
                left.append(Unplaced(task.task_id, outcome, message))
            else:
                why = f"gang {task.gang_id}: member {failed.task_id} cannot be placed ({message})"
                left.append(Unplaced(task.task_id, Outcome.GANG_UNPLACEABLE, why))
        return left, victims

    def _commit(self, task: TaskRequest, binding: Binding, borrowed: bool, now: float) -> Placement:
        milli = task.num_gpu * task.gpu_milli
        self.usage_milli[task.tenant] += milli
        self.usage_mem_mib[task.tenant] += task.gpu_request_mem_mib
        self._remember(
            _Record(
                task.task_id,
                task.tenant,
                task.priority,
                task.preemptible,
                now,
                borrowed,
                milli,
                online=task.sla_online,
                request_mem_mib=task.gpu_request_mem_mib,
            )
        )
        s = self.state
        indexes = tuple(s.gpu_index[binding.node][d] for d in binding.gpu_indexes)
        return Placement(task.task_id, s.names[binding.node], indexes, binding.unit, borrowed)

    def _remember(self, record: _Record) -> None:
        self.records[record.task_id] = record
        if record.preemptible or record.borrowed:
            self.victim_pool[record.task_id] = record

    def release(self, task_id: str) -> None:
        """A task finished or was preempted: give its resources back."""
        record = self.records.pop(task_id)
        self.victim_pool.pop(task_id, None)
        self.usage_milli[record.tenant] -= record.request_milli
        self.usage_mem_mib[record.tenant] -= record.request_mem_mib
        self.state.release(task_id)

    def budget_check(self, tenant: str) -> str | None:
        """Why nothing new of `tenant` is admitted: its GPU-hour budget is spent (running work goes on)."""
        quota = self.quotas.get(tenant)
        if quota is None or quota.budget_spent is None:
            return None
        return quota.budget_spent.message(tenant)

    def quota_check(self, tenant: str, need_milli: int, need_mem_mib: int = 0) -> tuple[str | None, bool]:
        """Why `tenant`'s quota holds back work asking `need_milli` (and `need_mem_mib` of GPU memory), or
        None; and whether admitting it borrows above the guarantee."""
        quota = self.quotas.get(tenant)
        if quota is None:
            return None, False
        used = self.usage_milli[tenant]
        limit = quota.guaranteed_milli + quota.borrow_limit_milli
        if used + need_milli > limit:
            return (
                quota_wait_text(
                    tenant=tenant,
                    held_milli=used,
                    asked_milli=need_milli,
                    guaranteed_milli=quota.guaranteed_milli,
                    borrow_milli=quota.borrow_limit_milli,
                ),
                False,
            )
        bound = quota.gpu_mem_limit_mib
        if bound is not None and self.usage_mem_mib[tenant] + need_mem_mib > bound:
            held = self.usage_mem_mib[tenant]
            return (
                quota_mem_wait_text(
                    tenant=tenant, held_mem_mib=held, asked_mem_mib=need_mem_mib, limit_mem_mib=bound
                ),
                False,
            )
        return None, used + need_milli > quota.guaranteed_milli

    def _reserve_check(self, unit: list[TaskRequest], need_milli: int) -> str | None:
        reserve = self.config.online_reserve_milli
        if reserve and self.state.free_milli_total - need_milli < reserve:
            return self._reserve_message(unit, need_milli)
        return None

    def _reserve_message(self, unit: list[TaskRequest], need_milli: int) -> str:
        what = "batch task" if len(unit) == 1 else f"batch gang {unit[0].gang_id}"
        why = f" ({self.config.online_reserve_why})" if self.config.online_reserve_why else ""
        return (
            f"{what} asks {need_milli} milli-GPU; {self.state.free_milli_total} milli-GPU is free and the "
            f"pool keeps {self.config.online_reserve_milli} for online tasks{why}"
        )

    # -- explanations ------------------------------------------------------------------------------

    def explain(self, req: Request) -> tuple[Outcome, str]:
        """Why no node takes `req`, counted over all nodes with numpy (cheap even for failures en masse).

        The counts read only the working copy, so the sentence is kept until the copy changes: a
        saturated pool explains the same failing request many times between two placements."""
        kept = self.explained.get(req)
        if kept is not None and kept[0] == self.state.changes:
            return kept[1]
        answer = self._explain(req)
        self.explained[req] = (self.state.changes, answer)
        return answer

    def _explain(self, req: Request) -> tuple[Outcome, str]:
        s = self.state
        allowed = s.allowed_mask(req)
        models = "/".join(sorted(req.allowed_models)) if req.allowed_models and req.num_gpu else ""
        if not allowed.any():
            if not models:
                with_gpus = " with GPUs" if req.num_gpu else ""
                why = f"no schedulable node{with_gpus} in the pool (none, or all cordoned, draining or lost)"
                return Outcome.NO_ALLOWED_MODEL, why
            return Outcome.NO_ALLOWED_MODEL, f"no schedulable node has a {models} GPU"
        # Devices whose partition mode the task's isolation accepts.
        mode_ok = s.np_mode_ok[req.isolation]
        isolated = req.num_gpu > 0 and req.isolation is not Isolation.ANY
        if isolated:
            allowed = allowed & mode_ok.any(axis=1)
            if not allowed.any():
                what = ISOLATION_WORDS[req.isolation]
                return Outcome.NO_ISOLATION, f"no schedulable node has {what} (isolation {req.isolation})"
        total = int(allowed.sum())
        lack_cpu = int((allowed & (s.np_cpu_free < req.cpu_milli)).sum())
        lack_mem = int((allowed & (s.np_mem_free < req.mem_mib)).sum())
        parts: list[str] = []
        if req.num_gpu:
            threshold = WHOLE_GPU_MILLI if self.policy.whole_gpus_only else req.gpu_milli
            has_gpu: npt.NDArray[np.bool_]
            if isolated:
                fits = (s.np_gpu_free >= threshold) & mode_ok
                has_gpu = fits.sum(axis=1) >= req.num_gpu
            else:
                has_gpu = s.has_devices(slice(None), req.num_gpu, threshold)  # every mode is accepted
            with_gpu = int((allowed & has_gpu).sum())
            where = models or "GPU"
            amount = f"{req.gpu_milli} milli" if req.num_gpu == 1 else f"{req.num_gpu}×{req.gpu_milli} milli"
            if isolated:
                amount += f" ({req.isolation} isolation)"
            if with_gpu == 0:
                parts.append(f"no {where} node with {amount} free")
            else:
                parts.append(f"{with_gpu} of {total} {where} nodes have {amount} free")
        parts.append(f"{_nodes(lack_cpu)} CPU ({req.cpu_milli / 1000:g} cores)")
        parts.append(f"{_nodes(lack_mem)} host memory ({req.mem_mib} MiB)")
        return Outcome.NO_CAPACITY, "; ".join(parts)

    # -- preemption --------------------------------------------------------------------------------

    def _within_guarantee(self, task: TaskRequest) -> bool:
        """Whether the task's tenant stays within its guarantee with the task placed (it would not borrow)."""
        quota = self.quotas.get(task.tenant)
        return quota is not None and (
            self.usage_milli[task.tenant] + task.num_gpu * task.gpu_milli <= quota.guaranteed_milli
        )

    def _victim_candidates(self, task: TaskRequest) -> dict[int, list[_Record]]:
        within_guarantee = self._within_guarantee(task)
        honours_reserve = self._honours_reserve(task)
        by_node: dict[int, list[_Record]] = defaultdict(list)
        for record in self.victim_pool.values():
            # The online reserve is room batch work may not keep from an online task: preemptible batch work
            # of the same priority makes way too (a higher priority still outranks the SLA class).
            makes_way = honours_reserve and not record.online and record.priority == task.priority
            lower = record.preemptible and (record.priority < task.priority or makes_way)
            # A task admitted as borrowed keeps its flag after its tenant's other work ended; it is only
            # reclaimable while its tenant still holds more than its own guarantee (otherwise reclaiming
            # would take one tenant's guarantee to honour another's).
            reclaim = (
                within_guarantee
                and record.borrowed
                and record.tenant != task.tenant
                and self._above_guarantee(record.tenant)
            )
            if lower or reclaim:
                by_node[self.state.bindings[record.task_id].node].append(record)
        return by_node

    def _honours_reserve(self, task: TaskRequest) -> bool:
        """Whether `task` is an online task the pool's online reserve was kept for (its ask fits in it)."""
        reserve = self.config.online_reserve_milli
        return task.sla_online and 0 < task.gpu_request_milli <= reserve

    def _keeps_guarantee(self, record: _Record, already_milli: int) -> bool:
        """Whether taking `record` leaves its tenant at or above its guarantee (after `already_milli` taken
        from it for the same task). A borrowing preemptor that took a tenant below it would be reclaimed
        from next cycle by that tenant's own waiting work, undoing the preemption (and breaking the
        guarantee in between)."""
        quota = self.quotas.get(record.tenant)
        guaranteed = quota.guaranteed_milli if quota is not None else 0
        return self.usage_milli[record.tenant] - already_milli - record.request_milli >= guaranteed

    def _above_guarantee(self, tenant: str) -> bool:
        quota = self.quotas.get(tenant)
        guaranteed = quota.guaranteed_milli if quota is not None else 0
        return self.usage_milli[tenant] > guaranteed

    def _fits(self, n: int, req: Request) -> bool:
        """Whether node `n` takes `req` as the working copy stands, in all that placing it asks:
        schedulable, allowed model, CPU, host memory, and enough GPUs whose mode, free milli, GPU memory
        and MIG geometry take one GPU of it each, at the least free milli the policy scores a device
        with. A victim set is only proposed when this holds with the victims gone: a preemption that
        leaves its task short in any resource stops work for nothing (issue #41)."""
        devices = self.state.eligible_devices(n, req)
        if devices is None:
            return False
        if not req.num_gpu or not self.state.plain[n]:
            return True
        threshold = self.policy.device_threshold(req)
        return sum(self.state.gpu_free[n][d] >= threshold for d in devices) >= req.num_gpu

    def _propose_preemption(
        self, task: TaskRequest, now: float, claimed: set[str], skip: frozenset[int] = frozenset()
    ) -> list[Preemption]:
        """Fewest victims, then least progress lost (GPU-seconds run so far), on one node (not in `skip`).

        Victims on a node are tried cheapest first and added until the task fits; the working copy is
        restored exactly afterwards (victims only leave once the agent confirms they stopped).
        """
        req = Request.of(task)
        best: tuple[int, float, int, list[_Record]] | None = None
        # A task its tenant's guarantee does not cover (borrowing) may take another tenant's work only out
        # of what that tenant holds above its own guarantee; within its guarantee, priority decides.
        covered = self._within_guarantee(task)
        # Victims proposed earlier this cycle still hold their GPUs (they leave once stopped): count them
        # as gone already when asking what a tenant keeps.
        proposed: dict[str, int] = defaultdict(int)
        for task_id in claimed:
            gone = self.records.get(task_id)
            if gone is not None:
                proposed[gone.tenant] += gone.request_milli
        for n, records in self._victim_candidates(task).items():
            if n in skip or not self.state.model_allowed(n, req):
                continue
            candidates = sorted(
                (r for r in records if r.task_id not in claimed), key=lambda r: _progress_lost(r, now)
            )
            released: list[Binding] = []
            chosen: list[_Record] = []
            fits = False
            taken = defaultdict(int, proposed)  # tenant → milli gone from it, this node's choice included
            for record in candidates:
                if (
                    record.tenant != task.tenant
                    and not covered
                    and not self._keeps_guarantee(record, taken[record.tenant])
                ):
                    continue
                taken[record.tenant] += record.request_milli
                released.append(self.state.release(record.task_id))
                chosen.append(record)
                if self._fits(n, req):
                    fits = True
                    break
            for binding in reversed(released):
                self.state.restore(binding)
            if fits:
                cost = sum(_progress_lost(r, now) for r in chosen)
                if best is None or (len(chosen), cost, n) < (best[0], best[1], best[2]):
                    best = (len(chosen), cost, n, chosen)
        if best is None:
            return []
        node = self.state.names[best[2]]
        proposals = []
        for record in best[3]:
            claimed.add(record.task_id)
            lost = f"loses {_progress_lost(record, now):.0f} GPU-seconds of progress"
            if record.preemptible and record.priority < task.priority:
                why = f"preemptible, priority {record.priority} below {task.priority}; {lost}"
            elif (
                record.preemptible
                and not record.online
                and record.priority == task.priority
                and self._honours_reserve(task)
            ):
                sized = f": {self.config.online_reserve_why}" if self.config.online_reserve_why else ""
                why = (
                    f"preemptible batch work making way for online task {task.task_id} within the pool's "
                    f"online-service reserve of {self.config.online_reserve_milli} milli-GPU{sized}; {lost}"
                )
            else:
                why = f"borrowed capacity reclaimed for tenant {task.tenant}, which is within its guarantee"
            proposals.append(Preemption(record.task_id, node, task.task_id, why))
        return proposals

    def _victims_for(
        self, task: TaskRequest, refusal: SlaRefusal | None, message: str, now: float, claimed: set[str]
    ) -> tuple[list[Preemption], str]:
        """Victims for a single task left out, and its message saying what it waits for. Refused for an
        SLA: the batch neighbours whose leaving honours it first, else victims by resources on nodes where
        nothing was refused (a unit freed there would be refused again). Short of capacity: by resources."""
        if refusal is not None:
            victims = self._propose_for_sla(task, refusal, now, claimed)
            if victims:
                self.hold(victims[0].node, task.task_id)
                return victims, f"{message}; waiting for {victims[0].reason}"
            skip = frozenset(i for i, name in enumerate(self.state.names) if name in refusal.refused_nodes)
        else:
            skip = frozenset()
        victims = self._propose_preemption(task, now, claimed, skip | self._held_for_others(task.task_id))
        if victims:
            names = ", ".join(v.victim_task_id for v in victims)
            message = f"{message}; waiting for {names} to be preempted on {victims[0].node}"
            self.hold(victims[0].node, task.task_id)
        elif self.held:
            message += self._held_words(task.task_id)
        return victims, message

    def _held_for_others(self, task_id: str) -> frozenset[int]:
        index = self.state.index
        return frozenset(index[name] for name, held_for in self.held.items() if held_for != task_id)

    def _held_words(self, task_id: str) -> str:
        """Why nodes held for other preemptors were not looked at for victims (the why-pending sentence)."""
        others = sorted(name for name, held_for in self.held.items() if held_for != task_id)
        if not others:
            return ""
        return (
            f"; not preempted for on {', '.join(others)}: held this cycle for "
            f"{', '.join(sorted({self.held[name] for name in others}))}, whose victims are stopping there"
        )

    def _propose_for_sla(
        self, task: TaskRequest, refusal: SlaRefusal, now: float, claimed: set[str]
    ) -> list[Preemption]:
        """The policy's remedies whose every victim the task may displace (a lower-priority preemptible
        task or reclaimable borrowed work, as `_propose_preemption` asks) and after whose leaving the
        task fits the node: fewest victims, then least progress lost."""
        candidates = {r.task_id for records in self._victim_candidates(task).values() for r in records}
        req = Request.of(task)
        best: tuple[int, float, str, SlaRemedy] | None = None
        for remedy in refusal.remedies:
            ids = remedy.task_ids
            if not ids or any(t not in candidates or t in claimed for t in ids):
                continue
            if self.held.get(remedy.node, task.task_id) != task.task_id:
                continue  # held for another preemptor this cycle
            released = [self.state.release(t) for t in ids]
            n = released[0].node
            fits = self._fits(n, req)
            for binding in reversed(released):
                self.state.restore(binding)
            if not fits:
                continue
            cost = sum(_progress_lost(self.records[t], now) for t in ids)
            key = (len(ids), cost, remedy.node)
            if best is None or key < best[:3]:
                best = (len(ids), cost, remedy.node, remedy)
        if best is None:
            return []
        remedy = best[3]
        claimed.update(remedy.task_ids)
        return [
            Preemption(
                t,
                remedy.node,
                task.task_id,
                f"{', '.join(remedy.task_ids)} to be preempted on {remedy.node} GPU {remedy.gpu_index} "
                f"so that the co-location keeps the SLA ({remedy.why} with {', '.join(remedy.task_ids)} "
                f"there); {t} loses {_progress_lost(self.records[t], now):.0f} GPU-seconds of progress",
            )
            for t in remedy.task_ids
        ]


# Outcomes of a single task for which victims are looked for (with preemption on).
_PREEMPTS_FOR = (Outcome.NO_CAPACITY, Outcome.SLA_REFUSED)


ISOLATION_WORDS = {
    Isolation.MIG: "a GPU in MIG mode",
    Isolation.MPS: "a GPU in shared (MPS or time-slice) mode",
    Isolation.EXCLUSIVE: "a GPU outside MIG mode",
}


def _nodes(count: int) -> str:
    return "1 node lacks" if count == 1 else f"{count} nodes lack"


def _progress_lost(record: _Record, now: float) -> float:
    """GPU-seconds of work done so far; CPU-only tasks count as a tenth of a GPU so they are not free."""
    gpus = max(record.request_milli, 100) / WHOLE_GPU_MILLI
    return max(0.0, now - record.started_at_s) * gpus


def solve_cycle(snapshot: ClusterSnapshot, config: EngineConfig, now: float) -> CycleResult:
    """One scheduling cycle over a snapshot (the production entry point)."""
    return Engine(snapshot, config).solve(snapshot.pending, now)


def _units_in_order(pending: tuple[TaskRequest, ...]) -> list[list[TaskRequest]]:
    """The caller's `order_key` first where given (lowest first), then priority, then submission time;
    a gang goes as one unit at the position of its first member."""
    ordered = sorted(
        pending,
        key=lambda t: (
            t.order_key is None,
            t.order_key or 0,
            -t.priority,
            t.submitted_at_s,
            t.task_id,
        ),
    )
    gangs: dict[str, list[TaskRequest]] = defaultdict(list)
    for task in ordered:
        if task.gang_id is not None:
            gangs[task.gang_id].append(task)
    units: list[list[TaskRequest]] = []
    seen_gangs: set[str] = set()
    for task in ordered:
        if task.gang_id is None:
            units.append([task])
        elif task.gang_id not in seen_gangs:
            seen_gangs.add(task.gang_id)
            units.append(gangs[task.gang_id])
    return units
