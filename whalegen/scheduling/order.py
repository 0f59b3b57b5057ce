"""The order a cycle offers work to the engine: guarantees first, then borrowing; effective priority;
weighted dominant-resource fair share between a tenant's queues and between tenants; then age."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import NamedTuple

from whalegen.placement.types import WHOLE_GPU_MILLI, ClusterSnapshot, TaskRequest


def _units(pending: Iterable[TaskRequest]) -> list[list[TaskRequest]]:
    """Single tasks, and gangs as one unit (all members decided together)."""
    gangs: dict[str, list[TaskRequest]] = defaultdict(list)
    units: list[list[TaskRequest]] = []
    for task in pending:
        if task.gang_id is None:
            units.append([task])
        else:
            if task.gang_id not in gangs:
                units.append(gangs[task.gang_id])
            gangs[task.gang_id].append(task)
    return units


class _Offer(NamedTuple):
    """One unit of work (a task, or a gang's members) with what the ordering reads of it, computed once:
    the loops below compare and add these for every unit offered, ten thousand per cycle. A named tuple,
    not a frozen dataclass: as immutable, and cheaper to build, since a frozen dataclass sets each field
    through `object.__setattr__` (docs/notes/cycle-speed.md)."""

    tasks: list[TaskRequest]
    age: tuple[float, str]  # oldest submission of its tasks, then its first task's id
    priority: int  # highest of its tasks
    gpu_milli: int
    cpu_milli: int
    mem_mib: int

    @staticmethod
    def of(unit: list[TaskRequest]) -> _Offer:
        if len(unit) == 1:
            t = unit[0]
            return _Offer(
                unit, (t.submitted_at_s, t.task_id), t.priority, t.gpu_request_milli, t.cpu_milli, t.mem_mib
            )
        return _Offer(
            unit,
            (min(t.submitted_at_s for t in unit), unit[0].task_id),
            max(t.priority for t in unit),
            sum(t.gpu_request_milli for t in unit),
            sum(t.cpu_milli for t in unit),
            sum(t.mem_mib for t in unit),
        )


_age = attrgetter("age")


def order_units(cluster: ClusterSnapshot, queues: Mapping[str, tuple[int, int]]) -> list[list[TaskRequest]]:
    """The order the cycle offers work to the engine.

    1. Within each tenant: effective priority (overrides included), highest first; within a priority,
       weighted dominant-resource fair share between the tenant's queues (a queue's share divided by its
       weight, so a queue of weight 2 gets twice the share of a queue of weight 1), recomputed as each
       unit is offered; ties by age.
    2. Guaranteed first: walking that order, the units that fit in what is left of the tenant's guarantee
       (after what it runs) form the first pass; the rest borrow, in a second pass, up to the limit and
       only where capacity is idle once every guarantee had its turn.
    3. Within a pass: effective priority, highest first; within a priority, dominant-resource fair share
       between tenants (GPU, CPU, host memory of the pool): the tenant with the smallest share goes next
       with its next unit, recomputed as each unit is offered.
    """
    totals = _pool_totals(cluster)
    held, queue_held, weight = _running_use(cluster, queues)
    # 1. Each tenant's own order.
    tenant_order = _tenant_orders(cluster.pending, queues, totals, queue_held, weight)
    # 2. Split each tenant's order into within-guarantee and borrowing.
    guaranteed = {q.tenant: q.guaranteed_milli for q in cluster.quotas}
    passes = _guaranteed_then_borrowing(tenant_order, guaranteed, held)
    # 3. Across tenants.
    return _across_tenants(passes, totals, held)


# GPU milli, CPU milli and host memory MiB, held or offered: the three resources of a dominant share.
_Use = list[float]


def _pool_totals(cluster: ClusterSnapshot) -> tuple[int, int, int]:
    """The pool's GPU, CPU and host memory: every share's denominators (at least 1, for an empty pool)."""
    return (
        max(sum(WHOLE_GPU_MILLI * len(n.gpus) for n in cluster.nodes), 1),
        max(sum(n.cpu_total_milli for n in cluster.nodes), 1),
        max(sum(n.mem_total_mib for n in cluster.nodes), 1),
    )


def _share(use: _Use, totals: tuple[int, int, int]) -> float:
    """Dominant-resource share: the largest part of the pool's GPU, CPU or memory that `use` holds."""
    return max(use[0] / totals[0], use[1] / totals[1], use[2] / totals[2])


def _add(use: _Use, offer: _Offer) -> None:
    # Offered counts as held for fairness: the engine places most of what it is offered.
    use[0] += offer.gpu_milli
    use[1] += offer.cpu_milli
    use[2] += offer.mem_mib


def _add_all(use: _Use, offers: list[_Offer]) -> None:
    # As `_add` one by one, to the bit: every amount is a whole number and every sum stays far below
    # 2**53, so the floats hold each partial sum exactly.
    use[0] += sum(o.gpu_milli for o in offers)
    use[1] += sum(o.cpu_milli for o in offers)
    use[2] += sum(o.mem_mib for o in offers)


