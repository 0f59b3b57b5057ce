"""What each policy would decide for a pool right now: `whalegen replay --from-pool NAME` and the
dashboard's what-if page.

Each policy decides on the input its own cycle would (`apps.scheduling.snapshot.policy_input`: profiles,
shape mix, online reserve, pre-carve forecast), all from one read of the pool, with the same `decide`;
nothing is committed. The reads run in a transaction that is rolled back, so even a cache or bookkeeping
write on the way could not stay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.inventory.models import ComputeUnit, Pool
from apps.scheduling.snapshot import policy_input, snapshot_for_pool
from apps.workloads.models import Task
from whalegen.forecast.online_reserve import gpus_text
from whalegen.placement.fragmentation import cluster_fragmentation
from whalegen.scheduling import Config, Decisions, decide, nodes_before


class UnknownPool(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f"no pool named {name!r} (pools: {listed})")


@dataclass(frozen=True)
class PolicyWhatIf:
    policy: str
    decisions: Decisions
    frag_before_pct: float
    frag_after_pct: float


@dataclass(frozen=True)
class WhatIf:
    pool: str
    now: datetime
    configured_policy: str
    pending: int
    running: int
    runs: tuple[PolicyWhatIf, ...]
    task_names: dict[str, str] = field(default_factory=dict)  # task id → "name (tenant)"
    unit_names: dict[int, str] = field(default_factory=dict)  # unit id → "mig 3g.40gb@4" …
    task_tenants: dict[str, int] = field(default_factory=dict)  # task id → tenant id, for who may see it
    online_reserve: str = ""  # what the pool keeps idle for online tasks and why; "" = nothing

    def as_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "now": self.now.isoformat(),
            "configured_policy": self.configured_policy,
            "pending": self.pending,
            "running": self.running,
            "online_reserve": self.online_reserve,
            "policies": [
                {
                    "policy": r.policy,
                    "placements": [
                        {
                            "task": b.task_id,
                            "name": self.task_names.get(b.task_id, ""),
                            "node": b.placement.node,
                            "gpus": list(b.placement.gpu_indexes),
                            "unit_ids": list(b.unit_ids),
                            "units": [self.unit_names.get(u, str(u)) for u in b.unit_ids],
                            "borrowed": b.placement.borrowed,
                        }
                        for b in r.decisions.placements
                    ],
                    "preemptions": [
                        {"victim": p.victim_task_id, "node": p.node, "for": p.for_task_id, "reason": p.reason}
                        for p in r.decisions.preemptions
                    ],
                    "layouts": [
                        {"node": plan.gpu[0], "gpu": plan.gpu[1], "layout": plan.plan.text}
                        for plan in r.decisions.layouts
                    ],
                    "unplaced": [
                        {"task": t, "code": reason.code, "reason": reason.message}
                        for t, reason in sorted(r.decisions.unplaced.items())
                    ],
                    "fragmentation_before_pct": round(r.frag_before_pct, 3),
                    "fragmentation_after_pct": round(r.frag_after_pct, 3),
                }
                for r in self.runs
            ],
        }


def waits_in_order(decisions: Decisions) -> list[tuple[str, Any]]:
    """(task id, reason) of every task a decision leaves waiting, by task id: the order lists show."""
    return sorted(decisions.unplaced.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)


def pool_whatif(
    *, pool_name: str, policies: list[str], now: datetime | None = None, named_rows: int | None = None
) -> WhatIf:
    """Every listed policy's decision on the pool's current snapshot; writes nothing.

    `named_rows`: look up the names of only the tasks and units in each policy's first `named_rows`
    placements and waits (what a page lists). None names every task, as the terminal report prints all
    of them; on 10,000 pending tasks that one read of every id was a third of the request."""
    pool = Pool.objects.filter(name=pool_name).first()
    if pool is None:
        raise UnknownPool(pool_name, list(Pool.objects.order_by("name").values_list("name", flat=True)))
    now = now or timezone.now()
    with transaction.atomic():
        # 1. One read of the pool, as the cycle reads it.
        snapshot = snapshot_for_pool(pool.pk, now)
        # 2. One decision per policy, on the input its cycle would decide on.
        runs: list[PolicyWhatIf] = []
        reserve = ""  # what the pool keeps for online tasks, whatever the policy
        for policy in policies:
            given = policy_input(snapshot, policy)
            decisions = decide(given.pure, given.config, now.timestamp())
            before = cluster_fragmentation(nodes_before(given.pure), given.mix).amount_pct
            after = cluster_fragmentation(decisions.nodes_after, given.mix).amount_pct
            runs.append(PolicyWhatIf(policy, decisions, before, after))
            reserve = reserve_text(given.config)
        # 3. Names to show: tasks and the units placements name.
        if named_rows is None:
            ids = set(snapshot.pending) | set(snapshot.running) | set(snapshot.claimed_requests)
            placements = [b for r in runs for b in r.decisions.placements]
        else:
            placements = [b for r in runs for b in r.decisions.placements[:named_rows]]
            ids = {b.task_id for b in placements}
            ids |= {t for r in runs for t, _ in waits_in_order(r.decisions)[:named_rows]}
        task_names: dict[str, str] = {}
        task_tenants: dict[str, int] = {}
        for pk, name, tenant, tenant_id in Task.objects.filter(
            pk__in=[int(t) for t in ids if t.isdigit()]
        ).values_list("pk", "name", "tenant__slug", "tenant_id"):
            task_names[str(pk)] = f"{name or 'task ' + str(pk)} ({tenant})"
            task_tenants[str(pk)] = tenant_id
        unit_ids = {u for b in placements for u in b.unit_ids}
        unit_names = {
            pk: f"{kind} {profile}@{start}" if kind == ComputeUnit.Kind.MIG else f"{kind} {milli}"
            for pk, kind, profile, start, milli in ComputeUnit.objects.filter(pk__in=unit_ids).values_list(
                "pk", "kind", "mig_profile", "mig_start", "gpu_milli"
            )
        }
        transaction.set_rollback(True)
    return WhatIf(
        pool=pool.name,
        now=now,
        configured_policy=settings.WHALEGEN_CYCLE_POLICY,
        pending=len(snapshot.cluster.pending),
        running=len(snapshot.cluster.running),
        runs=tuple(runs),
        task_names=task_names,
        unit_names=unit_names,
        task_tenants=task_tenants,
        online_reserve=reserve,
    )


def reserve_text(config: Config) -> str:
    """The online reserve a decision keeps, in words ("" when none)."""
    if not config.online_reserve_milli:
        return ""
    return config.online_reserve_why or f"{gpus_text(config.online_reserve_milli)} (static)"


def whatif_text(report: WhatIf) -> str:
    """The what-if for a terminal: per policy, placements, preemptions, layouts, unplaced, fragmentation."""
    lines = [
        f"pool {report.pool} at {report.now:%Y-%m-%d %H:%M:%S %Z}: {report.pending} pending, "
        f"{report.running} running; the cycle runs {report.configured_policy}. What each policy would do "
        "now (nothing is written):"
    ]
    if report.online_reserve:
        lines.append(f"online-service reserve kept idle: {report.online_reserve}")
    for r in report.runs:
        d = r.decisions
        mark = " (the cycle's policy)" if r.policy == report.configured_policy else ""
        lines += [
            "",
            f"== {r.policy}{mark}: {len(d.placements)} placed, {len(d.preemptions)} preempted, "
            f"{len(d.layouts)} layout changes, {len(d.unplaced)} not placed; fragmentation "
            f"{r.frag_before_pct:.2f} % -> {r.frag_after_pct:.2f} % of capacity",
        ]
        for b in d.placements:
            p = b.placement
            units = ", ".join(report.unit_names.get(u, str(u)) for u in b.unit_ids)
            lines.append(
                f"  place   {report.task_names.get(b.task_id, b.task_id)} [{b.task_id}] -> {p.node} GPU "
                f"{','.join(map(str, p.gpu_indexes))}: {units}{' (borrowed)' if p.borrowed else ''}"
            )
        for pre in d.preemptions:
            lines.append(
                f"  preempt {report.task_names.get(pre.victim_task_id, pre.victim_task_id)} on {pre.node} "
                f"for [{pre.for_task_id}]: {pre.reason}"
            )
        for plan in d.layouts:
            lines.append(f"  layout  {plan.gpu[0]} GPU {plan.gpu[1]} -> {plan.plan.text}")
        for task_id, reason in sorted(d.unplaced.items()):
            lines.append(
                f"  wait    {report.task_names.get(task_id, task_id)} [{task_id}] {reason.code}: "
                f"{reason.message}"
            )
    return "\n".join(lines)
