"""Immutable inputs and outputs of one scheduling cycle.

Units are in the names: CPU in millicores (`cpu_milli`), host and GPU memory in MiB (`mem_mib`), GPU
compute in thousandths of a GPU (`gpu_milli`, 1000 = one whole GPU). Time is seconds since an epoch the
caller chooses (`now`, `submitted_at_s`); the engine never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from enum import StrEnum
from typing import Any

# Defined with the GPUs (the forecasts use it too); re-exported here, where placement code reads it.
from whalegen.gpus.catalogue import WHOLE_GPU_MILLI as WHOLE_GPU_MILLI


class PartitionMode(StrEnum):
    """How a GPU hands out compute units."""

    WHOLE = "whole"  # one task per GPU; a fractional request takes the whole card
    SHARED = "shared"  # MPS share or time slice: any milli up to what is free
    MIG = "mig"  # MIG instances: a request is rounded up to the smallest profile that fits


class Isolation(StrEnum):
    """What a task accepts to share its GPU with."""

    ANY = "any"  # whatever the GPU offers: a share, a MIG instance or a whole card
    MIG = "mig"  # only a MIG instance (hardware-isolated memory and compute)
    MPS = "mps"  # only an MPS share or time slice of a shared-mode GPU
    EXCLUSIVE = "exclusive"  # a whole non-MIG GPU nobody else uses; a fractional request holds the card


class UnitKind(StrEnum):
    WHOLE = "whole"
    SHARE = "share"
    MIG = "mig"
    NONE = "none"  # CPU-only task


class Outcome(StrEnum):
    """Why a task was not placed, in the order the cycle checks them."""

    GANG_INCOMPLETE = "gang_incomplete"  # fewer gang members pending than the gang size
    QUOTA_EXCEEDED = "quota_exceeded"  # guaranteed + borrow limit would be exceeded
    NO_ALLOWED_MODEL = "no_allowed_model"  # no schedulable node carries an allowed GPU model
    NO_CAPACITY = "no_capacity"  # allowed nodes exist but none has the GPU, CPU and memory at once
    GANG_UNPLACEABLE = "gang_unplaceable"  # the member fits alone but the whole gang does not
    WAITING_FOR_PREEMPTION = "waiting_for_preemption"  # victims proposed; it places once they leave
    NO_ISOLATION = "no_isolation"  # no schedulable node has a GPU offering the isolation asked for
    ONLINE_RESERVE = "online_reserve"  # a batch task would eat into the pool's online-SLA reserve
    BUDGET_SPENT = "budget_spent"  # the tenant used its GPU-hour budget in this pool for the period
    # Units had room, but a profile-aware policy predicts every co-location there breaks an online task's
    # SLA (whalegen.placement.aware): a choice, not a shortage, so no victims are proposed by resources.
    SLA_REFUSED = "sla_refused"


@dataclass(frozen=True)
class GpuState:
    index: int  # device index on the node (what CUDA_VISIBLE_DEVICES names)
    model: str  # canonical catalogue name, e.g. "T4", "H100-80GB"
    free_milli: int
    free_mem_mib: int
    total_mem_mib: int
    mode: PartitionMode = PartitionMode.SHARED
    # MIG only: bitmask of occupied memory slices (bit i = slice i), see whalegen.gpus.mig.
    mig_used_slices: int = 0
    # MIG only, in a unit-exact snapshot: the free carved instances as (profile name, start slice), sorted.
    # The engine then takes one of these and nothing else, so its choice is a unit the commit can bind.
    # None (the trace replays, and a GPU opened for a re-carve): any free slices may be carved at will.
    mig_free_instances: tuple[tuple[str, int], ...] | None = None
    # Shared mode only, in a unit-exact snapshot whose shares are alike: one share's compute and memory.
    # A task then holds whole shares (286 milli on 250-milli shares holds two), as the commit binds them;
    # 0 (the trace replays): any milli may be held.
    share_milli: int = 0
    share_mem_mib: int = 0


@dataclass(frozen=True)
class NodeState:
    name: str
    cpu_total_milli: int
    cpu_free_milli: int
    mem_total_mib: int
    mem_free_mib: int
    gpus: tuple[GpuState, ...]
    schedulable: bool = True  # False when cordoned or unhealthy

    @property
    def model(self) -> str | None:
        return self.gpus[0].model if self.gpus else None

    def takes(self, num_gpu: int, cpu_milli: int, mem_mib: int, allowed_models: frozenset[str]) -> bool:
        """Whether this node could hold the shape when nothing else runs on it (its size, not its free
        room): a shape no node takes is never placed, so it waits for no capacity and fragments nothing."""
        if self.cpu_total_milli < cpu_milli or self.mem_total_mib < mem_mib:
            return False
        if not num_gpu:
            return True
        gpus = self.gpus if not allowed_models else [g for g in self.gpus if g.model in allowed_models]
        return len(gpus) >= num_gpu


@dataclass(frozen=True)
class TaskPrediction:
    runtime_p50_s: float | None = None
    runtime_p90_s: float | None = None
    mem_peak_mib: int | None = None


@dataclass(frozen=True)
class TaskProfile:
    """What telemetry says about a task (learned from history, never declared): for profile-aware placement.

    `compute_exponent` is the task's compute-boundness, 0 (its speed follows HBM bandwidth) … 1 (FP32
    TFLOPS); `sm_util_pct` its SM utilisation alone; `sla_min_factor`, for an online service, the lowest
    throughput factor (shared over alone) it tolerates. None: not known.
    """

    compute_exponent: float | None = None
    sm_util_pct: float | None = None
    sla_min_factor: float | None = None


@dataclass(frozen=True)
class TaskRequest:
    """A pending task. `gpu_milli` is per GPU: < 1000 only with `num_gpu == 1` (a shared GPU)."""

    task_id: str
    cpu_milli: int
    mem_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_mem_mib: int = 0  # per GPU; 0 = no bound asked for
    allowed_models: frozenset[str] = frozenset()  # empty = any model
    gang_id: str | None = None
    gang_size: int = 1
    priority: int = 0
    tenant: str = ""
    preemptible: bool = False
    submitted_at_s: float = 0.0
    prediction: TaskPrediction | None = None
    isolation: Isolation = Isolation.ANY
    sla_online: bool = False  # may use the pool's online reserve (EngineConfig.online_reserve_milli)
    # When set, the cycle's own order (e.g. fair share): tasks with a key go first, lowest key first, and
    # the engine's priority/age order applies only among tasks without one.
    order_key: int | None = None
    profile: TaskProfile | None = None  # read by profile-aware policies only (whalegen.placement.aware)

    @property
    def gpu_request_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def gpu_request_mem_mib(self) -> int:
        """The GPU memory it counts against a quota's memory bound once admitted (as `RunningTask`)."""
        return self.num_gpu * self.gpu_mem_mib


