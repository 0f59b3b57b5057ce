"""When each task left pending could start, from when running tasks are expected to end.

A capacity view, not a replay: the first time at which the idle milli-GPU of the models a task may use,
plus what running tasks on those models free by then, covers what it asks for. A quota-bound task waits
for its own tenant's tasks instead. A running task's end is its start plus its P50 prediction, else its
max runtime, else its profile's P50 duration; a task placed this cycle ends after the same run time.
"unknown" only when nothing running with a known end can free what the task needs; the sentence then
says which of those it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from whalegen.placement.types import NodeState, Outcome, TaskRequest
from whalegen.scheduling.types import Bound, Code, Reason, Snapshot


@dataclass(frozen=True)
class Estimate:
    start_s: float | None
    why_unknown: str = ""  # when start_s is None and the reason alone does not say why


# No running task's end makes these placeable: only a new member, model, GPU mode or layout does (their
# reason already says which).
_NEVER_BY_ENDS = {
    Outcome.BUDGET_SPENT.value,  # no task's end gives GPU-hours back; the next period (or an admin) does
    Outcome.GANG_INCOMPLETE.value,
    Outcome.NO_ALLOWED_MODEL.value,
    Outcome.NO_ISOLATION.value,
    Code.NEEDS_LAYOUT,
}
_NOW = {Outcome.WAITING_FOR_PREEMPTION.value, Code.WAITING_FOR_LAYOUT}

_Curve = tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]


def _curve(ends: list[tuple[float, int]]) -> _Curve:
    ends = sorted(ends)
    return np.array([e for e, _ in ends], np.float64), np.cumsum([m for _, m in ends], dtype=np.int64)


def estimate_starts(
    snapshot: Snapshot,
    unplaced: Mapping[str, Reason],
    now_s: float,
    *,
    nodes_after: Sequence[NodeState],
    placements: Sequence[Bound],
    requests: Mapping[str, TaskRequest],
) -> dict[str, Estimate]:
    cluster = snapshot.cluster
    node_model = {n.name: n.model for n in cluster.nodes}
    idle_by_model: dict[str | None, int] = defaultdict(int)
    for node in nodes_after:
        if node.schedulable:
            idle_by_model[node.model] += sum(g.free_milli for g in node.gpus)
    ends_by_model: dict[str | None, list[tuple[float, int]]] = defaultdict(list)
    ends_by_tenant: dict[str, list[tuple[float, int]]] = defaultdict(list)
    held_by_model: dict[str | None, int] = defaultdict(int)  # milli held by tasks whose end is unknown
    for task in cluster.running:
        milli = task.gpu_milli * len(task.gpu_indexes)
        end = snapshot.expected_end_s.get(task.task_id)
        model = node_model.get(task.node)
        if end is None:
            held_by_model[model] += milli
            continue
        ends_by_model[model].append((end, milli))
        ends_by_tenant[task.tenant].append((end, milli))
    for bound in placements:
        placement = bound.placement
        request = requests[placement.task_id]
        milli = placement.unit.gpu_milli * len(placement.gpu_indexes)
        model = node_model.get(placement.node)
        runtime = snapshot.expected_runtime_s.get(placement.task_id)
        if runtime is None:
            held_by_model[model] += milli
            continue
        ends_by_model[model].append((now_s + runtime, milli))
        ends_by_tenant[request.tenant].append((now_s + runtime, milli))
    models = list(idle_by_model.keys() | ends_by_model.keys() | held_by_model.keys())
    curves: dict[frozenset[str], tuple[int, int, _Curve]] = {}
    tenant_curves = {tenant: _curve(ends) for tenant, ends in ends_by_tenant.items()}
    quota_of = {q.tenant: q for q in cluster.quotas}
    usage: dict[str, int] = defaultdict(int)
    for task in cluster.running:
        usage[task.tenant] += task.quota_milli
    for bound in placements:
        usage[requests[bound.task_id].tenant] += requests[bound.task_id].gpu_request_milli

    def first_time(curve: _Curve, short: int) -> float | None:
        if short <= 0:
            return now_s
        times, freed = curve
        k = int(np.searchsorted(freed, short, side="left"))
        return max(float(times[k]), now_s) if k < len(times) else None

    out: dict[str, Estimate] = {}
    for task_id, reason in unplaced.items():
        request = requests[task_id]
        need = request.gpu_request_milli
        if reason.code in _NEVER_BY_ENDS:
            out[task_id] = Estimate(None)
        elif reason.code in _NOW:
            out[task_id] = Estimate(now_s)
        elif reason.code == Outcome.QUOTA_EXCEEDED.value:
            quota = quota_of[request.tenant]
            short = usage[request.tenant] + need - quota.guaranteed_milli - quota.borrow_limit_milli
            curve = tenant_curves.get(request.tenant, (np.array([]), np.array([], np.int64)))
            start = first_time(curve, short)
            out[task_id] = Estimate(
                start,
                ""
                if start is not None
                else f"none of tenant {request.tenant}'s running tasks has a known end "
                "(no P50 prediction, max runtime or profile duration) that frees enough of its quota",
            )
        else:
            key = request.allowed_models
            if key not in curves:
                chosen = [m for m in models if not key or m in key]
                idle = sum(idle_by_model[m] for m in chosen)
                held = sum(held_by_model[m] for m in chosen)
                curves[key] = (idle, held, _curve([e for m in chosen for e in ends_by_model[m]]))
            idle, held, curve = curves[key]
            start = first_time(curve, need - idle)
            if start is not None:
                out[task_id] = Estimate(start)
            elif held:
                out[task_id] = Estimate(
                    None,
                    f"{held} milli-GPU it could use is held by tasks with no known end (no P50 "
                    "prediction, max runtime or profile duration)",
                )
            else:
                out[task_id] = Estimate(None, "nothing running on the GPUs it may use would free enough")
    return out
