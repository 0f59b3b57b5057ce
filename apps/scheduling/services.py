"""The scheduling cycle: snapshot → decide → commit, one pool at a time.

`cycle_run` is the only writer of placements. It runs in one transaction that holds a per-pool advisory
lock (`pg_try_advisory_xact_lock`): a second worker finds the pool busy and leaves. The lock is an
optimisation, not the guarantee: the commit compares-and-sets every row it writes (task state+version,
node version, unit holder+version, tenant usage under the quota row lock), so even two cycles that both
run on one pool never double-book; the loser skips what it lost (`Cycle.conflicts`) and the next cycle
retries it.
"""

from __future__ import annotations

import gc
import json
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.common import hooks
from apps.common.errors import Conflict
from apps.common.pipeline import pipelined
from apps.inventory.models import ComputeUnit, Node
from apps.inventory.services import mig_units_create
from apps.scheduling.holders import gpu_units_held, unit_holders
from apps.scheduling.models import Assignment, Cycle, PoolCycleTotals, Repartition
from apps.scheduling.precarve import precarves_commit
from apps.scheduling.selectors import LIVE_STATES, live_usage
from apps.scheduling.snapshot import CycleInput, PoolSnapshot, cycle_input
from apps.workloads.models import Quota, Task, TaskWait
from apps.workloads.services import (
    task_events_bulk,
    task_preempt,
    task_waits_write,
    tasks_move_bulk,
    tasks_transition_bulk,
)
from whalegen.placement.fragmentation import ClusterFragmentation, cluster_fragmentation
from whalegen.placement.repartition import ClaimAction, MigSlot, RepartitionPlan
from whalegen.placement.types import Outcome, Placement, TaskRequest
from whalegen.placement.words import quota_mem_wait_text
from whalegen.scheduling import Bound, Code, Decider, Decisions, nodes_before, repartition_sentence

ACTOR = "scheduler"
# First key of the two-int advisory lock: a fixed tag so our locks never collide with another user's.
LOCK_CLASS = zlib.crc32(b"whalegen.cycle") & 0x7FFFFFFF
# Codes of our own, next to `decide`'s, for tasks the commit had to hold back.
LOST_RACE = "lost_race"
WAITING_FOR_LAYOUT = Code.WAITING_FOR_LAYOUT
CYCLE_WORK_MEM = "64MB"
# The engine's placements go to the database in chunks of at least this many while it places the rest,
# each on its units: three statements a chunk (task moves, their events, assignments); the last chunk
# waits for the engine to end.
STREAM_CHUNK = 500
PENDING = Task.State.PENDING
ADMITTED_ASSIGNED = (Task.State.ADMITTED, Task.State.ASSIGNED)  # a placement's two steps

# SQLite (the embedded default) has no advisory locks; one process serves it, so a lock per pool in
# memory keeps its cycles apart. Its single-writer database does the rest.
_local_locks: dict[int, threading.Lock] = {}
_local_locks_guard = threading.Lock()


def _local_lock(pool_id: int) -> threading.Lock:
    with _local_locks_guard:  # two threads asking at once for a new pool get the same lock
        return _local_locks.setdefault(pool_id, threading.Lock())


@dataclass(frozen=True)
class CycleReport:
    status: str  # "done", or "busy" when another worker holds the pool's lock
    pool_id: int
    cycle_id: int | None = None
    placed: int = 0
    preempted: int = 0
    unplaced: int = 0
    conflicts: int = 0
    transaction_commit_ms: float | None = None  # the COMMIT itself, after the cycle's own writes


# -- committing -------------------------------------------------------------------------------------


@dataclass
class _Commit:
    placed: int = 0
    preempted: int = 0
    conflicts: int = 0
    held_back: dict[str, tuple[str, str]] = field(default_factory=dict)  # task id → (code, sentence)
    # Every task left pending → (code, sentence), as written: what `decide` left and what was held back.
    reasons: dict[str, tuple[str, str]] = field(default_factory=dict)
    decisions: Decisions = field(default_factory=Decisions)  # as completed by `explain`
    phases_ms: dict[str, float] = field(default_factory=dict)  # where the commit's time went
    # The same phases in this process's CPU milliseconds: on a loaded host wall time mostly measures the
    # neighbours, and the database's share (wall minus CPU) is what a schema change moves.
    phases_cpu_ms: dict[str, float] = field(default_factory=dict)
    cpu_mark: float = field(default_factory=time.process_time)
    # Why the unlocked attempt was rolled back for the locked path ("" when it held or was not tried).
    unlocked_missed: str = ""

    def lap(self, phase: str, since: float) -> float:
        now, cpu = time.perf_counter(), time.process_time()
        self.phases_ms[phase] = round((now - since) * 1000, 1)
        self.phases_cpu_ms[phase] = round((cpu - self.cpu_mark) * 1000, 1)
        self.cpu_mark = cpu
        return now


