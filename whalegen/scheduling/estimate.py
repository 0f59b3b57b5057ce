"""When each task left pending could start, from when running tasks are expected to end and what the
tasks ahead of it in the queue take first.

A capacity view, not a replay: the pending tasks are walked in the decision's order (`order_key`), each
served at the first time, no earlier than the task ahead of it, at which the idle milli-GPU of the models
it may use plus what has been freed by then covers what it asks for; it then holds that capacity for its
own expected run time (for ever when that is unknown), so the tasks behind it wait for it too. Freed
capacity comes from running tasks' expected ends and from the served tasks' ends. Without the queue, a
task was shown the first time the running tasks alone free enough, which under load is the time the
tasks ahead of it start, not its own (docs/forecasting.md, goal 4). A quota-bound task waits for its own
tenant's tasks instead and is not walked; a task no schedulable node could hold whole, even empty, has no
estimate (summed capacity would give it one). A running task's end is its start plus its P50 prediction, else
its max runtime, else its profile's P50 duration; a task placed or pending this cycle runs for the same
run time once it starts. "unknown" only when nothing with a known end can free what the task needs; the
sentence then says which of those it is.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
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
    # 1. What each GPU model has idle after the cycle, and what frees when.
    idle_by_model, ends_by_model, held_by_model = _capacity_by_model(
        snapshot, now_s, nodes_after=nodes_after, placements=placements
    )
    # 2. Tasks answered without the queue: never by ends, now, by their quota, or never fits.
    out, queue = _answer_or_queue(snapshot, unplaced, now_s, placements=placements, requests=requests)
    # 3. The rest walked in the decision's order; a stable sort keeps the given order among equal keys
    #    (a gang's members).
    queue.sort(key=lambda t: t.order_key or 0)
    out.update(
        queue_starts(
            queue,
            idle_by_model,
            ends_by_model,
            held_by_model,
            lambda t: snapshot.expected_runtime_s.get(t),
            now_s,
        )
    )
    return out


def _capacity_by_model(
    snapshot: Snapshot, now_s: float, *, nodes_after: Sequence[NodeState], placements: Sequence[Bound]
) -> tuple[dict[str | None, int], dict[str | None, list[tuple[float, int]]], dict[str | None, int]]:
    """Per GPU model: idle milli on schedulable nodes after the cycle, (expected end, milli) of the
    running tasks and this cycle's placements, and milli held by tasks whose end is unknown."""
    node_model = {n.name: n.model for n in snapshot.cluster.nodes}
    idle_by_model: dict[str | None, int] = defaultdict(int)
    for node in nodes_after:
        if node.schedulable:
            idle_by_model[node.model] += sum(g.free_milli for g in node.gpus)
    ends_by_model: dict[str | None, list[tuple[float, int]]] = defaultdict(list)
    held_by_model: dict[str | None, int] = defaultdict(int)
    for task in snapshot.cluster.running:
        milli = task.gpu_milli * len(task.gpu_indexes)
        end = snapshot.expected_end_s.get(task.task_id)
        model = node_model.get(task.node)
        if end is None:
            held_by_model[model] += milli
            continue
        ends_by_model[model].append((end, milli))
    for bound in placements:
        placement = bound.placement
        milli = placement.unit.gpu_milli * len(placement.gpu_indexes)
        model = node_model.get(placement.node)
        runtime = snapshot.expected_runtime_s.get(placement.task_id)
        if runtime is None:
            held_by_model[model] += milli
            continue
        ends_by_model[model].append((now_s + runtime, milli))
    return idle_by_model, ends_by_model, held_by_model


