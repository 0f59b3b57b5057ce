"""Idle reclaim (docs/idle-reclaim.md): running tasks that hold GPUs and leave them idle are
flagged, their owners told once in the task's events, and — where the queue's `idle_reclaim` policy is
`preempt` — preempted so that pending work the pool could not place gets the GPUs.

One check per pool, in three phases:
1. Snapshot: the pool's idle tasks (one grouped query over telemetry, `selectors.tasks_idle`), the
   tasks flagged before, and the pending work the last cycle could not place for lack of capacity.
2. Decide (`reclaim_decide`, pure): which flagged tasks are preempted, which go to an admin (online SLA)
   and which stay, each "stay" with its reason.
3. Commit: flags set and cleared with compare-and-set updates (one event per flag, whoever runs the
   check), preemptions through the task state machine, reclaim requests through the approvals table.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.approvals.models import ReclaimRequest
from apps.fleet.selectors import tasks_busy, tasks_idle
from apps.inventory.models import ComputeUnit
from apps.scheduling.selectors import held_unit_ids
from apps.workloads.models import Queue, Task
from apps.workloads.services import IDLE_ACTOR, task_note, task_preempt_idle

log = logging.getLogger("whalegen.idle")

ACTOR = IDLE_ACTOR
# why_pending_code values of pending work that more GPUs would let in (whalegen.placement.types.Outcome).
WANTS_CAPACITY = ("no_capacity", "gang_unplaceable")


@dataclass(frozen=True)
class IdleConfig:
    after_s: float  # WHALEGEN_IDLE_AFTER_S
    util_pct: int  # WHALEGEN_IDLE_UTIL_PCT: a sample at or above this is busy
    sample_s: float  # WHALEGEN_TELEMETRY_SAMPLE_S: how often telemetry is kept, for the coverage slack

    @classmethod
    def from_settings(cls) -> IdleConfig:
        return cls(
            after_s=settings.WHALEGEN_IDLE_AFTER_S,
            util_pct=settings.WHALEGEN_IDLE_UTIL_PCT,
            sample_s=settings.WHALEGEN_TELEMETRY_SAMPLE_S,
        )

    def describe(self) -> str:
        return (
            f"every GPU it holds stayed below {self.util_pct}% SM utilisation for {self.after_s / 60:g} min"
        )


@dataclass(frozen=True)
class Holder:
    """A flagged task as the decision sees it."""

    task_id: int
    policy: str  # Queue.IdleReclaim
    preemptible: bool
    online: bool
    gpu_count: int
    gpu_milli: int  # per GPU
    models: frozenset[str]  # GPU models it holds


@dataclass(frozen=True)
class Want:
    """Pending work the last cycle could not place for lack of capacity."""

    task_id: int
    gpu_count: int
    gpu_milli: int
    allowed_models: frozenset[str]  # empty: any


class Verdict:
    PREEMPT = "preempt"
    ASK_ADMIN = "ask_admin"
    KEEP = "keep"


@dataclass(frozen=True)
class Decision:
    task_id: int
    verdict: str
    reason: str
    for_task_id: int | None = None


def _fits(want: Want, holder: Holder) -> bool:
    if want.allowed_models and not (want.allowed_models & holder.models):
        return False
    return want.gpu_count <= holder.gpu_count and want.gpu_milli <= holder.gpu_milli


def reclaim_decide(holders: Iterable[Holder], wants: list[Want]) -> list[Decision]:
    """Which flagged tasks to reclaim. Each pending task frees at most one holder: the first (oldest
    flag first, as `holders` comes) whose GPUs it could use. Online-SLA holders go to an admin instead."""
    decisions = []
    unclaimed = list(wants)
    for holder in holders:
        if holder.policy != Queue.IdleReclaim.PREEMPT:
            decisions.append(Decision(holder.task_id, Verdict.KEEP, f"queue policy is {holder.policy}"))
            continue
        if not holder.preemptible:
            decisions.append(Decision(holder.task_id, Verdict.KEEP, "not preemptible"))
            continue
        want = next((w for w in unclaimed if _fits(w, holder)), None)
        if want is None:
            decisions.append(Decision(holder.task_id, Verdict.KEEP, "no pending work could use its GPUs"))
            continue
        unclaimed.remove(want)
        verdict = Verdict.ASK_ADMIN if holder.online else Verdict.PREEMPT
        reason = f"pending task {want.task_id} could use its GPUs"
        decisions.append(Decision(holder.task_id, verdict, reason, for_task_id=want.task_id))
    return decisions


@dataclass
class IdleCheck:
    """What one pool's check did (the Celery task returns it as a dict)."""

    pool_id: int
    flagged: list[int] = field(default_factory=list)
    cleared: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    requested: list[int] = field(default_factory=list)  # reclaim requests raised (task ids)
    kept: dict[int, str] = field(default_factory=dict)


