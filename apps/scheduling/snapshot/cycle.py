"""`cycle_input`: everything one cycle over one pool decides on, assembled in one place.

The production cycle, the what-if (`whalegen replay --from-pool` and the dashboard's page) and the cycle
benchmark all take their input from here, so a what-if of a profile-aware policy, or with pre-carving on,
decides on exactly what the cycle would.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from apps.common import hooks
from apps.scheduling.online_reserve import cycle_config
from apps.scheduling.precarve import precarve_config, with_forecast
from apps.scheduling.profiles import snapshot_with_profiles
from apps.scheduling.snapshot.pool import PoolShapeMix, PoolSnapshot
from apps.scheduling.snapshot.read import snapshot_for_pool
from whalegen.placement.aware import reads_profiles
from whalegen.placement.fragmentation import shape_mix_from_tasks, takeable_mix
from whalegen.placement.types import ShapeMix, TaskRequest
from whalegen.scheduling import Config, Snapshot


@dataclass(frozen=True)
class CycleInput:
    """What one cycle under one policy decides on, and what its commit compares against."""

    # The pool's rows as read (ids and versions for the commit's compare-and-set), with the task profiles
    # the policy reads and the running online tasks marked.
    snapshot: PoolSnapshot
    # What `decide` reads: `snapshot.pure` with the shape mix and, when pre-carving, the arrivals forecast.
    pure: Snapshot
    config: Config  # the policy, the pool's online reserve, the pre-carve rules
    steer: PoolShapeMix  # where the shape mix came from (the forecast, or why not), for the cycle record
    mix: ShapeMix  # the expected task-shape mix; fragmentation is measured against it too


def cycle_input(pool_id: int, now: datetime, policy: str) -> CycleInput:
    """The input of a cycle over `pool_id` at `now` under `policy`: the pool read, then made ready."""
    return policy_input(snapshot_for_pool(pool_id, now), policy)


def policy_input(snapshot: PoolSnapshot, policy: str) -> CycleInput:
    """The input of a cycle under `policy` on the pool as `snapshot` read it. The what-if compares its
    policies on one read this way; the cycle reads and calls this once (`cycle_input`).

    Steps: 1. the stored profiles of the snapshot's tasks, for a policy that reads them; 2. the shape mix
    the pool expects; 3. the configuration: the online reserve (its running online tasks marked) and the
    pre-carve rules; 4. `decide`'s input: the snapshot with the mix, and the arrivals forecast when
    pre-carving could re-carve an idle MIG GPU.
    """
    now = snapshot.now
    if reads_profiles(policy):
        snapshot = snapshot_with_profiles(snapshot)
    steer, mix = _shape_mix(snapshot, now)
    snapshot, config = cycle_config(snapshot, policy=policy, now=now)
    config = replace(config, precarve=precarve_config())
    pure = replace(snapshot.pure, cluster=replace(snapshot.pure.cluster, shape_mix=mix))
    pure = with_forecast(pure, pool_id=snapshot.pool_id, now=now, config=config.precarve)
    return CycleInput(snapshot=snapshot, pure=pure, config=config, steer=steer, mix=mix)


def _shape_mix(snapshot: PoolSnapshot, now: datetime) -> tuple[PoolShapeMix, ShapeMix]:
    """The forecast shape mix of the pool's next hour (active arrivals model), else the mix of the tasks
    the snapshot knows, less the shapes no node of the pool could ever take; the engine's policy and the
    fragmentation figures use it."""
    steer = hooks.pool_shape_mix(pool_id=snapshot.pool_id, now=now)
    mix = steer.mix or shape_mix_from_tasks(
        list(snapshot.cluster.pending)
        + [
            TaskRequest(t.task_id, t.cpu_milli, t.mem_mib, len(t.gpu_indexes), t.gpu_milli)
            for t in snapshot.cluster.running
        ]
    )
    return steer, takeable_mix(mix, snapshot.cluster.nodes)