def _answer_or_queue(
    snapshot: Snapshot,
    unplaced: Mapping[str, Reason],
    now_s: float,
    *,
    placements: Sequence[Bound],
    requests: Mapping[str, TaskRequest],
) -> tuple[dict[str, Estimate], list[TaskRequest]]:
    """The estimates of the tasks whose reason answers alone, and the tasks left for the queue walk."""
    cluster = snapshot.cluster
    # Only a task left for its quota reads its tenant's quota use and ends: that view walks the cycle's
    # placements and their requests once more (thousands, cold in memory after the engine's sweep), so
    # it is built only when such a task is left.
    quota_bound = any(r.code == Outcome.QUOTA_EXCEEDED.value for r in unplaced.values())
    tenant_curves, usage = _by_tenant(snapshot, placements, requests, now_s) if quota_bound else ({}, {})
    quota_of = {q.tenant: q for q in cluster.quotas}
    takeable = _takeable([n for n in cluster.nodes if n.schedulable])
    out: dict[str, Estimate] = {}
    queue: list[TaskRequest] = []
    for task_id, reason in unplaced.items():
        request = requests[task_id]
        if reason.code in _NEVER_BY_ENDS:
            out[task_id] = Estimate(None)
        elif reason.code in _NOW:
            out[task_id] = Estimate(now_s)
        elif reason.code == Outcome.QUOTA_EXCEEDED.value:
            quota = quota_of[request.tenant]
            short = (
                usage[request.tenant]
                + request.gpu_request_milli
                - quota.guaranteed_milli
                - quota.borrow_limit_milli
            )
            curve = tenant_curves.get(request.tenant, (np.array([]), np.array([], np.int64)))
            start = _first_time(curve, short, now_s)
            out[task_id] = Estimate(
                start,
                ""
                if start is not None
                else f"none of tenant {request.tenant}'s running tasks has a known end "
                "(no P50 prediction, max runtime or profile duration) that frees enough of its quota",
            )
        elif not takeable(request):
            out[task_id] = Estimate(None, _never_fits(request))
        else:
            queue.append(request)
    return out, queue


def _first_time(curve: _Curve, short: int, now_s: float) -> float | None:
    """The first time the ends on `curve` have freed `short` milli (now when nothing is short)."""
    if short <= 0:
        return now_s
    times, freed = curve
    k = int(np.searchsorted(freed, short, side="left"))
    return max(float(times[k]), now_s) if k < len(times) else None


def _takeable(schedulable: list[NodeState]) -> Callable[[TaskRequest], bool]:
    """Whether some schedulable node could hold the request whole, even empty. Capacity counted across
    the pool says nothing of a task larger than every node: only such a node gives it a start. Asked once
    per shape (a backlog has a few hundred)."""
    fits_of: dict[tuple[int, int, int, frozenset[str]], bool] = {}

    def takeable(request: TaskRequest) -> bool:
        key = (request.num_gpu, request.cpu_milli, request.mem_mib, request.allowed_models)
        if key not in fits_of:
            fits_of[key] = any(n.takes(*key) for n in schedulable)
        return fits_of[key]

    return takeable


def _never_fits(request: TaskRequest) -> str:
    models = f" of {'/'.join(sorted(request.allowed_models))}" if request.allowed_models else ""
    return (
        f"no schedulable node could hold {request.num_gpu} GPUs{models}, {request.cpu_milli / 1000:g} CPU "
        f"cores and {request.mem_mib} MiB host memory at once, even empty"
    )


def _by_tenant(
    snapshot: Snapshot, placements: Sequence[Bound], requests: Mapping[str, TaskRequest], now_s: float
) -> tuple[dict[str, _Curve], dict[str, int]]:
    """Per tenant: when its tasks free quota (a curve of known ends), and the quota it uses, this cycle's
    placements included."""
    ends_by_tenant: dict[str, list[tuple[float, int]]] = defaultdict(list)
    usage: dict[str, int] = defaultdict(int)
    for task in snapshot.cluster.running:
        usage[task.tenant] += task.quota_milli
        end = snapshot.expected_end_s.get(task.task_id)
        if end is not None:
            ends_by_tenant[task.tenant].append((end, task.gpu_milli * len(task.gpu_indexes)))
    for bound in placements:
        placement = bound.placement
        request = requests[placement.task_id]
        usage[request.tenant] += request.gpu_request_milli
        runtime = snapshot.expected_runtime_s.get(placement.task_id)
        if runtime is not None:
            milli = placement.unit.gpu_milli * len(placement.gpu_indexes)
            ends_by_tenant[request.tenant].append((now_s + runtime, milli))
    return {tenant: _curve(ends) for tenant, ends in ends_by_tenant.items()}, usage