def _note(task_id: int, reason: str) -> None:
    task_note(task_id=task_id, actor=ACTOR, reason=reason)


def _consequence(policy: str, *, preemptible: bool, online: bool) -> str:
    if policy != Queue.IdleReclaim.PREEMPT:
        return "it keeps its GPUs (queue policy notify)"
    if not preemptible:
        return "it keeps its GPUs: it is not preemptible"
    if online:
        return "an online-SLA task: if pending work needs the GPUs, a platform admin decides on reclaiming it"
    return "it will be preempted if pending work needs the GPUs"


def idle_check_pool(
    *, pool_id: int, now: datetime | None = None, config: IdleConfig | None = None
) -> IdleCheck:
    """Flag, unflag and reclaim one pool's idle tasks. Idempotent and safe to run concurrently: flags are
    compare-and-set (the winner writes the one event), preemptions go through the state machine."""
    now = now or timezone.now()
    config = config or IdleConfig.from_settings()
    out = IdleCheck(pool_id=pool_id)

    # 1. Snapshot.
    idle = tasks_idle(
        pool_id=pool_id, now=now, after_s=config.after_s, util_pct=config.util_pct, sample_s=config.sample_s
    )
    flagged_before = set(
        Task.objects.filter(pool_id=pool_id, idle_flagged_at__isnull=False).values_list("pk", flat=True)
    )
    # 2. Clear flags that no longer hold: the task stopped running, or a sample shows its GPUs busy. A
    # flagged task that is merely not judged idle now (its samples stopped or do not cover the window)
    # keeps its flag: no evidence either way is no verdict, not "busy again".
    not_idle = flagged_before - idle
    still_running = set(
        Task.objects.filter(pk__in=not_idle, state=Task.State.RUNNING).values_list("pk", flat=True)
    )
    since = now - timedelta(seconds=config.after_s)
    busy = tasks_busy(task_ids=still_running, since=since, util_pct=config.util_pct)
    _unflag((not_idle - still_running) | busy, now=now, out=out)
    # 3. Flag the newly idle.
    rows = _idle_rows(idle)
    _flag(rows, idle - flagged_before, pool_id=pool_id, now=now, config=config, out=out)
    # 4. Decide what to reclaim, oldest flag first.
    candidates = [r for r in rows.values() if r["idle_flagged_at"] is not None]
    candidates.sort(key=lambda r: (r["idle_flagged_at"], r["pk"]))
    holders, wants = _reclaim_inputs(pool_id=pool_id, candidates=candidates, now=now, out=out)
    # 5. Commit.
    attempts = {c["pk"]: c["attempts"] for c in candidates}
    _reclaim_commit(reclaim_decide(holders, wants), attempts=attempts, config=config, now=now, out=out)
    return out


def _unflag(task_ids: set[int], *, now: datetime, out: IdleCheck) -> None:
    """Clear the flags of tasks that got busy or stopped running (requeued, finished), and withdraw
    their pending reclaim requests."""
    for task_id in sorted(task_ids):
        if Task.objects.filter(pk=task_id, idle_flagged_at__isnull=False).update(idle_flagged_at=None) == 1:
            out.cleared.append(task_id)
            if Task.objects.filter(pk=task_id, state=Task.State.RUNNING).exists():
                _note(task_id, "no longer idle: its GPUs are busy again")
    ReclaimRequest.objects.filter(state=ReclaimRequest.State.PENDING, task_id__in=task_ids).update(
        state=ReclaimRequest.State.WITHDRAWN, decided_at=now, comment="the task got busy or stopped running"
    )


def _idle_rows(idle: set[int]) -> dict[int, dict[str, Any]]:
    """The idle tasks as the flags and the decision read them, by task id."""
    return {
        row["pk"]: row
        for row in Task.objects.filter(pk__in=idle).values(
            "pk", "preemptible", "sla_class", "gpu_count", "gpu_milli", "attempts", "idle_flagged_at",
            policy=F("queue__idle_reclaim"),
        )
    }  # fmt: skip


def _flag(
    rows: dict[int, dict[str, Any]],
    task_ids: set[int],
    *,
    pool_id: int,
    now: datetime,
    config: IdleConfig,
    out: IdleCheck,
) -> None:
    """Flag the newly idle: one event each, written by whichever check wins the compare-and-set. A row
    flagged here gets its flag time, so the decision sees it."""
    for task_id in sorted(task_ids):
        row = rows.get(task_id)
        if row is None:
            continue
        won = Task.objects.filter(pk=task_id, state=Task.State.RUNNING, idle_flagged_at__isnull=True).update(
            idle_flagged_at=now
        )
        if won != 1:
            continue
        row["idle_flagged_at"] = now
        out.flagged.append(task_id)
        then = _consequence(
            row["policy"], preemptible=row["preemptible"], online=row["sla_class"] == "online"
        )
        _note(task_id, f"flagged idle: {config.describe()}; {then}")
        log.info("task %s flagged idle", task_id, extra={"task_id": task_id, "pool": pool_id})


