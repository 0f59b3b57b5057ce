"""The what-if page's answer: decided once per scheduling cycle, off the request.

Deciding a pool of 10,000 pending tasks twice (the cycle's policy and another) takes seconds of CPU, too
long for a page. So the page answers at once from what is stored for the pool's newest cycle; when
nothing is stored yet it starts the decision — a Celery task by ids where the plane has a worker, a
thread of this process on the embedded default — and says it is computing, showing meanwhile the last
decision it has, labelled with its cycle. The page's live refresh (`live.js`) swaps the result in when
it is ready. What is stored is what the page draws (`summary`), as JSON: counts and reasons over every
task, the first `ROWS` placements and waits with their tasks' names and tenants, so a member's view
is filtered without another query.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections

from apps.dashboard import caching
from apps.scheduling.whatif import WhatIf, pool_whatif, waits_in_order

logger = logging.getLogger(__name__)

ROWS = 100  # placements and waits listed per policy; the counts and reasons cover all of them
DEADLINE_S = 300  # a decision not stored by then is started again by the next request
FAILED_TTL_S = 60  # a failed decision is shown for a minute, then tried again


@dataclass(frozen=True)
class CycleRef:
    """The cycle a decision is keyed on: its id, and its start so a reused id (a new database) is a new
    key."""

    id: int
    started_at: datetime


@dataclass(frozen=True)
class Answer:
    summary: dict[str, Any] | None  # the decision after the newest cycle, when stored
    earlier: dict[str, Any] | None  # meanwhile: the last decision stored for an earlier cycle
    computing: bool
    error: str = ""


def _key(pool_id: int, policies: tuple[str, ...], cycle: CycleRef) -> str:
    return f"whatif:{pool_id}:{cycle.id}@{cycle.started_at.timestamp():.6f}:{','.join(policies)}"


def _latest_key(pool_id: int, policies: tuple[str, ...]) -> str:
    return f"whatif-latest:{pool_id}:{','.join(policies)}"


def _claim_key(pool_id: int, policies: tuple[str, ...]) -> str:
    """One decision at a time per pool and policies: on a pool whose cycles come faster than a decision,
    an open page would otherwise start one per cycle; instead the next starts when this one is stored."""
    return f"whatif-claim:{pool_id}:{','.join(policies)}"


def summary(report: WhatIf, rows: int = ROWS) -> dict[str, Any]:
    """What the page draws of a decision, viewer-independent and JSON: per policy the totals, the waits
    by reason, and the first `rows` placements and waits (task id, where, detail)."""
    runs = []
    for run in report.runs:
        d = run.decisions
        by_reason: dict[str, int] = {}
        for reason in d.unplaced.values():
            by_reason[reason.code] = by_reason.get(reason.code, 0) + 1
        placed = []
        for bound in d.placements[:rows]:
            p = bound.placement
            units = ", ".join(report.unit_names.get(u, str(u)) for u in bound.unit_ids)
            where = f"{p.node} GPU {','.join(map(str, p.gpu_indexes))}"
            placed.append([bound.task_id, where, units + (" (borrowed)" if p.borrowed else "")])
        runs.append(
            {
                "policy": run.policy,
                "placed": placed,
                "waiting": [[t, reason.code, reason.message] for t, reason in waits_in_order(d)[:rows]],
                "placed_total": len(d.placements),
                "waiting_total": len(d.unplaced),
                "waiting_by_reason": sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])),
                "preempted": len(d.preemptions),
                "layouts": [f"{plan.gpu[0]} GPU {plan.gpu[1]} → {plan.plan.text}" for plan in d.layouts],
                "frag_before_pct": run.frag_before_pct,
                "frag_after_pct": run.frag_after_pct,
            }
        )
    return {
        "pool": report.pool,
        "now": report.now.isoformat(),
        "configured_policy": report.configured_policy,
        "pending": report.pending,
        "running": report.running,
        "online_reserve": report.online_reserve,
        "runs": runs,
        "names": report.task_names,
        "tenants": report.task_tenants,
    }


def decide_now(*, pool_name: str, policies: tuple[str, ...]) -> dict[str, Any]:
    """The decision computed here and now (a pool without a cycle yet: nothing to key it on)."""
    return summary(pool_whatif(pool_name=pool_name, policies=list(policies), named_rows=ROWS))


def decide_and_store(*, pool_id: int, policies: tuple[str, ...], cycle: CycleRef) -> None:
    """Decide the pool now and store the answer under the cycle's key (and as the pool's latest). A
    failure is stored too, for a minute, so the page says so instead of computing for ever."""
    from apps.inventory.models import Pool

    key = _key(pool_id, policies, cycle)
    try:
        if caching.get(key) is not None:
            return  # a second copy of the task (a redelivered message): the first one stored it
        name = Pool.objects.filter(pk=pool_id).values_list("name", flat=True).get()
        result = decide_now(pool_name=name, policies=policies)
        result["cycle_id"] = cycle.id
        result["cycle_started_at"] = cycle.started_at.isoformat()
        caching.put(key, result)
        caching.put(_latest_key(pool_id, policies), result)
    except Exception as exc:
        logger.exception("dashboard: the what-if of pool %s (%s) failed", pool_id, ",".join(policies))
        caching.put(key, {"error": f"{type(exc).__name__}: {exc}"[:300]}, ttl_s=FAILED_TTL_S)
    finally:
        caching.release(_claim_key(pool_id, policies))


def decide_cycle(*, pool_id: int, policies: tuple[str, ...], cycle_id: int) -> None:
    """`decide_and_store` for a cycle named by id (what the Celery task carries). A cycle that is gone
    (its pool deleted) is skipped, and the pool's claim released."""
    from apps.scheduling.models import Cycle

    cycles = Cycle.objects.filter(pk=cycle_id, pool_id=pool_id)
    started_at = cycles.values_list("started_at", flat=True).first()
    if started_at is None:
        caching.release(_claim_key(pool_id, policies))
        return
    decide_and_store(pool_id=pool_id, policies=policies, cycle=CycleRef(cycle_id, started_at))


