"""The pool's picture for one cycle: what `decide` reads (`PoolSnapshot.pure`) and, beside it, the row
facts (ids and versions) the commit compares and sets against."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from whalegen.placement.recarve import IdleMigGpu
from whalegen.placement.repartition import ClaimVerdict, GpuView, MigSlot
from whalegen.placement.types import ClusterSnapshot, ShapeMix, TaskRequest
from whalegen.scheduling.types import Snapshot


class PendingInfo(NamedTuple):
    """A pending task's row facts beside its request. A named tuple, as `FreeUnit` is: one per pending
    task per cycle, built in a third of a frozen dataclass's time."""

    pk: int
    version: int
    tenant_id: int
    charge_milli: int  # what the quota counts: gpu_count × gpu_milli, as asked
    base_priority: int  # Task.priority; the snapshot's TaskRequest carries the effective one
    priority_source: str  # "" or the override that set the effective priority, for the reason text


@dataclass(frozen=True)
class RunningInfo:
    pk: int
    version: int
    state: str
    tenant_id: int
    node_id: int
    charge_milli: int
    # Seconds since the epoch when it is expected to finish (start + P50, else + max runtime); None unknown.
    expected_end_s: float | None


def _empty() -> MappingProxyType[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class GpuInfo:
    """What a repartition needs to know about a GPU (the planner's `GpuView`) and the row to re-carve."""

    pk: int
    unit_count: int
    view: GpuView


@dataclass(frozen=True)
class ClaimInfo:
    """An open repartition claim (a GPU an earlier cycle re-carved for a pending task) and its verdict."""

    pk: int
    task_key: str
    node: str  # engine node name
    gpu_index: int
    unit_id: int | None
    slot: MigSlot | None  # the task's instance in the new layout
    verdict: ClaimVerdict
    gpu_milli: int = 0  # the instance's compute share
    gpu_pk: int = 0


@dataclass(frozen=True)
class PoolSnapshot:
    pool_id: int
    now: datetime
    cluster: ClusterSnapshot
    node_ids: MappingProxyType[str, int]  # engine node name → Node.pk
    node_versions: MappingProxyType[int, int]
    node_models: MappingProxyType[str, str | None]
    pending: MappingProxyType[str, PendingInfo]  # engine task id → row facts
    running: MappingProxyType[str, RunningInfo]
    tenant_ids: MappingProxyType[str, int]  # tenant slug (the engine's tenant name) → Tenant.pk
    excluded_nodes: MappingProxyType[str, str]  # engine node name → why it takes nothing new
    # (Node.pk, GPU index) → the GPU as a repartition sees it.
    gpus: MappingProxyType[tuple[int, int], GpuInfo] = field(default_factory=_empty)
    # Engine task id → its open repartition claims, one per GPU re-carved for it. Tasks with claims to
    # bind or wait on are not in `cluster.pending` (the engine does not plan them again) and their GPUs
    # are full to the engine.
    claims: MappingProxyType[str, tuple[ClaimInfo, ...]] = field(default_factory=_empty)
    # The requests of the tasks those claims hold (bound or kept waiting outside the engine).
    claimed_requests: MappingProxyType[str, TaskRequest] = field(default_factory=_empty)
    # Engine task id (pending and running) → (Queue.pk, its weight): fair share within a tenant.
    queues: MappingProxyType[str, tuple[int, int]] = field(default_factory=_empty)
    # (engine node name, GPU index) → an idle MIG GPU the cycle may re-carve (as a last resort): the
    # engine first sees only its free carved instances.
    idle_mig: MappingProxyType[tuple[str, int], IdleMigGpu] = field(default_factory=_empty)
    # What `decide` reads: the engine's view plus every free unit, claims, queues and expected ends.
    pure: Snapshot = field(default_factory=lambda: Snapshot(ClusterSnapshot(())))


@dataclass(frozen=True)
class PoolShapeMix:
    """The shape mix placement weighs fragmentation with. `mix` None: use the history mix (pending and
    running tasks); `reason` says why when the forecast was not used."""

    mix: ShapeMix | None
    source: str  # "forecast" or "history"
    reason: str
    model_version: int | None = None