def _int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal (`{1,2,3}`) for a `%s::bigint[]` parameter.

    psycopg dumps a Python list for a client-side cursor (Django's) element by element in Python, with a
    regular expression per element: for the tens of thousands of ids a cycle writes that was the largest
    CPU cost of the commit. The ids are ints, so the literal needs no quoting.
    """
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _bool_array(values: Iterable[bool]) -> str:
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


def _lock_rows(model: type, pks: Iterable[int], fields: Sequence[str]) -> dict[int, dict[str, object]]:
    """Lock rows in id order (every cycle locks in the same order, so two cycles cannot deadlock)."""
    ids = sorted(set(pks))
    if not ids:
        return {}
    if connection.vendor != "postgresql":
        rows = model.objects.select_for_update().filter(pk__in=ids).order_by("pk").values("pk", *fields)
        return {row["pk"]: row for row in rows}
    columns = [model._meta.get_field(name).column for name in fields]
    with connection.cursor() as cursor:
        # One array parameter instead of thousands of IN placeholders.
        cursor.execute(
            f"SELECT id, {', '.join(columns)} FROM {model._meta.db_table} "
            "WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE",
            [_int_array(ids)],
        )
        return {row[0]: dict(zip(fields, row[1:], strict=True)) for row in cursor.fetchall()}


class _Changed(Exception):
    """The unlocked attempt found a row moved since the snapshot, or `decide` moved one of the engine's
    placements: its savepoint is rolled back."""


def _commit(
    snapshot: PoolSnapshot,
    cycle: Cycle,
    now: datetime,
    *,
    begin: Callable[[Callable[[list[Bound]], None] | None], Sequence[Placement]],
    finish: Callable[[], Decisions],
    explain: Callable[[Decisions], Decisions] | None = None,
    measure: Callable[[Decisions], None] | None = None,
    reason_of: Callable[[str], str | None] = lambda _: None,
) -> _Commit:
    """Finish `decide` and write what it decided, then preemptions; what lost a race or `decide` left
    stays pending with a reason.

    `begin` is `decide` up to the engine's placements (`Decider.begin`, told of each as it is made),
    `finish` the rest of the decision (`Decider.finish`: units, re-carves, reasons), `explain` what
    completes it with estimates (`Decider.explain`), `measure` what the caller measures of the completed
    decisions (once their last statement has gone out), `reason_of` the policy's words for a placement as
    the engine made it.

    Steps: 1. unlocked, in a savepoint: the engine's task moves go out as it places them, `finish` runs
    while the server moves the last of them, and, if it bound every one as the engine placed it, the rest
    of the writes follow (`_send_writes`), each a compare-and-set against the snapshot (tasks still
    pending at the version seen, nodes at the version seen, tenants within their limit once written). When
    all hold (nearly always: one cycle per pool runs at a time) that is the commit. Else, or with new
    layouts to write, back to the savepoint and the locked path: 2. lock quotas, nodes and tasks (in that
    order, ids ascending) and compare with the snapshot; 3. drop whole gangs that lost any member; 4. keep
    tenants within their limit; 5. write tasks, units, nodes, assignments and why-pending, then new
    layouts; 6. preempt. `explain` runs once the placements' writes have gone out, while the server works
    on them, once whichever path writes.
    `out.decisions` are the decisions as completed.
    """
    out = _Commit()
    clock = time.perf_counter()
    request_of = {t.task_id: t for t in snapshot.cluster.pending} | dict(snapshot.claimed_requests)
    once = _Once(finish, explain, measure)
    attempt = _Attempt(snapshot, request_of, cycle, now, once.explained, once.measured, out)
    # 1. Unlocked.
    lost, clock = _try_unlocked(attempt, begin, once.decided, reason_of, clock)
    decisions = once.decided()
    placements = [b.placement for b in decisions.placements]
    kept_plans: list[tuple[tuple[int, int], RepartitionPlan]] = []
    if lost is None:
        # 2-5. Locked.
        lost, kept_plans, clock = _write_locked(attempt, decisions, clock)
        winners = [p for p in placements if p.task_id not in lost]
    else:
        winners = placements
    decisions = once.explained()
    clock = _claims_and_layouts(attempt, decisions, winners, kept_plans, lost, clock)
    out.placed = len(winners)
    out.conflicts = sum(1 for code, _ in lost.values() if code == LOST_RACE)
    # 6. Preempt.
    _preempt(snapshot, decisions, now, out)
    out.lap("preempt", clock)
    out.held_back = lost
    return out


class _Once:
    """`finish`, `explain` and `measure` of one commit, each run once, by whichever attempt writes."""

    def __init__(
        self,
        finish: Callable[[], Decisions],
        explain: Callable[[Decisions], Decisions] | None,
        measure: Callable[[Decisions], None] | None,
    ) -> None:
        self._finish, self._explain, self._measure = finish, explain, measure
        self._decided: Decisions | None = None
        self._explained: Decisions | None = None

    def decided(self) -> Decisions:
        if self._decided is None:
            self._decided = self._finish()
        return self._decided

    def explained(self) -> Decisions:
        if self._explained is None:
            self._explained = self._explain(self.decided()) if self._explain is not None else self.decided()
        return self._explained

    def measured(self) -> None:
        if self._measure is not None:
            measure, self._measure = self._measure, None
            measure(self.explained())


def _try_unlocked(
    attempt: _Attempt,
    begin: Callable[[Callable[[list[Bound]], None] | None], Sequence[Placement]],
    decided: Callable[[], Decisions],
    reason_of: Callable[[str], str | None],
    clock: float,
) -> tuple[dict[str, tuple[str, str]] | None, float]:
    """Step 1 of `_commit` where the database allows it: nothing lost (`{}`) when the unlocked attempt
    held, None when the locked path must write (it was rolled back, or not tried: then `decide` is
    finished here)."""
    out = attempt.out
    if connection.vendor != "postgresql":
        begin(None)
        clock = out.lap("decide_begin", clock)
        decided()
        return None, out.lap("decide_finish", clock)
    try:
        with transaction.atomic():
            clock = _write_unlocked(attempt, begin, decided, reason_of, clock)
        return {}, clock
    except (_Changed, IntegrityError, OperationalError) as changed:
        # A row moved since the snapshot (a unique index can be the first to say so: a task another
        # cycle placed meanwhile has its live assignment): the locked path sorts out what is lost.
        out.unlocked_missed = str(changed).splitlines()[0][:300]
        return None, out.lap("unlocked_missed", clock)


def _write_locked(
    attempt: _Attempt, decisions: Decisions, clock: float
) -> tuple[dict[str, tuple[str, str]], list[tuple[tuple[int, int], RepartitionPlan]], float]:
    """Steps 2-5 of `_commit`: lock and compare, then write the winners. Returns what was lost (task →
    reason) and the new layouts that may go ahead."""
    snapshot, out = attempt.snapshot, attempt.out
    placements = [b.placement for b in decisions.placements]
    units_for = {b.task_id: b.unit_ids for b in decisions.placements}
    plans = [((snapshot.node_ids[lay.gpu[0]], lay.gpu[1]), lay.plan) for lay in decisions.layouts]
    lost, kept_plans = _lock_and_compare(snapshot, placements, units_for, plans, attempt.request_of)
    clock = out.lap("lock_and_compare", clock)
    winners = [p for p in placements if p.task_id not in lost]
    checks: list[Callable[[], None]] = []
    with pipelined():
        clock = _send_writes(
            attempt, decisions, winners, (), (), kept_plans, lost, checks, clock, unlocked=False
        )
    for check in checks:
        check()
    return lost, kept_plans, out.lap("writes_finished", clock)


def _claims_and_layouts(
    attempt: _Attempt,
    decisions: Decisions,
    winners: Sequence[Placement],
    kept_plans: Sequence[tuple[tuple[int, int], RepartitionPlan]],
    lost: dict[str, tuple[str, str]],
    clock: float,
) -> float:
    """Close the claims the winners no longer need, write the new layouts (their tasks wait for them:
    added to `lost`), and tell the agents of the nodes that have new work or a new layout."""
    snapshot, cycle, now, out = attempt.snapshot, attempt.cycle, attempt.now, attempt.out
    # Claims first: a task whose claims were given up may get new ones now (one open claim per task and GPU).
    _close_claims(snapshot, bound={p.task_id for p in winners}, now=now)
    if layouts := _write_layouts(snapshot, kept_plans, cycle, now):
        lost.update(layouts)
        reasons_now, estimates = _why_pending(decisions, lost, now.timestamp())
        _write_why_pending(snapshot, {t: reasons_now[t] for t in layouts}, estimates)
        out.reasons = reasons_now
    out.decisions = decisions
    # The agents of these nodes have new work or a new layout: their waiting polls answer after the commit.
    hooks.nodes_changed({snapshot.node_ids[p.node] for p in winners} | {key[0] for key, _ in kept_plans})
    return out.lap("repartitions", clock)


def _preempt(snapshot: PoolSnapshot, decisions: Decisions, now: datetime, out: _Commit) -> None:
    """The victim returns to pending with its attempt counted; the agent stops it when its node's desired
    state no longer lists it. A victim that moved meanwhile is a conflict."""
    for preemption in decisions.preemptions:
        info = snapshot.running[preemption.victim_task_id]
        victim = Task(pk=info.pk, state=info.state, version=info.version, tenant_id=info.tenant_id)
        reason = f"preempted for task {preemption.for_task_id}: {preemption.reason}"
        requeued = "requeued after preemption"
        if task_preempt(
            task=victim, actor=ACTOR, reason=reason, requeued=requeued, now=now, node_ids=[info.node_id]
        ):
            out.preempted += 1
        else:
            out.conflicts += 1


def _write_unlocked(
    attempt: _Attempt,
    begin: Callable[[Callable[[list[Bound]], None] | None], Sequence[Placement]],
    decided: Callable[[], Decisions],
    reason_of: Callable[[str], str | None],
    clock: float,
) -> float:
    """Step 1 of `_commit`: every write without a lock, each compared and set; `_Changed` when one fails.

    The engine's placements go out in chunks as it makes them (`begin`), each already on its units: the
    task moves, their events and their assignments. The server writes them while the engine places,
    when it had nothing else to do; the nodes' versions are raised once, after `decide` finishes
    (`decided`). Should `decide` then have bound one of them elsewhere or on other units, taken one back,
    or planned new layouts (which lock the GPUs' units), the attempt is rolled back: the locked path
    writes what it decided. A pool whose engine made two passes (and said nothing as it went) gets its
    task moves and events sent after the engine, and its assignments after `decide`."""
    out = attempt.out
    sent = _Streamed(attempt, reason_of)
    with pipelined():
        begun = begin(sent.placed)
        clock = out.lap("decide_begin", clock)
        if not sent.moved:  # the engine made two passes and said nothing as it went: the moves go now
            sent.send([Bound(p, ()) for p in begun], units=False)
        clock = out.lap("write_engine_moves", clock)
        decisions = decided()
        clock = out.lap("decide_finish", clock)
        if decisions.layouts:
            raise _Changed(f"{len(decisions.layouts)} new layouts to write (the locked way)")
        if changed := sent.bound_otherwise(decisions):
            raise _Changed(f"decide bound {changed} of the {len(sent.moved)} placements sent otherwise")
        clock = _send_writes(
            attempt,
            decisions,
            [b.placement for b in decisions.placements],
            sent.moved,
            sent.written,
            (),
            {},
            sent.checks,
            clock,
            unlocked=True,
        )
    try:
        for check in sent.checks:
            check()
    except Conflict as conflict:
        raise _Changed(str(conflict)) from conflict
    # The wait for the server to finish the statements above (their time shows here, not in their phases).
    return out.lap("writes_finished", clock)


@dataclass
class _Streamed:
    """What the unlocked attempt has sent of the engine's placements as it made them."""

    attempt: _Attempt
    reason_of: Callable[[str], str | None]  # the policy's words for a placement as the engine made it
    said: dict[str, str | None] = field(default_factory=dict)  # those words, for each placement sent
    moved: dict[str, Placement] = field(default_factory=dict)  # task moves and events sent
    written: dict[str, tuple[int, ...]] = field(default_factory=dict)  # of those, assignments: task → units
    checks: list[Callable[[], None]] = field(default_factory=list)  # compare-and-set checks, for after

    def placed(self, bounds: list[Bound]) -> None:  # `STREAM_CHUNK` or more, the last batch fewer
        self.send(bounds, units=True)

    def send(self, bounds: list[Bound], *, units: bool) -> None:
        """Send the task moves and events of the placements not sent yet, and with `units` their
        assignments on their units."""
        going = [b for b in bounds if b.task_id not in self.moved]
        if not going:
            return
        attempt, said = self.attempt, self.said
        snapshot = attempt.snapshot
        placements = [b.placement for b in going]
        said.update({p.task_id: self.reason_of(p.task_id) for p in placements})
        self.moved.update({p.task_id: p for p in placements})
        pending = snapshot.pending
        pks = [pending[p.task_id].pk for p in placements]
        move = [(pk, pending[p.task_id].version) for pk, p in zip(pks, placements, strict=True)]
        self.checks.append(
            tasks_move_bulk(tasks=move, from_state=PENDING, path=ADMITTED_ASSIGNED, now=attempt.now)
        )
        task_events_bulk(
            tasks=pks,
            from_state=PENDING,
            path=ADMITTED_ASSIGNED,
            actor=ACTOR,
            reasons=lambda: _event_sentences(
                snapshot, said.get, placements, attempt.request_of, attempt.cycle
            ),
        )
        if units:
            self.written.update({b.task_id: b.unit_ids for b in going})
            _write_placements(
                held={pk: b.unit_ids for pk, b in zip(pks, going, strict=True)},
                nodes={},  # raised once, at the end
                assignments=[
                    (pk, snapshot.node_ids[p.node], p.borrowed) for pk, p in zip(pks, placements, strict=True)
                ],
                cycle=attempt.cycle,
                deferred=self.checks,
            )

    def bound_otherwise(self, decisions: Decisions) -> int:
        """How many of the placements sent `decide` finished otherwise: bound elsewhere, on other units,
        with other words, or taken back."""
        final = {b.task_id: b for b in decisions.placements}
        words = decisions.placement_reasons.get
        # `finish` hands back the very placements heard (`Decider._bind_units` reuses the early mapping):
        # identity first, as a dataclass's `==` compares every field even of the same object.
        return sum(
            1
            for task_id, placement in self.moved.items()
            if (b := final.get(task_id)) is None
            or (b.placement is not placement and b.placement != placement)
            or words(task_id) != self.said.get(task_id)
            or self.written.get(task_id, b.unit_ids) != b.unit_ids
        )


def _lock_and_compare(
    snapshot: PoolSnapshot,
    placements: Sequence[Placement],
    units_for: Mapping[str, tuple[int, ...]],
    plans: Sequence[tuple[tuple[int, int], RepartitionPlan]],
    request_of: Mapping[str, TaskRequest],
) -> tuple[dict[str, tuple[str, str]], list[tuple[tuple[int, int], RepartitionPlan]]]:
    """Steps 3-5 of `_commit`: what lost a race (task → reason) and the new layouts that may go ahead."""
    lost: dict[str, tuple[str, str]] = {}
    # 3. Lock and compare.
    tenants = {snapshot.pending[t].tenant_id for t in units_for}
    quota_rows = _lock_rows(
        Quota,
        Quota.objects.filter(pool_id=snapshot.pool_id, tenant_id__in=tenants).values_list("pk", flat=True),
        ["tenant_id", "guaranteed_milli", "borrow_limit_milli", "gpu_mem_limit_mib"],
    )
    nodes = {snapshot.node_ids[p.node] for p in placements}
    nodes |= {key[0] for key, _ in plans}
    node_rows = _lock_rows(Node, nodes, ["version"])
    planned_tasks = [task_id for _, plan in plans for task_id, _ in plan.for_tasks]
    task_rows = _lock_rows(
        Task, (snapshot.pending[t].pk for t in [*units_for, *planned_tasks]), ["state", "version"]
    )
    # Units have no rows to lock: every writer that binds, deletes or re-carves units raises their node's
    # version under the node lock above, so a unit taken since the snapshot shows as a moved node.
    # `_write_placements` still counts units a live assignment already lists; any means something changed
    # units without raising the node's version, and the whole cycle rolls back rather than double-book.
    placement_of = {p.task_id: p for p in placements}
    for task_id in units_for:
        info = snapshot.pending[task_id]
        node_id = snapshot.node_ids[placement_of[task_id].node]
        row = task_rows.get(info.pk)
        if row is None or row["state"] != Task.State.PENDING or row["version"] != info.version:
            lost[task_id] = (LOST_RACE, "the task changed while the cycle decided; it is retried next cycle")
        elif node_rows[node_id]["version"] != snapshot.node_versions[node_id]:
            lost[task_id] = (
                LOST_RACE,
                f"{placement_of[task_id].node} changed while the cycle decided; retried next cycle",
            )

    # A new layout goes ahead only if its GPU's node and every task it is for are as the snapshot saw them.
    kept_plans: list[tuple[tuple[int, int], RepartitionPlan]] = []
    for key, plan in plans:
        moved = node_rows[key[0]]["version"] != snapshot.node_versions[key[0]] or any(
            (row := task_rows.get(snapshot.pending[t].pk)) is None
            or row["state"] != Task.State.PENDING
            or row["version"] != snapshot.pending[t].version
            for t, _ in plan.for_tasks
        )
        if moved:
            for t, _ in plan.for_tasks:
                lost[t] = (
                    LOST_RACE,
                    f"{snapshot.gpus[key].view.name} or a task of its new layout changed; retried",
                )
        else:
            kept_plans.append((key, plan))
    kept_plans = _whole_gang_plans(kept_plans, lost, request_of)

    # 4. A gang goes whole or not at all: one member lost holds back every member.
    gang_of = {t: request_of[t].gang_id for t in units_for}
    broken = {gang_of[t] for t in lost if t in gang_of and gang_of[t] is not None}
    for task_id, gang in gang_of.items():
        if gang is not None and gang in broken and task_id not in lost:
            lost[task_id] = (LOST_RACE, f"gang {gang.split(':', 1)[1]}: another member could not be bound")

    # 5. Admission: quota limits against what tenants hold now (not what the snapshot saw), under the quota
    #    row lock. This is where a task starts to hold quota; pending, it held none.
    usage, usage_mem = live_usage(pool_id=snapshot.pool_id, tenant_ids=list(tenants))
    limits = {row["tenant_id"]: row for row in quota_rows.values()}
    for placement in placements:
        task_id = placement.task_id
        if task_id in lost:
            continue
        info = snapshot.pending[task_id]
        quota = limits.get(info.tenant_id)
        if quota is None:
            continue
        limit = quota["guaranteed_milli"] + quota["borrow_limit_milli"]
        if usage[info.tenant_id] + info.charge_milli > limit:
            lost[task_id] = (LOST_RACE, "its tenant reached its quota limit meanwhile; retried next cycle")
            continue
        if (refusal := _memory_quota_wait(quota, usage_mem, request_of[task_id], info.tenant_id)) is not None:
            lost[task_id] = (Outcome.QUOTA_EXCEEDED.value, refusal)
            continue
        usage[info.tenant_id] += info.charge_milli
        usage_mem[info.tenant_id] += request_of[task_id].gpu_request_mem_mib
    for task_id, gang in gang_of.items():
        if gang is not None and task_id not in lost and any(gang_of.get(t) == gang for t in lost):
            lost[task_id] = (LOST_RACE, f"gang {gang.split(':', 1)[1]}: another member could not be bound")
    return lost, kept_plans


def _memory_quota_wait(
    quota: Mapping[str, Any], usage_mem: Mapping[int, int], request: TaskRequest, tenant_id: int
) -> str | None:
    """Why a quota's GPU-memory bound holds the task back now (None: it does not). The engine held back
    what the snapshot's usage did not allow; this re-check under the quota row lock catches what tenants
    admitted meanwhile, as the milli-GPU check above does."""
    bound = quota["gpu_mem_limit_mib"]
    asked = request.gpu_request_mem_mib  # Task.charge_mem_mib
    held = usage_mem.get(tenant_id, 0)
    if bound is None or held + asked <= bound:
        return None
    return quota_mem_wait_text(
        tenant=request.tenant, held_mem_mib=held, asked_mem_mib=asked, limit_mem_mib=bound
    )


@dataclass(frozen=True)
class _Attempt:
    """What either attempt of `_commit` writes from."""

    snapshot: PoolSnapshot
    request_of: Mapping[str, TaskRequest]
    cycle: Cycle
    now: datetime
    explained: Callable[[], Decisions]  # the decisions completed with their estimates
    measured: Callable[[], None]  # what the cycle measures of them, once
    out: _Commit


def _send_writes(
    attempt: _Attempt,
    decisions: Decisions,
    winners: Sequence[Placement],
    moved: Collection[str],
    written: Collection[str],
    kept_plans: Sequence[tuple[tuple[int, int], RepartitionPlan]],
    lost: Mapping[str, tuple[str, str]],
    checks: list[Callable[[], None]],
    clock: float,
    *,
    unlocked: bool,
) -> float:
    """Send the placements' writes and why-pending inside the caller's pipeline; their compare-and-set
    checks go to `checks`, for after it. The task moves and events of `moved` went out already, and the
    assignments of `written`; the nodes of every winner have their versions raised here.

    Unlocked, the tenants' limits are checked here too, on what they hold once these are written; locked,
    the rows were compared already, and a failed check is a writer that skipped the locks."""
    snapshot, cycle, now, out = attempt.snapshot, attempt.cycle, attempt.now, attempt.out
    units_for = {b.task_id: b.unit_ids for b in decisions.placements}
    # Each statement's parameters are built while the server runs the one before.
    if rest := [p for p in winners if p.task_id not in moved]:
        tasks_transition_bulk(
            tasks=[(snapshot.pending[p.task_id].pk, snapshot.pending[p.task_id].version) for p in rest],
            from_state=Task.State.PENDING,
            path=[Task.State.ADMITTED, Task.State.ASSIGNED],
            actor=ACTOR,
            # Built once the task moves have gone out: the server moves the rows meanwhile.
            reasons=lambda: _event_sentences(
                snapshot, decisions.placement_reasons.get, rest, attempt.request_of, cycle
            ),
            now=now,
            deferred=checks,
        )
    clock = out.lap("write_tasks_and_events", clock)
    nodes = {snapshot.node_ids[p.node] for p in winners} | {key[0] for key, _ in kept_plans}
    unwritten = [p for p in winners if p.task_id not in written]
    _write_placements(
        held={snapshot.pending[p.task_id].pk: units_for[p.task_id] for p in unwritten},
        nodes={n: snapshot.node_versions[n] for n in nodes},
        assignments=[
            (snapshot.pending[p.task_id].pk, snapshot.node_ids[p.node], p.borrowed) for p in unwritten
        ],
        cycle=cycle,
        deferred=checks,
    )
    if unlocked and winners:
        tenants = sorted({snapshot.pending[p.task_id].tenant_id for p in winners})
        checks.append(_send_quota_check(snapshot.pool_id, tenants))
    clock = out.lap("write_units_nodes_and_assignments", clock)
    # What `decide` left and what lost a race: nothing below changes them but a new layout's tasks,
    # written again after it. The placements have gone out: the estimates are worked out while the
    # server writes them.
    explained = attempt.explained()
    clock = out.lap("explain", clock)
    out.reasons, estimates = _why_pending(explained, lost, now.timestamp())
    _write_why_pending(snapshot, out.reasons, estimates)
    clock = out.lap("why_pending", clock)
    attempt.measured()  # the cycle record's figures: no statement waits for them
    return out.lap("measure", clock)


def _send_quota_check(pool_id: int, tenant_ids: Sequence[int]) -> Callable[[], None]:
    """Lock the tenants' quota rows and send the read of what each holds in the pool (this cycle's writes
    included) beside its limit; returns the check, which raises `Conflict` for a tenant above it."""
    cursor = connection.cursor()  # closed by the check, once the statement has answered
    held = (
        f"FROM {Task._meta.db_table} t WHERE t.pool_id = q.pool_id AND t.tenant_id = q.tenant_id "
        "AND t.state = ANY(%(live)s)"
    )
    cursor.execute(
        f"SELECT q.tenant_id, q.guaranteed_milli + q.borrow_limit_milli, "
        f"(SELECT coalesce(sum(t.gpu_count * t.gpu_milli), 0) {held}), q.gpu_mem_limit_mib, "
        f"CASE WHEN q.gpu_mem_limit_mib IS NULL THEN 0 ELSE (SELECT coalesce(sum("
        f"t.gpu_count * coalesce(t.gpu_mem_mib, 0)), 0) {held}) END "
        f"FROM {Quota._meta.db_table} q "
        "WHERE q.pool_id = %(pool)s AND q.tenant_id = ANY(%(tenants)s::bigint[]) "
        "ORDER BY q.id FOR UPDATE OF q",
        {"pool": pool_id, "tenants": _int_array(tenant_ids), "live": list(LIVE_STATES)},
    )

    def check() -> None:
        with cursor:
            over = [
                tenant
                for tenant, limit, used, mem_limit, mem_used in cursor.fetchall()
                if used > limit or (mem_limit is not None and mem_used > mem_limit)
            ]
        if over:
            raise Conflict(f"tenants {over} would hold more than their quota limit")

    return check


def _event_sentences(
    snapshot: PoolSnapshot,
    reason_of: Callable[[str], str | None],
    winners: Sequence[Placement],
    request_of: Mapping[str, TaskRequest],
    cycle: Cycle,
) -> dict[int, list[str]]:
    """Task pk → the reasons of its two events: admitted (within the guarantee or borrowing), placed."""
    reasons: dict[int, list[str]] = {}
    # Thousands of placements, a few tenants: each admission sentence is built once.
    admitted_as: dict[tuple[str, bool, int, str], str] = {}
    tail = f"by cycle {cycle.pk}, policy {cycle.policy}"
    pending = snapshot.pending
    for placement in winners:
        task_id = placement.task_id
        info = pending[task_id]
        request = request_of[task_id]
        key = (request.tenant, placement.borrowed, request.priority, info.priority_source)
        admitted = admitted_as.get(key)
        if admitted is None:
            admitted = (
                f"admitted borrowing above the guarantee of tenant {request.tenant}"
                if placement.borrowed
                else f"admitted within the guarantee of tenant {request.tenant}"
            )
            if info.priority_source:
                admitted += f" at priority {request.priority} ({info.priority_source})"
            admitted_as[key] = admitted
        indexes = placement.gpu_indexes
        where = str(indexes[0]) if len(indexes) == 1 else ",".join(map(str, indexes))
        unit = placement.unit.mig_profile or placement.unit.kind.value
        placed = f"placed on {placement.node} GPU {where} ({unit}) {tail}"
        if (why := reason_of(task_id)) is not None:
            placed = f"{placed}: {why}"[:500]  # the profile-aware choice, in the event's reason
        reasons[info.pk] = [admitted, placed]
    return reasons


def _whole_gang_plans(
    plans: list[tuple[tuple[int, int], RepartitionPlan]],
    lost: dict[str, tuple[str, str]],
    request_of: Mapping[str, TaskRequest],
) -> list[tuple[tuple[int, int], RepartitionPlan]]:
    """The plans to write: the new layouts of a task on several GPUs, and of a gang, go ahead together or
    not at all, so a plan with a task (or a member of a gang) that lost on another GPU is dropped, and its
    tasks are retried next cycle."""

    def group(task_id: str) -> str:
        request = request_of.get(task_id)
        return (request.gang_id if request is not None else None) or task_id

    while True:
        groups = {group(t) for t in lost}
        dropped = [(k, p) for k, p in plans if any(group(t) in groups for t, _ in p.for_tasks)]
        if not dropped:
            return plans
        why = (LOST_RACE, "a new layout for it or its gang on another GPU could not be written; retried")
        for _, plan in dropped:
            for task_id, _ in plan.for_tasks:
                lost.setdefault(task_id, why)
        gone = {key for key, _ in dropped}
        plans = [(key, plan) for key, plan in plans if key not in gone]


def _why_pending(
    decisions: Decisions, held_back: Mapping[str, tuple[str, str]], now_s: float
) -> tuple[dict[str, tuple[str, str]], dict[str, float | None]]:
    """Task → (code, sentence) and task → estimated start for everything `decide` left or the commit held
    back: what lost a race or waits for its new layout is retried (or binds) next cycle, so now."""
    reasons = {t: (r.code, r.message) for t, r in decisions.unplaced.items()}
    reasons.update(held_back)
    estimates = {t: decisions.estimates.get(t) for t in reasons}
    for task_id, (code, _) in held_back.items():
        estimates[task_id] = now_s if code in (LOST_RACE, WAITING_FOR_LAYOUT) else None
    return reasons, estimates


def _write_layouts(
    snapshot: PoolSnapshot,
    plans: Sequence[tuple[tuple[int, int], RepartitionPlan]],
    cycle: Cycle,
    now: datetime,
) -> dict[str, tuple[str, str]]:
    """Re-carve each planned GPU: its units become the new layout (the node's desired state, which the
    agent enforces), the node's desired-state generation is raised, and a claim per task holds the GPU (a
    task on several GPUs holds one on each).

    The GPU was idle at the snapshot and its node is locked and unchanged since, so every unit must
    still be free; one that is not means a writer changed units without raising the node's version,
    and the whole cycle rolls back rather than re-carve under a task.
    """
    if not plans:
        return {}
    # Task → each GPU re-carved for it: (name, new layout, its instance, generation), for its reason.
    parts: dict[str, list[tuple[str, str, MigSlot, int]]] = defaultdict(list)
    node_of = {n.pk: n for n in Node.objects.filter(pk__in={key[0] for key, _ in plans})}
    for key, plan in plans:
        gpu = snapshot.gpus[key]
        if gpu_units_held(gpu_id=gpu.pk):
            raise Conflict(f"{gpu.view.name} changed during the commit; the cycle is rolled back")
        hooks.gpu_units_deleting(gpu_id=gpu.pk)  # the units' history, which the delete would take with it
        _, deleted = ComputeUnit.objects.filter(gpu_id=gpu.pk).delete()
        if deleted.get(ComputeUnit._meta.label, 0) != gpu.unit_count:
            raise Conflict(f"{gpu.view.name} changed during the commit; the cycle is rolled back")
        layout = [(slot.mig_profile, slot.mig_start) for slot in plan.layout]
        made = mig_units_create(gpu_id=gpu.pk, model=gpu.view.model, layout=layout)
        unit_at = {(u.mig_profile, u.mig_start): u for u in made}
        # The new layout is now the desired state: raise the generation the agent will report back.
        generation = hooks.desired_generation(node=node_of[key[0]], now=now)
        layout = [[slot.mig_profile, slot.mig_start] for slot in plan.layout]
        Repartition.objects.bulk_create(
            Repartition(
                pool_id=snapshot.pool_id,
                gpu_id=gpu.pk,
                task_id=snapshot.pending[task_id].pk,
                unit=unit_at[(slot.mig_profile, slot.mig_start)],
                cycle=cycle,
                generation=generation,
                layout=layout,
                created_at=now,
                reason=f"re-carved by cycle {cycle.pk} to {plan.text}",
            )
            for task_id, slot in plan.for_tasks
        )
        for task_id, slot in plan.for_tasks:
            parts[task_id].append((gpu.view.name, plan.text, slot, generation))
    return {task_id: (WAITING_FOR_LAYOUT, repartition_sentence(on)) for task_id, on in parts.items()}


def _close_claims(snapshot: PoolSnapshot, *, bound: set[str], now: datetime) -> None:
    """Claims whose task was bound this cycle are done; claims the snapshot gave up are abandoned."""
    done = [
        c.pk
        for t, claims in snapshot.claims.items()
        if t in bound
        for c in claims
        if c.verdict.action is ClaimAction.BIND
    ]
    if done:
        Repartition.objects.filter(pk__in=done, state=Repartition.State.WAITING).update(
            state=Repartition.State.BOUND, closed_at=now, reason="bound to its new instance"
        )
    for claim in (c for claims in snapshot.claims.values() for c in claims):
        if claim.verdict.action is ClaimAction.ABANDON:
            Repartition.objects.filter(pk=claim.pk, state=Repartition.State.WAITING).update(
                state=Repartition.State.ABANDONED, closed_at=now, reason=claim.verdict.reason[:500]
            )


def _write_placements(
    *,
    held: Mapping[int, Sequence[int]],
    nodes: Mapping[int, int],
    assignments: Sequence[tuple[int, int, bool]],
    cycle: Cycle,
    deferred: list[Callable[[], None]] | None = None,
) -> None:
    """Raise node versions (`nodes`: node → the version the snapshot saw, compared and set) and insert
    assignments with the ids of the units they hold.

    `held` maps each task to the units it binds, in order. A unit's holder is the live assignment that
    lists it (`apps.scheduling.holders`), so binding writes no unit row: the nodes are locked and found
    at the version the snapshot saw, and every writer of units raises that version under the same lock.
    The statement still counts the units it binds that a live assignment on their nodes already lists:
    any is a path that skipped the lock, and the whole cycle rolls back rather than double-book. The
    unlocked commit sends its assignments in batches as the engine places (`nodes` empty) and raises
    the versions once at the end (no assignments).

    On PostgreSQL this is one statement (two data-modifying CTEs and the check) fed by array literals
    (`unnest`): a cycle binds tens of thousands of units, and neither model instances nor one round trip
    per table are worth their cost. Each assignment's unit ids go as one element of a text array
    (`{"{1,2}","{3}"}`), cast per row: no link rows (see `UnitIdsField`). The literals are joined per task,
    not per unit. Elsewhere (the embedded SQLite) the ORM does the same steps.
    `deferred` as in `tasks_transition_bulk`: the check, for after a pipeline.
    """
    binds = sum(len(ids) for ids in held.values())
    if not binds and not nodes:
        return
    if connection.vendor != "postgresql":
        _write_placements_orm(held=held, nodes=set(nodes), assignments=assignments, cycle=cycle)
        return
    # Ids are ints from the database, so the literals need no quoting.
    ids_of = {task: ",".join(map(str, ids)) for task, ids in held.items() if ids}
    table = Assignment._meta.db_table
    cursor = connection.cursor()  # closed by the check, once the statement has answered
    cursor.execute(
        "WITH taken AS ("
        # Only the live assignments of the nodes bound on: a unit is listed on its own node's assignment.
        f"  SELECT count(*) AS n FROM {table} AS a CROSS JOIN LATERAL unnest(a.unit_ids) AS l(id)"
        "   JOIN unnest(%(unit)s::bigint[]) AS v(id) ON v.id = l.id"
        "   WHERE a.released_at IS NULL AND a.node_id = ANY(%(a_node)s::bigint[])"
        "), raised AS ("
        f"  UPDATE {Node._meta.db_table} AS n SET version = n.version + 1"
        "   FROM unnest(%(nodes)s::bigint[], %(versions)s::bigint[]) AS v(id, seen)"
        "   WHERE n.id = v.id AND n.version = v.seen RETURNING n.id"
        "), made AS ("
        f"  INSERT INTO {table}"
        "   (task_id, node_id, cycle_id, borrowed, created_at, release_reason, unit_ids)"
        "   SELECT t, n, %(cycle)s, b, %(at)s, '', h::bigint[]"
        "   FROM unnest(%(a_task)s::bigint[], %(a_node)s::bigint[], %(a_borrowed)s::boolean[],"
        "   %(a_units)s::text[]) AS a(t, n, b, h)"
        "   RETURNING 1"
        ") SELECT (SELECT n FROM taken), (SELECT count(*) FROM raised), (SELECT count(*) FROM made)",
        {
            "unit": "{" + ",".join(ids_of.values()) + "}",
            "nodes": _int_array(sorted(nodes)),
            "versions": _int_array(nodes[n] for n in sorted(nodes)),
            "cycle": cycle.pk,
            # created_at is the writing time, as auto_now_add sets it (the cycle's `now` may be
            # simulated).
            "at": timezone.now(),
            "a_task": _int_array(a[0] for a in assignments),
            "a_node": _int_array(a[1] for a in assignments),
            "a_borrowed": _bool_array(a[2] for a in assignments),
            # Elements are `{1,2}` quoted: digits, commas and braces only, so no escaping is needed.
            "a_units": "{" + ",".join(f'"{{{ids_of.get(a[0], "")}}}"' for a in assignments) + "}",
        },
    )

    def check() -> None:
        with cursor:
            taken, raised, made = cursor.fetchone()
        if taken or made != len(assignments):
            raise Conflict(f"{taken} of {binds} compute units were taken during the commit")
        if raised != len(nodes):
            raise Conflict(f"{len(nodes) - raised} of {len(nodes)} nodes changed since the snapshot")

    if deferred is None:
        check()
    else:
        deferred.append(check)


def _write_placements_orm(
    *,
    held: Mapping[int, Sequence[int]],
    nodes: set[int],
    assignments: Sequence[tuple[int, int, bool]],
    cycle: Cycle,
) -> None:
    holders = unit_holders(node_ids={node for _, node, _ in assignments})
    taken = sum(1 for ids in held.values() for unit_id in ids if unit_id in holders)
    if taken:
        binds = sum(len(ids) for ids in held.values())
        raise Conflict(f"{taken} of {binds} compute units were taken during the commit")
    Node.objects.filter(pk__in=nodes).update(version=F("version") + 1)
    Assignment.objects.bulk_create(
        [
            Assignment(task_id=t, node_id=n, cycle=cycle, borrowed=b, unit_ids=list(held.get(t, ())))
            for t, n, b in assignments
        ]
    )


def _write_why_pending(
    snapshot: PoolSnapshot, reasons: dict[str, tuple[str, str]], estimates: dict[str, float | None]
) -> None:
    """Latest reason and estimated start of every task the cycle left pending, in their TaskWait rows.

    Written whatever the task's state now: a task that moved on since the snapshot keeps a row nobody
    reads (Task.why_pending shows it only while the task is pending) and the next move into pending
    rewrites it."""
    if not reasons:
        return
    ids = [snapshot.pending[t].pk for t in reasons]
    codes = [code for code, _ in reasons.values()]
    sentences = [message[:500] for _, message in reasons.values()]
    etas = [
        datetime.fromtimestamp(estimates[t], UTC) if estimates.get(t) is not None else None for t in reasons
    ]
    if connection.vendor == "postgresql":
        # The rows go as one JSON document: psycopg dumps a list of strings element by element in Python
        # (a regular expression each), json.dumps in C; a third of the commit's client CPU went there.
        rows = json.dumps(
            [
                {"id": pk, "why": why, "code": code, "eta": eta.isoformat() if eta else None}
                for pk, why, code, eta in zip(ids, sentences, codes, etas, strict=True)
            ]
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TaskWait._meta.db_table} AS w (task_id, why, code, start_at) "
                "SELECT v.id, v.why, v.code, v.eta "
                "FROM json_to_recordset(%s::json) AS v(id bigint, why text, code text, eta timestamptz) "
                "ON CONFLICT (task_id) DO UPDATE SET why = EXCLUDED.why, code = EXCLUDED.code, "
                "start_at = EXCLUDED.start_at "
                # A task still waiting for the same reason keeps its row version: a pool's backlog is
                # mostly the same from one cycle to the next.
                "WHERE (w.why, w.code, w.start_at) IS DISTINCT FROM (EXCLUDED.why, EXCLUDED.code, "
                "EXCLUDED.start_at)",
                [rows],
            )
        return
    task_waits_write(
        [
            TaskWait(task_id=pk, why=why, code=code, start_at=eta)
            for pk, why, code, eta in zip(ids, sentences, codes, etas, strict=True)
        ]
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off for one cycle (it is enabled again after, if it was).

    A cycle over a large pool allocates about a million short-lived objects (rows, requests, free units,
    decisions), almost none in reference cycles: refcounting frees them, while the collector's young
    passes would scan them over and over (docs/notes/cycle-speed.md). Whatever cyclic garbage one cycle
    makes waits until it ends.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _try_lock(pool_id: int) -> bool:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_CLASS, pool_id])
            return bool(cursor.fetchone()[0])
    return True


