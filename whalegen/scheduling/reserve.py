"""Reservations for large and gang tasks, and the backfill rule that protects them (pure).

Without a reservation a task asking for many GPUs can starve: every time a GPU frees, a small task
behind it in the queue takes it (backfill), and the big one never sees a whole node free. With one
(EASY backfilling): the first large task (or gang) in order that finds no room now gets a *predicted
start* — the first time at which, from the expected ends of the tasks holding the pool, some node(s)
would hold it — and the nodes it would start on. A task behind it may still start now (backfill) unless
that would push the reserved task past its predicted start: it is held when it lands on a reserved node,
is not predicted to end before the predicted start, and would leave too little there at that time.

Without known ends (no forecast) there is no predicted start: the reserved nodes are drained (a task
behind may use them only where the reserved task would still fit beside it). This is the policy the
forecast is measured against (docs/dynamic-replay.md §6).

The check is a node-level capacity view (free milli per GPU, CPU, host memory, the node's model); GPU
memory and MIG geometry are left to the engine, which makes the real placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from whalegen.placement.state import ClusterState, Request
from whalegen.placement.types import WHOLE_GPU_MILLI, TaskRequest


@dataclass(frozen=True)
class ReserveConfig:
    # A task asking for at least this many GPUs, or a member of a gang, is "large" and may be reserved for.
    min_gpus: int = 2
    # A task still running past its expected end is expected to end this long from now (an overdue
    # forecast says "soon", not "already").
    overdue_s: float = 60.0


@dataclass(frozen=True)
class NodeRoom:
    """What one node has free now (engine node index order)."""

    gpu_free_milli: tuple[int, ...]
    cpu_free_milli: int
    mem_free_mib: int
    usable: bool = True  # schedulable and of a model the reserved task may use


@dataclass(frozen=True)
class Holder:
    """A task holding part of a node, and when it is expected to end (None: unknown, never frees)."""

    task_id: str
    node: int
    gpu_indexes: tuple[int, ...]
    held_milli: tuple[int, ...]  # per listed GPU
    cpu_milli: int
    mem_mib: int
    end_s: float | None


@dataclass(frozen=True)
class Reservation:
    task_ids: tuple[str, ...]  # the reserved task, or every member of the reserved gang
    start_s: float | None  # predicted start; None when no known end frees enough (nodes drained)
    nodes: tuple[int, ...]  # the nodes it would start on, held for it (empty: fits on no node at all)


def is_large(task: TaskRequest, config: ReserveConfig) -> bool:
    return task.gang_id is not None or task.num_gpu >= config.min_gpus


@dataclass
class _Room:
    gpus: list[int]
    cpu: int
    mem: int
    usable: bool


def _rooms(rooms: Sequence[NodeRoom]) -> list[_Room]:
    return [_Room(list(r.gpu_free_milli), r.cpu_free_milli, r.mem_free_mib, r.usable) for r in rooms]


def _give(rooms: list[_Room], holder: Holder, sign: int) -> None:
    room = rooms[holder.node]
    for index, milli in zip(holder.gpu_indexes, holder.held_milli, strict=True):
        room.gpus[index] += sign * milli
    room.cpu += sign * holder.cpu_milli
    room.mem += sign * holder.mem_mib


def _take(room: _Room, task: TaskRequest) -> bool:
    """Fit `task` on `room` (taking what it uses); False, and nothing taken, when it does not fit."""
    if not room.usable or room.cpu < task.cpu_milli or room.mem < task.mem_mib:
        return False
    if task.num_gpu:
        need = min(task.gpu_milli, WHOLE_GPU_MILLI) if task.num_gpu == 1 else WHOLE_GPU_MILLI
        # Fullest GPUs first for a share (the engine packs shares), free whole GPUs for whole requests.
        candidates = sorted((free, i) for i, free in enumerate(room.gpus) if free >= need)
        if len(candidates) < task.num_gpu:
            return False
        for _, index in candidates[: task.num_gpu]:
            room.gpus[index] -= need
    room.cpu -= task.cpu_milli
    room.mem -= task.mem_mib
    return True


def _fit(members: Sequence[TaskRequest], rooms: list[_Room], nodes: Sequence[int]) -> tuple[int, ...] | None:
    """Members one by one, each on the first of `nodes` that holds it; None when one fits nowhere."""
    used: list[int] = []
    for task in members:
        for n in nodes:
            if _take(rooms[n], task):
                used.append(n)
                break
        else:
            return None
    return tuple(dict.fromkeys(used))


def _end(holder: Holder, now_s: float, config: ReserveConfig) -> float:
    if holder.end_s is None:
        return math.inf
    return holder.end_s if holder.end_s > now_s else now_s + config.overdue_s


def plan(
    members: Sequence[TaskRequest],
    rooms: Sequence[NodeRoom],
    holders: Sequence[Holder],
    now_s: float,
    config: ReserveConfig,
) -> Reservation:
    """The reservation for `members` (one task, or a whole gang) on the pool as `rooms` and `holders` say.

    Walks the expected ends in time order, freeing each holder's share, until the members fit; the nodes
    they fit on first are reserved. When no known end frees enough, the nodes it would take once the pool
    drained are reserved (those with most free GPUs now first), with no predicted start.
    """
    ids = tuple(t.task_id for t in members)
    order = list(range(len(rooms)))
    state = _rooms(rooms)
    timeline = sorted(((_end(h, now_s, config), i) for i, h in enumerate(holders)), key=lambda e: e[0])
    k = 0
    while k < len(timeline) and timeline[k][0] < math.inf:
        t = timeline[k][0]
        while k < len(timeline) and timeline[k][0] == t:
            _give(state, holders[timeline[k][1]], +1)
            k += 1
        trial = [_Room(list(r.gpus), r.cpu, r.mem, r.usable) for r in state]
        nodes = _fit(members, trial, order)
        if nodes is not None:
            return Reservation(ids, t, nodes)
    # No known end frees enough: drain the nodes that are closest to holding it.
    closest = sorted(order, key=lambda n: (-sum(f >= WHOLE_GPU_MILLI for f in rooms[n].gpu_free_milli), n))
    drained = _rooms(rooms)
    for holder in holders:
        _give(drained, holder, +1)
    return Reservation(ids, None, _fit(members, drained, closest) or ())


def delays(
    reservation: Reservation,
    members: Sequence[TaskRequest],
    rooms: Sequence[NodeRoom],
    holders: Sequence[Holder],
    candidate: Holder,
    now_s: float,
    config: ReserveConfig,
) -> bool:
    """Would starting `candidate` now (as placed) push the reserved members past their predicted start?

    `rooms` and `holders` are the pool without the candidate. No: when it lands off the reserved nodes,
    when it is expected to end by the predicted start, or when the members still fit on the reserved
    nodes at that time beside it.
    """
    if candidate.node not in reservation.nodes:
        return False
    # Without a predicted start the nodes are drained: every holder counts as gone, the candidate as staying.
    at_s = math.inf if reservation.start_s is None else reservation.start_s
    if reservation.start_s is not None and _end(candidate, now_s, config) <= at_s:
        return False
    state = _rooms(rooms)
    for holder in holders:
        if _end(holder, now_s, config) <= at_s:
            _give(state, holder, +1)
    _give(state, candidate, -1)
    return _fit(members, state, reservation.nodes) is None


def with_holders(rooms: Sequence[NodeRoom], holders: Sequence[Holder], sign: int) -> tuple[NodeRoom, ...]:
    """`rooms` with the holders' shares given back (`sign` +1) or taken (-1)."""
    state = _rooms(rooms)
    for holder in holders:
        _give(state, holder, sign)
    return tuple(NodeRoom(tuple(r.gpus), r.cpu, r.mem, r.usable) for r in state)


def pool_view(
    state: ClusterState, request: TaskRequest, end_of: Callable[[str], float | None]
) -> tuple[tuple[NodeRoom, ...], dict[str, Holder]]:
    """The engine's working copy as rooms (usable: schedulable and of a model `request` may use) and
    holders (every bound task, its expected end from `end_of`)."""
    req = Request.of(request)
    rooms = tuple(
        NodeRoom(
            tuple(state.gpu_free[n]),
            state.cpu_free[n],
            state.mem_free[n],
            state.schedulable[n] and state.model_allowed(n, req),
        )
        for n in range(len(state))
    )
    holders = {
        b.task_id: Holder(
            b.task_id, b.node, b.gpu_indexes, b.held_milli, b.cpu_milli, b.mem_mib, end_of(b.task_id)
        )
        for b in state.bindings.values()
    }
    return rooms, holders