def _decide_in_thread(pool_id: int, policies: tuple[str, ...], cycle: CycleRef) -> None:
    try:
        decide_and_store(pool_id=pool_id, policies=policies, cycle=cycle)
    finally:
        connections.close_all()  # this thread's own connections: nobody else would close them


def _start(pool_id: int, policies: tuple[str, ...], cycle: CycleRef) -> None:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        # The embedded default has no worker, and an eager task would hold this request for the whole
        # decision: a thread of the web process does it instead.
        threading.Thread(
            target=_decide_in_thread, args=(pool_id, policies, cycle), name="whalegen-whatif", daemon=True
        ).start()
        return
    from apps.dashboard.tasks import whatif_decide

    whatif_decide.delay(pool_id, list(policies), cycle.id)


def answer(*, pool_id: int, policies: tuple[str, ...], cycle: CycleRef) -> Answer:
    """The stored decision after `cycle`; else start it (once, whoever asks first) and answer with
    the latest earlier decision meanwhile. Where the decisions are kept cannot be reached (Redis is
    restarting, say), the page says so rather than failing."""
    try:
        return _answer(pool_id, policies, cycle)
    except caching.StoreUnavailable as exc:
        logger.warning("dashboard: the what-if store is unavailable: %s", exc)
        return Answer(None, None, False, f"the decisions' store (Redis) is not answering: {exc}")


def _answer(pool_id: int, policies: tuple[str, ...], cycle: CycleRef) -> Answer:
    key = _key(pool_id, policies, cycle)
    stored = caching.get(key)
    if stored is not None and "error" in stored:
        return Answer(None, caching.get(_latest_key(pool_id, policies)), False, stored["error"])
    if stored is not None:
        return Answer(stored, None, False)
    if caching.claim(_claim_key(pool_id, policies), DEADLINE_S):
        try:
            _start(pool_id, policies, cycle)
        except Exception as exc:  # the broker is down, say: say so, and let the next request try again
            logger.exception("dashboard: could not start the what-if of pool %s", pool_id)
            caching.release(_claim_key(pool_id, policies))
            return Answer(None, caching.get(_latest_key(pool_id, policies)), False, f"could not start: {exc}")
    return Answer(None, caching.get(_latest_key(pool_id, policies)), True)