def _running_use(
    cluster: ClusterSnapshot, queues: Mapping[str, tuple[int, int]]
) -> tuple[dict[str, _Use], dict[int, _Use], dict[int, int]]:
    """What the running tasks hold, per tenant and per queue, and the weights of their queues."""
    held: dict[str, _Use] = defaultdict(lambda: [0.0, 0.0, 0.0])
    queue_held: dict[int, _Use] = defaultdict(lambda: [0.0, 0.0, 0.0])
    weight: dict[int, int] = {}
    for task in cluster.running:
        use = (task.gpu_milli * len(task.gpu_indexes), task.cpu_milli, task.mem_mib)
        queue = queues.get(task.task_id)
        for i, amount in enumerate(use):
            held[task.tenant][i] += amount
            if queue is not None:
                queue_held[queue[0]][i] += amount
        if queue is not None:
            weight[queue[0]] = max(queue[1], 1)
    return held, queue_held, weight


def _tenant_orders(
    pending: Iterable[TaskRequest],
    queues: Mapping[str, tuple[int, int]],
    totals: tuple[int, int, int],
    queue_held: dict[int, _Use],
    weight: dict[int, int],
) -> dict[str, list[_Offer]]:
    """Each tenant's own order: priority, then weighted fair share between its queues, then age. A
    pending task's queue not seen running gets its weight here."""

    def queue_of(unit: list[TaskRequest]) -> int:
        queue = queues.get(unit[0].task_id)
        if queue is None:
            return 0
        if queue[0] not in weight:
            weight[queue[0]] = max(queue[1], 1)
        return queue[0]

    by_tenant: dict[str, dict[int, dict[int, list[_Offer]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for unit in _units(pending):
        offer = _Offer.of(unit)
        by_tenant[unit[0].tenant][offer.priority][queue_of(unit)].append(offer)
    return {
        tenant: _between_queues(levels, totals, queue_held, weight) for tenant, levels in by_tenant.items()
    }


def _between_queues(
    levels: dict[int, dict[int, list[_Offer]]],
    totals: tuple[int, int, int],
    queue_held: dict[int, _Use],
    weight: dict[int, int],
) -> list[_Offer]:
    """One tenant's offers (by priority, then queue): highest priority first; within a priority the queue
    with the smallest weighted share goes next with its oldest unit, recomputed as each is offered."""
    mine: list[_Offer] = []
    for level in sorted(levels, reverse=True):
        lines = {q: sorted(us, key=_age, reverse=True) for q, us in levels[level].items()}
        while len(lines) > 1:
            q = min(lines, key=lambda q: (_share(queue_held[q], totals) / weight.get(q, 1), lines[q][-1].age))
            offer = lines[q].pop()
            mine.append(offer)
            _add(queue_held[q], offer)
            if not lines[q]:
                del lines[q]
        # One queue left: its line in age order, no share to compare.
        for q, line in lines.items():
            line.reverse()
            mine += line
            _add_all(queue_held[q], line)
    return mine


def _guaranteed_then_borrowing(
    tenant_order: dict[str, list[_Offer]], guaranteed: dict[str, int], held: dict[str, _Use]
) -> list[dict[int, dict[str, list[_Offer]]]]:
    """Two passes, each by priority then tenant: the units that fit in what is left of their tenant's
    guarantee (after what it runs), walking its order; then the rest. A tenant without a quota row is
    never held back."""
    room = {tenant: guaranteed[tenant] - held[tenant][0] for tenant in guaranteed}
    passes: list[dict[int, dict[str, list[_Offer]]]] = [
        defaultdict(lambda: defaultdict(list)),
        defaultdict(lambda: defaultdict(list)),
    ]
    for tenant, offers in tenant_order.items():
        for offer in offers:
            if tenant not in room:
                which = 0
            elif offer.gpu_milli <= room[tenant]:
                room[tenant] -= offer.gpu_milli
                which = 0
            else:
                which = 1
            passes[which][offer.priority][tenant].append(offer)
    return passes


def _across_tenants(
    passes: list[dict[int, dict[str, list[_Offer]]]], totals: tuple[int, int, int], held: dict[str, _Use]
) -> list[list[TaskRequest]]:
    """Pass, priority, then fair share between tenants (a heap of tenants by share, then oldest unit)."""
    ordered: list[list[TaskRequest]] = []
    for buckets in passes:
        for level in sorted(buckets, reverse=True):
            lines_of = {tenant: list(reversed(us)) for tenant, us in buckets[level].items()}
            heap = [(_share(held[t], totals), q[-1].age, t) for t, q in lines_of.items()]
            heapq.heapify(heap)
            while heap:
                # The tenant on top goes next; it goes back with its new share while it has units left
                # (one sift instead of a pop and a push; no two entries tie, since each names its tenant).
                tenant = heap[0][2]
                line = lines_of[tenant]
                offer = line.pop()
                ordered.append(offer.tasks)
                tenant_held = held[tenant]
                _add(tenant_held, offer)
                if line:
                    heapq.heapreplace(heap, (_share(tenant_held, totals), line[-1].age, tenant))
                else:
                    heapq.heappop(heap)
    return ordered