_TASK_REQUEST_FIELDS = frozenset(f.name for f in dataclass_fields(TaskRequest))


def task_request_whole(fields: dict[str, Any]) -> TaskRequest:
    """`TaskRequest(**fields)` where `fields` names every field, for the snapshot's loop over thousands of
    rows: the dict becomes the instance's own (the caller's no more), still frozen, equal and hashed
    alike. A frozen dataclass's `__init__` sets each of its 19 fields through `object.__setattr__`
    (2.2 µs a request, 22 ms for 10,000 pending tasks); this takes 1.2 µs, keywords and defaults included
    in none of it (`tests/whalegen/placement/test_types.py` holds it to the dataclass's constructor)."""
    if fields.keys() != _TASK_REQUEST_FIELDS:
        wrong = sorted(fields.keys() ^ _TASK_REQUEST_FIELDS)
        raise TypeError(f"a TaskRequest's fields, all of them and no others: {wrong}")
    request = object.__new__(TaskRequest)
    object.__setattr__(request, "__dict__", fields)
    return request


@dataclass(frozen=True)
class RunningTask:
    """A task already bound to a node, as the snapshot sees it."""

    task_id: str
    node: str
    gpu_indexes: tuple[int, ...]
    gpu_milli: int  # per GPU, as held (a MIG or whole unit may hold more than was asked)
    cpu_milli: int
    mem_mib: int
    gpu_mem_mib: int = 0
    priority: int = 0
    tenant: str = ""
    preemptible: bool = False
    started_at_s: float = 0.0
    borrowed: bool = False  # admitted above the tenant's guarantee
    # MIG instance held (same on every listed GPU), so that releasing the task frees its memory slices.
    mig_profile: str | None = None
    mig_start_slice: int | None = None
    # What the task counts against its tenant's quota, all GPUs together: what it asked (the charge the
    # quota rows and the API show), which a unit bigger than the ask does not change. None: what it holds.
    charge_milli: int | None = None
    # What telemetry says of it (as `TaskRequest.profile`): a fresh engine's profile-aware policy reads its
    # neighbours' utilisations and SLAs from here.
    profile: TaskProfile | None = None
    sla_online: bool = False  # an online-SLA task: never displaced to honour the pool's online reserve

    @property
    def quota_milli(self) -> int:
        return self.charge_milli if self.charge_milli is not None else self.gpu_milli * len(self.gpu_indexes)

    @property
    def quota_mem_mib(self) -> int:
        """The GPU memory it counts against a quota's memory bound: what it states, on each of its GPUs."""
        return self.gpu_mem_mib * len(self.gpu_indexes)