def _reclaim_inputs(
    *, pool_id: int, candidates: list[dict[str, Any]], now: datetime, out: IdleCheck
) -> tuple[list[Holder], list[Want]]:
    """The flagged tasks (`candidates`, oldest flag first) as holders, and the pending work that could
    use their GPUs. Online holders already asked about this run are kept, and left out."""
    # Only preemptible tasks of preempting queues can be reclaimed: the reads below are for them alone.
    wanted = [c["pk"] for c in candidates if c["policy"] == Queue.IdleReclaim.PREEMPT and c["preemptible"]]
    models: dict[int, set[str]] = defaultdict(set)
    wants: list[Want] = []
    if wanted:
        models = _held_models(wanted)
        wants = _pending_wants(pool_id=pool_id, now=now)
    holders = [
        Holder(
            task_id=c["pk"],
            policy=c["policy"],
            preemptible=c["preemptible"],
            online=c["sla_class"] == Task.SlaClass.ONLINE,
            gpu_count=c["gpu_count"],
            gpu_milli=c["gpu_milli"],
            models=frozenset(models[c["pk"]]),
        )
        for c in candidates
    ]
    attempts = {c["pk"]: c["attempts"] for c in candidates}
    asked = _asked_this_run([h.task_id for h in holders if h.online and h.task_id in wanted], attempts)
    for task_id in asked:
        out.kept[task_id] = "a reclaim request for this run exists"
    return [h for h in holders if h.task_id not in asked], wants


def _held_models(task_ids: list[int]) -> defaultdict[int, set[str]]:
    """The GPU models each task's compute units are on."""
    models: defaultdict[int, set[str]] = defaultdict(set)
    held = held_unit_ids(task_ids=task_ids)
    model_of = dict(
        ComputeUnit.objects.filter(pk__in=[u for ids in held.values() for u in ids]).values_list(
            "id", "gpu__model"
        )
    )
    for task_id, unit_ids in held.items():
        models[task_id].update(model_of[u] for u in unit_ids if u in model_of)
    return models


def _pending_wants(*, pool_id: int, now: datetime) -> list[Want]:
    """Pending work the last cycle could not place for lack of capacity, in the cycle's order."""
    return [
        Want(task_id=pk, gpu_count=count, gpu_milli=milli, allowed_models=frozenset(allowed or ()))
        for pk, count, milli, allowed in Task.objects.filter(
            pool_id=pool_id, state=Task.State.PENDING, wait__code__in=WANTS_CAPACITY
        )
        .filter(Q(not_before_at__isnull=True) | Q(not_before_at__lte=now))
        .order_by("-priority", "created_at", "pk")
        .values_list("pk", "gpu_count", "gpu_milli", "allowed_gpu_models")[:1000]
    ]


def _asked_this_run(online: list[int], attempts: dict[int, int]) -> set[int]:
    """An online task whose current run has had a request (pending, rejected…) is not asked about
    again, and claims no pending work meanwhile."""
    if not online:
        return set()
    return {
        task_id
        for task_id, attempt in ReclaimRequest.objects.filter(task_id__in=online).values_list(
            "task_id", "attempt"
        )
        if attempts[task_id] == attempt
    }


def _reclaim_commit(
    decisions: list[Decision],
    *,
    attempts: dict[int, int],
    config: IdleConfig,
    now: datetime,
    out: IdleCheck,
) -> None:
    """Keep, preempt through the state machine, or raise a reclaim request for an admin."""
    for decision in decisions:
        if decision.verdict == Verdict.KEEP:
            out.kept[decision.task_id] = decision.reason
        elif decision.verdict == Verdict.PREEMPT:
            task = Task.objects.get(pk=decision.task_id)
            reason = f"reclaimed while idle ({config.describe()}): {decision.reason}"
            if task.state == Task.State.RUNNING and task_preempt_idle(task=task, reason=reason, now=now):
                out.preempted.append(decision.task_id)
        elif _reclaim_request_raise(
            task_id=decision.task_id, attempt=attempts[decision.task_id], config=config, why=decision.reason
        ):
            out.requested.append(decision.task_id)


def _reclaim_request_raise(*, task_id: int, attempt: int, config: IdleConfig, why: str) -> bool:
    """One request per (task, attempt): False when this run of the task has had one (decided or not)."""
    reason = f"idle ({config.describe()}); {why}"
    try:
        with transaction.atomic():
            request = ReclaimRequest.objects.create(task_id=task_id, attempt=attempt, reason=reason[:500])
    except IntegrityError:
        return False
    _note(
        task_id,
        f"reclaim request {request.pk} raised: online SLA, a platform admin decides whether it is preempted",
    )
    return True
