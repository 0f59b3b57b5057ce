"""Invariants of `decide` on random unit-exact pools (whole, MPS and MIG GPUs, some MIG GPUs idle):
every placement binds to free units of its GPUs and no unit twice; a task left waiting for capacity has
no placement on the units still free (or the decision names what holds it back); gangs go all or none;
no tenant ends above its quota."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.whalegen.scheduling.builders import Pool
from tests.whalegen.scheduling.strategies import pending, pools, quotas
from whalegen.placement.types import WHOLE_GPU_MILLI, Isolation, Quota, TaskRequest
from whalegen.scheduling import Bound, Config, Decider, Decisions, FreeUnit, Snapshot, decide

POLICIES = ("whalegen", "bestfit", "fgd")
# Codes that name what holds a task back, or say nothing present can ever hold it: exempt from the
# work-conservation check. Everything else claims "no room now" and is checked against the free units.
NAMED_HOLDS = {
    "quota_exceeded",
    "gang_incomplete",
    "online_reserve",
    "waiting_for_layout",
    "no_allowed_model",
    "no_isolation",
}


def _left_free(snapshot: Snapshot, decisions: Decisions) -> dict[tuple[str, int], list[FreeUnit]]:
    """The free units the decision leaves: not bound, and not on a GPU it re-carves (the commit deletes
    those units for the new layout, which goes to the task it was planned for)."""
    taken = {u for b in decisions.placements for u in b.unit_ids}
    recarved = {plan.gpu for plan in decisions.layouts}
    return {
        key: [u for u in units if u.unit_id not in taken]
        for key, units in snapshot.free_units.items()
        if key not in recarved
    }


def _gpu_can_carry(units: list[FreeUnit], task: TaskRequest, mode_of: str) -> bool:
    """Independent of `decide`: could these free units carry one GPU of `task`?"""
    if not units:
        return False
    kind = units[0].kind
    if task.isolation is Isolation.MIG and kind != "mig":
        return False
    if task.isolation is Isolation.MPS and kind != "mps":
        return False
    if task.isolation is Isolation.EXCLUSIVE and kind == "mig":
        return False
    milli = WHOLE_GPU_MILLI if task.isolation is Isolation.EXCLUSIVE else task.gpu_milli
    if kind == "mig":
        return any(u.gpu_milli >= milli and u.mem_mib >= task.gpu_mem_mib for u in units)
    if task.isolation is Isolation.EXCLUSIVE and mode_of != "all_free":
        return False
    return sum(u.gpu_milli for u in units) >= milli and sum(u.mem_mib for u in units) >= task.gpu_mem_mib


def _check(
    snapshot: Snapshot, decisions: Decisions, tasks: list[TaskRequest], quota_list: list[Quota]
) -> None:
    by_id = {t.task_id: t for t in tasks}
    # 1. Every placement binds to free units of the GPUs it names; no unit twice.
    seen: set[int] = set()
    for bound in decisions.placements:
        p = bound.placement
        allowed = {u.unit_id for i in p.gpu_indexes for u in snapshot.free_units.get((p.node, i), ())}
        assert set(bound.unit_ids) <= allowed, (p, bound.unit_ids)
        assert not seen & set(bound.unit_ids)
        seen |= set(bound.unit_ids)
        per_gpu = {
            i
            for i in p.gpu_indexes
            for u in snapshot.free_units.get((p.node, i), ())
            if u.unit_id in bound.unit_ids
        }
        assert per_gpu == set(p.gpu_indexes) and len(p.gpu_indexes) == by_id[p.task_id].num_gpu
    # Every task is either placed or has a reason.
    placed = {b.task_id for b in decisions.placements}
    assert placed | set(decisions.unplaced) == set(by_id)
    assert not placed & set(decisions.unplaced)
    # 2. Gangs all or none: placed, and re-carved for.
    planned = {t for plan in decisions.layouts for t, _ in plan.plan.for_tasks}
    gangs: dict[str, set[tuple[bool, bool]]] = defaultdict(set)
    for t in tasks:
        if t.gang_id is not None:
            gangs[t.gang_id].add((t.task_id in placed, t.task_id in planned))
    assert all(len(states) == 1 for states in gangs.values()), gangs
    # A task re-carved for has a new layout on every GPU it asks for, all on one node, or none; and a GPU
    # gets one new layout.
    gpus_of: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for plan in decisions.layouts:
        for t, _ in plan.plan.for_tasks:
            gpus_of[t].append(plan.gpu)
    for t, on in gpus_of.items():
        assert len(set(on)) == by_id[t].num_gpu and len({node for node, _ in on}) == 1, (t, on)
    assert len({plan.gpu for plan in decisions.layouts}) == len(decisions.layouts)
    # 3. Quotas.
    use: dict[str, int] = defaultdict(int)
    for t in placed:
        use[by_id[t].tenant] += by_id[t].gpu_request_milli
    for q in quota_list:
        assert use[q.tenant] <= q.guaranteed_milli + q.borrow_limit_milli
    # 4. Work conservation, for single tasks said to wait for room.
    free = _left_free(snapshot, decisions)
    cpu_left = {n.name: n.cpu_free_milli for n in snapshot.cluster.nodes}
    for b in decisions.placements:
        cpu_left[b.placement.node] -= by_id[b.task_id].cpu_milli
    quota_of = {q.tenant: q for q in quota_list}
    for task_id, reason in decisions.unplaced.items():
        t = by_id[task_id]
        if reason.code in NAMED_HOLDS or t.gang_id is not None:
            continue
        q = quota_of.get(t.tenant)
        if q is not None and use[t.tenant] + t.gpu_request_milli > q.guaranteed_milli + q.borrow_limit_milli:
            continue  # a quota holds it (the engine checks it first)
        for node in snapshot.cluster.nodes:
            if cpu_left[node.name] < t.cpu_milli:
                continue
            carriers = 0
            for g in node.gpus:
                units = free.get((node.name, g.index), [])
                all_free = len(units) == len(snapshot.free_units.get((node.name, g.index), ())) and all(
                    not cu.held for cu in snapshot.gpu_views[(node.name, g.index)].units
                )
                if _gpu_can_carry(units, t, "all_free" if all_free else ""):
                    carriers += 1
            assert carriers < t.num_gpu, (
                f"{task_id} waits ({reason.code}: {reason.message}) though {node.name} has free units for it"
            )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), tasks=pending(), quota_list=quotas(), policy=st.sampled_from(POLICIES))
def test_decisions_bind_free_units_conserve_work_keep_gangs_whole_and_quotas(
    pool: Pool, tasks: list[TaskRequest], quota_list: list[Quota], policy: str
) -> None:
    snapshot = pool.snapshot(tasks, quotas=quota_list)
    decisions = decide(snapshot, Config(policy=policy, preemption=False), 0.0)
    _check(snapshot, decisions, tasks, quota_list)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), tasks=pending(), policy=st.sampled_from(POLICIES))
def test_a_whole_gpu_task_never_takes_a_mig_gpu_while_a_whole_gpu_is_free(
    pool: Pool, tasks: list[TaskRequest], policy: str
) -> None:
    snapshot = pool.snapshot(tasks)
    decisions = decide(snapshot, Config(policy=policy, preemption=False), 0.0)
    free = _left_free(snapshot, decisions)
    by_id = {t.task_id: t for t in tasks}
    cpu_left = {n.name: n.cpu_free_milli for n in snapshot.cluster.nodes}
    for b in decisions.placements:
        cpu_left[b.placement.node] -= by_id[b.task_id].cpu_milli
    whole_left: dict[str, int] = defaultdict(int)  # node → whole GPUs nobody took
    for (node, _), units in free.items():
        if len(units) == 1 and units[0].kind == "whole":
            whole_left[node] += 1
    for b in decisions.placements:
        t = by_id[b.task_id]
        if t.gpu_milli < WHOLE_GPU_MILLI or t.isolation is not Isolation.ANY:
            continue
        p = b.placement
        if any(snapshot.gpu_views[(p.node, i)].mode.value == "mig" for i in p.gpu_indexes):
            # Allowed only when no node is left with enough free whole GPUs (and the CPU) for it.
            room = [n for n, count in whole_left.items() if count >= t.num_gpu and cpu_left[n] >= t.cpu_milli]
            assert not room, (b, room)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), tasks=pending(), quota_list=quotas(), policy=st.sampled_from(POLICIES))
def test_units_heard_while_the_engine_places_are_the_units_the_decision_binds(
    pool: Pool, tasks: list[TaskRequest], quota_list: list[Quota], policy: str
) -> None:
    """The production cycle writes each placement `begin` tells it of (already on its units) while the
    engine goes on: listening must not change the decision, and what is heard is what `finish` keeps,
    unless a later retry moved it (the cycle then rolls its writes back: checked there)."""
    snapshot = pool.snapshot(tasks, quotas=quota_list)
    config = Config(policy=policy, preemption=False)
    expected = decide(snapshot, config, 0.0)
    decider = Decider(snapshot, config)
    heard: list[Bound] = []
    decider.begin(snapshot.cluster.pending, 0.0, on_placed=heard.extend)
    decisions = decider.finish(0.0)
    assert decisions == expected
    assert len({b.task_id for b in heard}) == len(heard)
    taken = [u for b in heard for u in b.unit_ids]
    assert len(taken) == len(set(taken))  # no unit heard twice
    for b in heard:
        assert snapshot.free_units[(b.placement.node, b.placement.gpu_indexes[0])]
        free = {
            u.unit_id for i in b.placement.gpu_indexes for u in snapshot.free_units[(b.placement.node, i)]
        }
        assert set(b.unit_ids) <= free