def _cycle_settings() -> None:
    """Sort and hash memory, and no JIT, for this cycle's transaction only (`SET LOCAL`).

    The snapshot joins every compute unit of the pool to its holder: at the server's default (4 MB) a
    large pool's hash of them goes to disk in batches, and a sort of them would sort on disk.
    One cycle per pool runs at a time, so the memory is bounded by the pools, not by the requests.
    A large backlog's pending read is costed above the server's JIT threshold, and compiling it is a
    large part of a query that runs once per cycle: time the cycle waits on, since this process reads
    nothing else meanwhile. The figures are in docs/notes/cycle-speed.md.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL work_mem = '{CYCLE_WORK_MEM}'")
            cursor.execute("SET LOCAL jit = off")


def _totals_add(pool_id: int, *, considered: int, placed: int, preempted: int, conflicts: int) -> None:
    """Add one cycle to the pool's running totals (the operators' counters), in the cycle's transaction."""
    increments = {
        "cycles": F("cycles") + 1,
        "tasks_considered": F("tasks_considered") + considered,
        "tasks_placed": F("tasks_placed") + placed,
        "tasks_preempted": F("tasks_preempted") + preempted,
        "conflicts": F("conflicts") + conflicts,
    }
    if PoolCycleTotals.objects.filter(pool_id=pool_id).update(**increments):
        return
    try:
        with transaction.atomic():
            PoolCycleTotals.objects.create(
                pool_id=pool_id,
                cycles=1,
                tasks_considered=considered,
                tasks_placed=placed,
                tasks_preempted=preempted,
                conflicts=conflicts,
            )
    except IntegrityError:
        # A cycle without the advisory lock (tests) created the row first: add to it instead.
        PoolCycleTotals.objects.filter(pool_id=pool_id).update(**increments)


