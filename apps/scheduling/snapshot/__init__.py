"""A cycle's input: the pool read once (`read`), its picture (`pool`), made ready for one policy (`cycle`).

    pool.py   PoolSnapshot and its row facts (PendingInfo, RunningInfo, GpuInfo, ClaimInfo)
    read.py   snapshot_for_pool: the pool's rows in nine queries, as a PoolSnapshot
    cycle.py  cycle_input / policy_input: profiles, shape mix, online reserve, pre-carve forecast → CycleInput

`apps.scheduling.services` decides and commits on a `CycleInput`; `apps.scheduling.whatif` decides on the
same and commits nothing.
"""

from apps.scheduling.snapshot.cycle import CycleInput, cycle_input, policy_input
from apps.scheduling.snapshot.pool import ClaimInfo, GpuInfo, PendingInfo, PoolSnapshot, RunningInfo
from apps.scheduling.snapshot.read import snapshot_for_pool

__all__ = [
    "ClaimInfo",
    "CycleInput",
    "GpuInfo",
    "PendingInfo",
    "PoolSnapshot",
    "RunningInfo",
    "cycle_input",
    "policy_input",
    "snapshot_for_pool",
]
