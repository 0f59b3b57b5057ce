"""What `decide` reads and what it returns: frozen dataclasses, no Django.

The snapshot is unit-exact: besides the engine's per-GPU view (`ClusterSnapshot`) it carries every free
compute unit as the fleet has it (a whole GPU, a MIG instance at its slices, an MPS share, a time slice),
the idle MIG GPUs with their present layout and what each may be re-carved into (`GpuView`). A decision
names the unit ids the commit binds, so the commit never has to search for units that match a choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from whalegen.placement.engine import EngineConfig
from whalegen.placement.recarve import IdleMigGpu
from whalegen.placement.repartition import ClaimAction, GpuView, MigSlot, RepartitionPlan
from whalegen.placement.types import ClusterSnapshot, NodeState, Placement, Preemption, TaskRequest
from whalegen.scheduling.precarve import Precarve, PrecarveConfig, ShapeForecast
from whalegen.scheduling.reserve import Reservation, ReserveConfig

GpuKey = tuple[str, int]  # (engine node name, GPU index)


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


class Code:
    """Reason codes of our own, next to the engine's `Outcome` values (the same string column)."""

    NEEDS_LAYOUT = "needs_layout_change"  # only a new MIG layout would hold it, and none is planned
    WAITING_FOR_LAYOUT = "waiting_for_layout"  # a GPU is being re-carved for it
    VICTIM_CLAIMED = "victim_claimed"  # the tasks it could displace were placed this very cycle
    HELD_FOR_RESERVATION = "held_for_reservation"  # starting it would delay a reserved large task
    DEFERRED = "deferred"  # the policy declined units with room, for a while (whalegen.placement.aware)


class FreeUnit(NamedTuple):
    """A compute unit nobody holds. `unit_id` is the commit's key (the database row id in production).

    A named tuple, not a frozen dataclass: a snapshot builds one per free unit (62,120 in the benchmark's
    pool), and a tuple is built in a third of the time (timeit: 51 against 118 ms for 62,120 on the 2-core
    host; less still from a row slice, `FreeUnit._make`). Immutable all the same; it compares equal to a
    plain tuple of the same fields, which nothing here builds."""

    unit_id: int
    kind: str  # "whole", "mig", "mps", "time_slice"
    gpu_milli: int
    mem_mib: int
    mig_profile: str = ""
    mig_start: int | None = None


@dataclass(frozen=True)
class Claim:
    """A GPU an earlier cycle re-carved for a pending task, and what this cycle does with it. A task on
    several GPUs holds one claim per GPU, all on one node; it binds when every one of them says bind."""

    task_id: str
    node: str
    gpu_index: int
    unit_id: int | None  # the task's instance in the new layout
    slot: MigSlot | None
    gpu_milli: int  # the instance's compute share (0 when the unit is gone)
    action: ClaimAction
    reason: str


@dataclass(frozen=True)
class Snapshot:
    """One pool, unit-exact, as `decide` sees it."""

    cluster: ClusterSnapshot
    # (node, GPU index) → free units there, in the order the commit prefers them (row id order).
    free_units: Mapping[GpuKey, tuple[FreeUnit, ...]] = field(default_factory=_empty)
    # (node, GPU index) → the GPU as a re-carve sees it (every GPU, so a plan can refuse with a reason).
    gpu_views: Mapping[GpuKey, GpuView] = field(default_factory=_empty)
    # Idle MIG GPUs that may be re-carved (as a last resort, after present units).
    idle_mig: Mapping[GpuKey, IdleMigGpu] = field(default_factory=_empty)
    # Task id → its claims, one per GPU re-carved for it (in GPU order).
    claims: Mapping[str, tuple[Claim, ...]] = field(default_factory=_empty)
    # Requests of the tasks those claims bind or keep waiting (not in `cluster.pending`).
    claimed_requests: Mapping[str, TaskRequest] = field(default_factory=_empty)
    # Task id (pending and running) → (queue key, weight): weighted fair share within a tenant.
    queues: Mapping[str, tuple[int, int]] = field(default_factory=_empty)
    # Running task id → when it is expected to end (start + P50, else max runtime, else its profile's
    # duration); absent or None when nothing is known.
    expected_end_s: Mapping[str, float | None] = field(default_factory=_empty)
    # Pending task id → its expected run time once started (same fallbacks), for the cycle's own placements.
    expected_runtime_s: Mapping[str, float | None] = field(default_factory=_empty)
    # Without units (a trace replay), every GPU's capacity is one unit per placement: the engine's view is
    # then exact by definition and nothing needs mapping.
    unit_exact: bool = True
    # Expected arrivals by shape over the next hour (the pool's arrivals model), for pre-carving idle MIG
    # GPUs (`Config.precarve`); None when there is no forecast to trust.
    forecast: ShapeForecast | None = None


@dataclass(frozen=True)
class Config:
    policy: str = "whalegen"
    seed: int = 0
    preemption: bool = True
    online_reserve_milli: int = 0
    online_reserve_why: str = ""  # how the reserve was sized, for reasons (EngineConfig.online_reserve_why)
    # Reservations for large and gang tasks with backfill around them (whalegen.scheduling.reserve);
    # None (the default) = no reservations, backfill unrestricted.
    reserve: ReserveConfig | None = None
    # Re-carve idle MIG GPUs ahead of `Snapshot.forecast` (whalegen.scheduling.precarve); None = never.
    precarve: PrecarveConfig | None = None

    def engine(self) -> EngineConfig:
        return EngineConfig(
            policy=self.policy,
            seed=self.seed,
            preemption=self.preemption,
            online_reserve_milli=self.online_reserve_milli,
            online_reserve_why=self.online_reserve_why,
        )


@dataclass(frozen=True)
class Reason:
    code: str
    message: str


@dataclass(frozen=True)
class Bound:
    """A placement and the units that carry it (one or more per GPU, all free in the snapshot)."""

    placement: Placement
    unit_ids: tuple[int, ...]

    @property
    def task_id(self) -> str:
        return self.placement.task_id


@dataclass(frozen=True)
class LayoutPlan:
    """Re-carve an idle MIG GPU for the listed tasks; they bind once the agent reports the layout."""

    gpu: GpuKey
    plan: RepartitionPlan


@dataclass(frozen=True)
class Decisions:
    placements: tuple[Bound, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    layouts: tuple[LayoutPlan, ...] = ()
    # Every pending task (and claimed one) not placed, with why; `layouts` tasks are here as
    # `waiting_for_layout`.
    unplaced: Mapping[str, Reason] = field(default_factory=_empty)
    # Unplaced task id → estimated start (seconds since the epoch), None when unknown.
    estimates: Mapping[str, float | None] = field(default_factory=_empty)
    nodes_after: tuple[NodeState, ...] = ()  # the pool after the placements (fragmentation figures)
    reservation: Reservation | None = None  # the large task or gang held for (Config.reserve)
    # Placed task id → why the policy chose that unit, where the policy says (profile-aware placement:
    # "H200-141GB chosen: 1.4× this task's H100-80GB speed (bandwidth-bound, a = 0.10)").
    placement_reasons: Mapping[str, str] = field(default_factory=_empty)
    # Idle MIG GPUs re-carved ahead of the forecast, for no task yet (`Config.precarve`).
    precarves: tuple[Precarve, ...] = ()