@dataclass(frozen=True)
class SlaRemedy:
    """Batch neighbours on one GPU whose leaving makes a co-location refused for an SLA admissible."""

    node: str
    gpu_index: int
    task_ids: tuple[str, ...]
    why: str  # the refused prediction, e.g. "sharing it predicts 0.84× for svc-1, below its SLA 0.90"


@dataclass(frozen=True)
class SlaRefusal:
    """A policy's "no" for an online task's SLA (`Outcome.SLA_REFUSED`): why, and the GPUs where
    preempting batch neighbours would honour the SLA (the engine proposes those victims first; victims
    by resources only on nodes where no unit was refused, since a unit freed there would be refused again)."""

    message: str
    remedies: tuple[SlaRemedy, ...] = ()
    # Where a unit with room was refused: no victims by resources there.
    refused_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BudgetSpent:
    """A tenant's GPU-hour budget in a pool, used up for the period: nothing new is admitted."""

    pool: str
    period: str  # as a person names it: "December 2026"
    limit_gpu_h: float
    used_gpu_h: float

    def message(self, tenant: str) -> str:
        return (
            f"tenant {tenant} has used its {self.limit_gpu_h:g} GPU-hour budget for {self.pool} in "
            f"{self.period} ({self.used_gpu_h:.1f} h)"
        )


@dataclass(frozen=True)
class Quota:
    tenant: str
    guaranteed_milli: int
    borrow_limit_milli: int = 0  # how far above the guarantee the tenant may borrow
    budget_spent: BudgetSpent | None = None  # set while the period's GPU-hour budget is used up
    # A bound on the GPU memory the tenant's admitted tasks state (GPUs × gpu_mem_mib), None: unbounded.
    gpu_mem_limit_mib: int | None = None


@dataclass(frozen=True)
class Shape:
    """A task shape for the fragmentation measure (reference/fragmentation.md §1.1)."""

    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    allowed_models: frozenset[str] = frozenset()
    mem_mib: int = 0  # ignored by the FGD measure; used by policies that count host memory


@dataclass(frozen=True)
class ShapeMix:
    """The expected task-shape distribution; weights sum to 1."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError("ShapeMix needs one weight per shape")


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: tuple[NodeState, ...]  # their order is the tie-break order among equal scores
    pending: tuple[TaskRequest, ...] = ()
    running: tuple[RunningTask, ...] = ()
    quotas: tuple[Quota, ...] = ()
    shape_mix: ShapeMix | None = None


@dataclass(frozen=True)
class ComputeUnit:
    kind: UnitKind
    gpu_milli: int  # per GPU, as held
    mig_profile: str | None = None
    mig_start_slice: int | None = None


@dataclass(frozen=True)
class Placement:
    task_id: str
    node: str
    gpu_indexes: tuple[int, ...]
    unit: ComputeUnit
    borrowed: bool = False


@dataclass(frozen=True)
class Preemption:
    victim_task_id: str
    node: str
    for_task_id: str
    reason: str


@dataclass(frozen=True)
class Unplaced:
    task_id: str
    outcome: Outcome
    message: str


@dataclass(frozen=True)
class CycleResult:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    notes: tuple[str, ...] = field(default=())
