"""The pool's online-service reserve in a cycle's configuration (docs/notes/goodput-design.md §10, item 7).

`WHALEGEN_ONLINE_RESERVE=static` keeps `WHALEGEN_ONLINE_RESERVE_MILLI` idle in every pool, as before;
`forecast` sizes it per pool and cycle from the pool's own online arrivals (whalegen.forecast.online_reserve),
with the static value as its floor. Either way, an online task that finds no room may displace preemptible
batch work of its own priority (the engine's `_victim_candidates`), so the running online tasks are marked
in the snapshot: they are never displaced for another online task.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings

from apps.workloads.selectors import pool_online_demand
from whalegen.forecast.online_reserve import DEFAULT_LOOKBACK_S, OnlineReserve, size_online_reserve
from whalegen.placement.types import WHOLE_GPU_MILLI
from whalegen.scheduling import Config

if TYPE_CHECKING:  # only annotations: the snapshot package imports this module
    from apps.scheduling.snapshot.pool import PoolSnapshot


def pool_online_reserve(snapshot: PoolSnapshot, now: datetime) -> tuple[OnlineReserve, frozenset[str]]:
    """The reserve the pool keeps for online tasks now, and its online tasks holding units (task ids)."""
    floor = settings.WHALEGEN_ONLINE_RESERVE_MILLI
    forecast = settings.WHALEGEN_ONLINE_RESERVE == "forecast"
    if not forecast and not floor:
        return OnlineReserve(milli=0, floor_milli=0), frozenset()
    since = now - timedelta(seconds=DEFAULT_LOOKBACK_S)
    demand = pool_online_demand(pool_id=snapshot.pool_id, since=since, until=now)
    if not forecast:
        return OnlineReserve(milli=floor, floor_milli=floor), demand.holding
    cluster = snapshot.cluster
    capacity = sum(len(n.gpus) for n in cluster.nodes if n.schedulable) * WHOLE_GPU_MILLI
    reserve = size_online_reserve(
        arrival_milli=demand.arrival_milli,
        waiting_milli=sum(t.gpu_request_milli for t in cluster.pending if t.sla_online),
        floor_milli=floor,
        cap_milli=int(capacity * settings.WHALEGEN_ONLINE_RESERVE_MAX_SHARE),
        quantile=settings.WHALEGEN_ONLINE_RESERVE_QUANTILE,
    )
    return reserve, demand.holding


def cycle_config(snapshot: PoolSnapshot, *, policy: str, now: datetime) -> tuple[PoolSnapshot, Config]:
    """`snapshot` with its running online tasks marked, and the decision's configuration with the pool's
    online reserve (what the cycle and the what-if both decide with)."""
    reserve, holding = pool_online_reserve(snapshot, now)
    config = Config(policy=policy, online_reserve_milli=reserve.milli, online_reserve_why=reserve.why())
    if not holding:
        return snapshot, config
    running = tuple(
        replace(t, sla_online=True) if t.task_id in holding else t for t in snapshot.cluster.running
    )
    cluster = replace(snapshot.cluster, running=running)
    return replace(snapshot, cluster=cluster, pure=replace(snapshot.pure, cluster=cluster)), config