def cycle_run(
    *, pool_id: int, policy: str | None = None, now: datetime | None = None, lock: bool = True
) -> CycleReport:
    """One cycle over one pool. `lock=False` skips the advisory lock (tests prove the CAS alone holds).

    Phases (`_cycle`), after the pool's lock (else "busy"): 1. input (`cycle_input`); 2. decide; 3. commit,
    the why-pending and estimated starts of what stays pending with it; 4. the cycle record.
    """
    policy = policy or settings.WHALEGEN_CYCLE_POLICY
    now = now or timezone.now()
    local = _local_lock(pool_id) if connection.vendor != "postgresql" and lock else None
    if local is not None and not local.acquire(blocking=False):
        return CycleReport(status="busy", pool_id=pool_id)
    try:
        # The collector comes back only once `_cycle`'s frame is gone: its snapshot and decisions are
        # freed by reference counting first. Enabled while they were alive, its first young pass would
        # walk them all (docs/notes/cycle-speed.md).
        with gc_paused():
            return _cycle(pool_id, policy, now, lock)
    finally:
        if local is not None:
            local.release()


@dataclass
class _Clock:
    """Wall and CPU milliseconds of a cycle's phases (`snapshot`, `solve`, `commit`), lap by lap."""

    wall_ms: dict[str, float] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    wall_mark: float = field(default_factory=time.perf_counter)
    cpu_mark: float = field(default_factory=time.process_time)

    def lap(self, phase: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.wall_ms[phase] = (wall - self.wall_mark) * 1000
        self.cpu_ms[phase] = round((cpu - self.cpu_mark) * 1000, 1)
        self.wall_mark, self.cpu_mark = wall, cpu

    def move(self, commit: _Commit, phases: Iterable[str], *, to: str, away: str) -> None:
        """Count the commit's `phases` under `to` instead of `away`."""
        for phase in phases:
            self.wall_ms[to] += commit.phases_ms.get(phase, 0.0)
            self.wall_ms[away] -= commit.phases_ms.get(phase, 0.0)
            self.cpu_ms[to] += commit.phases_cpu_ms.get(phase, 0.0)
            self.cpu_ms[away] -= commit.phases_cpu_ms.get(phase, 0.0)


@dataclass(frozen=True)
class _Committed:
    """What phase 3 of a cycle wrote, for the record."""

    commit: _Commit
    before: ClusterFragmentation  # the pool's fragmentation before the cycle, against its shape mix
    after: ClusterFragmentation  # and after its decisions
    precarved: int  # GPUs re-carved ahead of the forecast


def _cycle(pool_id: int, policy: str, now: datetime, lock: bool) -> CycleReport:
    """`cycle_run`'s phases, in one transaction, with the collector held off by the caller."""
    with transaction.atomic():
        # 0. One cycle per pool at a time; the lock goes with the transaction.
        if lock and not _try_lock(pool_id):
            return CycleReport(status="busy", pool_id=pool_id)
        _cycle_settings()
        clock = _Clock()
        # 1. Input: the pool's snapshot made ready for the policy (profiles, shape mix, reserve, forecast).
        given = cycle_input(pool_id, now, policy)
        clock.lap("snapshot")
        # 2. Decide: in three parts, which the commit drives (`_decide_and_commit`).
        decider = Decider(given.pure, given.config)
        clock.lap("solve")
        # 3. Commit.
        cycle = Cycle.objects.create(pool_id=pool_id, policy=policy, started_at=now)  # the events name it
        committed = _decide_and_commit(given, decider, cycle, now)
        clock.lap("commit")
        # `decide`'s parts ran inside the commit: they count as solving.
        clock.move(committed.commit, ("decide_begin", "decide_finish"), to="solve", away="commit")
        # 4. Record.
        report = _cycle_record(given, cycle, committed, clock)
        closing = time.perf_counter()
    # The database's COMMIT (the writes themselves were timed in the commit's phases).
    return replace(report, transaction_commit_ms=round((time.perf_counter() - closing) * 1000, 1))


def _decide_and_commit(given: CycleInput, decider: Decider, cycle: Cycle, now: datetime) -> _Committed:
    """Run `decide` and write what it decided, then the re-carves it proposed ahead of the forecast.

    `decide` runs in three parts: the engine's pass while the commit sends its tasks' moves, the rest
    (units, re-carves, reasons) while the server moves the last of them, the estimates while it writes
    the rest (`_commit`)."""
    now_s = now.timestamp()
    measured: list[ClusterFragmentation] = []

    def measure(explained: Decisions) -> None:  # the pool's fragmentation before and after
        measured.append(cluster_fragmentation(nodes_before(given.pure), given.mix))
        measured.append(cluster_fragmentation(explained.nodes_after, given.mix))

    commit = _commit(
        given.snapshot,
        cycle,
        now,
        begin=lambda placed: decider.begin(
            given.pure.cluster.pending, now_s, on_placed=placed, batch=STREAM_CHUNK
        ),
        finish=lambda: decider.finish(now_s, estimates=False, nodes_after=False),
        explain=lambda placed: decider.explain(placed, now_s),
        measure=measure,
        reason_of=decider.placement_reason,
    )
    before, after = measured
    precarved = precarves_commit(given.snapshot, commit.decisions, cycle, now)
    return _Committed(commit=commit, before=before, after=after, precarved=precarved)


def _cycle_record(given: CycleInput, cycle: Cycle, committed: _Committed, clock: _Clock) -> CycleReport:
    """Finish the cycle's record and add it to the pool's totals; the report for the caller. The why-pending
    of everything `decide` or the commit left behind is written by the commit."""
    snapshot, commit = given.snapshot, committed.commit
    by_code: dict[str, int] = defaultdict(int)
    for code, _ in commit.reasons.values():
        by_code[code] += 1
    considered = len(snapshot.cluster.pending) + len(snapshot.claimed_requests)
    Cycle.objects.filter(pk=cycle.pk).update(
        finished_at=timezone.now(),
        tasks_considered=considered,
        tasks_placed=commit.placed,
        tasks_preempted=commit.preempted,
        conflicts=commit.conflicts,
        snapshot_ms=clock.wall_ms["snapshot"],
        solve_ms=clock.wall_ms["solve"],
        commit_ms=clock.wall_ms["commit"],
        stats={
            "nodes": len(snapshot.cluster.nodes),
            "nodes_excluded": dict(snapshot.excluded_nodes),
            "running": len(snapshot.cluster.running),
            "unplaced_by_reason": dict(by_code),
            "fragmentation_before": _frag(committed.before),
            "fragmentation_after": _frag(committed.after),
            "commit_phases_ms": commit.phases_ms,
            "commit_phases_cpu_ms": commit.phases_cpu_ms,
            # Why the unlocked commit was rolled back for the locked one (None: it held, or none ran).
            "commit_unlocked_missed": commit.unlocked_missed or None,
            "cpu_ms": clock.cpu_ms,
            "precarved": committed.precarved,
            "shape_mix_source": given.steer.source,
            "shape_mix_reason": given.steer.reason,
            "shape_mix": [
                [sh.num_gpu, sh.gpu_milli, round(w, 4)]
                for sh, w in zip(given.mix.shapes, given.mix.weights, strict=True)
            ],
        },
    )
    _totals_add(
        snapshot.pool_id,
        considered=considered,
        placed=commit.placed,
        preempted=commit.preempted,
        conflicts=commit.conflicts,
    )
    return CycleReport(
        status="done",
        pool_id=snapshot.pool_id,
        cycle_id=cycle.pk,
        placed=commit.placed,
        preempted=commit.preempted,
        unplaced=len(commit.reasons),
        conflicts=commit.conflicts,
    )


def _frag(value: ClusterFragmentation) -> dict[str, float]:
    return {
        "frag_milli": round(value.frag_milli, 1),
        "idle_milli": value.idle_milli,
        "capacity_milli": value.capacity_milli,  # the pool's history page charts allocation from these
        "amount_pct": round(value.amount_pct, 3),
    }