def queue_starts(
    queue: Sequence[TaskRequest],
    idle_by_model: Mapping[str | None, int],
    ends_by_model: Mapping[str | None, Sequence[tuple[float, int]]],
    held_by_model: Mapping[str | None, int],
    runtime_s: Callable[[str], float | None],
    now_s: float,
) -> dict[str, Estimate]:
    """Estimated starts of `queue` (in the order served) on capacity per GPU model.

    `idle_by_model`: milli free now; `ends_by_model`: (expected end, milli freed) of what runs;
    `held_by_model`: milli held by running tasks with no known end (for the sentence only);
    `runtime_s(task_id)`: a queued task's expected run time once started (None: it never frees).
    Each task starts no earlier than the one ahead of it, at the first time the models it may use have
    what it asks for free, and takes it (most free model first) until its own end. A task that nothing
    known frees enough for is "unknown", takes nothing and does not hold back the tasks behind it.
    """
    models = list(idle_by_model.keys() | ends_by_model.keys() | held_by_model.keys())
    free: dict[str | None, int] = defaultdict(int, idle_by_model)
    # Milli each model is still due back from known ends (a task whose need exceeds free + due is unknown).
    due: dict[str | None, int] = defaultdict(int)
    # Milli queued tasks ahead took for good (no known run time), for the sentence only.
    taken_for_good: dict[str | None, int] = defaultdict(int)
    tie = itertools.count()  # equal times pop in insertion order (models are not comparable)
    events: list[tuple[float, int, str | None, int]] = []  # (time, tie, model, milli freed)
    for model, ends in ends_by_model.items():
        for end_s, milli in ends:
            events.append((max(end_s, now_s), next(tie), model, milli))
            due[model] += milli
    heapq.heapify(events)
    chosen_of: dict[frozenset[str], list[str | None]] = {}
    # What the models a task may use can ever offer it (free + due) and the sentence for a task asking
    # more change only when a task ahead takes milli for good: kept per allowed models until then, as a
    # large backlog has thousands of unknown tasks that would each sum and build the same sentence anew
    # (docs/notes/cycle-speed.md).
    ceiling_of: dict[frozenset[str], int] = {}
    unknown_of: dict[frozenset[str], Estimate] = {}
    at_s = now_s
    out: dict[str, Estimate] = {}
    for request in queue:
        key = request.allowed_models
        if key not in chosen_of:
            chosen_of[key] = [m for m in models if not key or m in key]
        chosen = chosen_of[key]
        if key not in ceiling_of:
            ceiling_of[key] = sum(free[m] + due[m] for m in chosen)
        need = request.gpu_request_milli
        if ceiling_of[key] < need:
            if key not in unknown_of:
                unknown_of[key] = Estimate(None, _why_unknown(chosen, held_by_model, taken_for_good))
            out[request.task_id] = unknown_of[key]
            continue
        while sum(free[m] for m in chosen) < need:
            when_s, _, model, milli = heapq.heappop(events)
            free[model] += milli
            due[model] -= milli
            at_s = max(at_s, when_s)
        out[request.task_id] = Estimate(at_s)
        runtime = runtime_s(request.task_id)
        left = need
        for model in sorted(chosen, key=lambda m: -free[m]):
            take = min(free[model], left)
            if take <= 0:
                break
            free[model] -= take
            left -= take
            if runtime is None:
                taken_for_good[model] += take
                ceiling_of.clear()
                unknown_of.clear()
            else:
                heapq.heappush(events, (at_s + runtime, next(tie), model, take))
                due[model] += take
    return out


def _why_unknown(
    chosen: Sequence[str | None],
    held_by_model: Mapping[str | None, int],
    taken_for_good: Mapping[str | None, int],
) -> str:
    held = sum(held_by_model.get(m, 0) for m in chosen)
    if held:
        return (
            f"{held} milli-GPU it could use is held by tasks with no known end (no P50 prediction, max "
            "runtime or profile duration)"
        )
    ahead = sum(taken_for_good.get(m, 0) for m in chosen)
    if ahead:
        return (
            f"tasks ahead of it in the queue take {ahead} milli-GPU it could use and have no known run "
            "time (no P50 prediction, max runtime or profile duration)"
        )
    return "nothing running on the GPUs it may use would free enough"
