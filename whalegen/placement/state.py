"""The engine's working copy of a cluster: plain lists for per-node reads, numpy mirrors for sweeps.

A cycle reads one node at a time when it scores (Python lists are faster than numpy for scalar access)
and sweeps all nodes at once when it selects or explains (numpy). Every change goes through `bind` or
`release`, which keep both views equal and bump the node's version so score caches know what to redo.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from whalegen.gpus.mig import MEMORY_SLICES, MigProfile, mig_profiles, profile_by_name
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    ClusterSnapshot,
    ComputeUnit,
    GpuState,
    Isolation,
    NodeState,
    PartitionMode,
    RunningTask,
    TaskRequest,
    UnitKind,
)

ALL_SLICES = (1 << MEMORY_SLICES) - 1
MigInstance = tuple[str, int]  # a carved MIG instance: (profile name, start slice)
# Partition modes as small integers for the numpy device mirror (-1 = no device in that column).
MODE_CODES = {PartitionMode.SHARED: 0, PartitionMode.WHOLE: 1, PartitionMode.MIG: 2}
# Which partition modes each isolation accepts.
ISOLATION_MODES: dict[Isolation, frozenset[PartitionMode]] = {
    Isolation.ANY: frozenset(PartitionMode),
    Isolation.MIG: frozenset({PartitionMode.MIG}),
    Isolation.MPS: frozenset({PartitionMode.SHARED}),
    Isolation.EXCLUSIVE: frozenset({PartitionMode.SHARED, PartitionMode.WHOLE}),
}


@dataclass(frozen=True)
class Request:
    """The resource part of a task: what feasibility and scoring look at (hashable, used as cache key)."""

    cpu_milli: int
    mem_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_mem_mib: int
    allowed_models: frozenset[str]
    isolation: Isolation = Isolation.ANY

    @staticmethod
    def of(task: TaskRequest) -> Request:
        milli = task.gpu_milli if task.num_gpu else 0
        isolation = task.isolation if task.num_gpu else Isolation.ANY
        if isolation is Isolation.EXCLUSIVE:
            # Nobody else may use the card, so the task holds all of it whatever share it asked for.
            milli = WHOLE_GPU_MILLI
        return Request(
            task.cpu_milli,
            task.mem_mib,
            task.num_gpu,
            milli,
            task.gpu_mem_mib if task.num_gpu else 0,
            task.allowed_models,
            isolation,
        )

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < WHOLE_GPU_MILLI


@dataclass
class Binding:
    """Where a task sits in the working copy; enough to undo it exactly."""

    task_id: str
    node: int
    gpu_indexes: tuple[int, ...]
    held_milli: tuple[int, ...]  # per listed GPU
    held_gpu_mem_mib: tuple[int, ...]
    held_slices: tuple[int, ...]  # MIG slice masks per listed GPU (0 elsewhere)
    cpu_milli: int
    mem_mib: int
    request_milli: int  # what the task asked for, all GPUs together
    task_class: int
    unit: ComputeUnit
    # Per listed GPU, the carved instance taken from a unit-exact GPU's free list (None elsewhere): a
    # release puts it back on the list.
    held_instances: tuple[MigInstance | None, ...] = ()


def task_class(req: Request) -> int:
    """Clustering classes: 0 CPU-only, 1 shared GPU, otherwise 1 + number of whole GPUs."""
    if req.num_gpu == 0:
        return 0
    if req.is_share:
        return 1
    return 1 + req.num_gpu


def mig_profile_for(model: str, gpu_milli: int, gpu_mem_mib: int) -> MigProfile | None:
    """The smallest MIG profile of `model` with at least this compute share and memory."""
    best: MigProfile | None = None
    for profile in mig_profiles(model):
        if profile.name.endswith("+me"):
            continue  # media-extension profiles are for video engines, never handed out for compute
        if profile.gpu_milli < gpu_milli or profile.mem_mib < gpu_mem_mib:
            continue
        if best is None or (profile.memory_slices, profile.compute_slices) < (
            best.memory_slices,
            best.compute_slices,
        ):
            best = profile
    return best


def mig_start(profile: MigProfile, used_slices: int) -> int | None:
    for start in profile.starts:
        if profile.slice_mask(start) & used_slices == 0:
            return start
    return None


def smallest_instance(
    model: str, instances: tuple[MigInstance, ...], gpu_milli: int, gpu_mem_mib: int
) -> tuple[MigProfile, int] | None:
    """The smallest carved instance with at least this compute share and memory (ties: lowest start),
    the one `whalegen.scheduling.units` binds a MIG request to."""
    best: tuple[MigProfile, int] | None = None
    for name, start in instances:
        profile = profile_by_name(model, name)
        if profile.gpu_milli < gpu_milli or profile.mem_mib < gpu_mem_mib:
            continue
        if best is None or (profile.gpu_milli, profile.mem_mib, start) < (
            best[0].gpu_milli,
            best[0].mem_mib,
            best[1],
        ):
            best = (profile, start)
    return best


class ClusterState:
    """Mutable working copy built from a snapshot; node order is the tie-break order."""

    def __init__(self, nodes: tuple[NodeState, ...], *, whole_gpus_only: bool = False) -> None:
        self.names = [node.name for node in nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        for node in nodes:
            if len({gpu.model for gpu in node.gpus}) > 1:
                raise ValueError(f"node {node.name} mixes GPU models; split it into one node per model")
        self.models: list[str | None] = [node.model for node in nodes]
        model_names = sorted({m for m in self.models if m is not None})
        self.model_ids = {m: i for i, m in enumerate(model_names)}
        self.model_of = np.array([self.model_ids.get(m, -1) if m else -1 for m in self.models], np.int64)
        self.schedulable = [node.schedulable for node in nodes]
        self.cpu_total = [node.cpu_total_milli for node in nodes]
        self.mem_total = [node.mem_total_mib for node in nodes]
        self.gpu_count = [len(node.gpus) for node in nodes]
        self.cpu_free = [node.cpu_free_milli for node in nodes]
        self.mem_free = [node.mem_free_mib for node in nodes]
        self.gpu_free = [[gpu.free_milli for gpu in node.gpus] for node in nodes]
        self.gpu_mem_free = [[gpu.free_mem_mib for gpu in node.gpus] for node in nodes]
        self.gpu_mem_total = [[gpu.total_mem_mib for gpu in node.gpus] for node in nodes]
        self.gpu_index = [[gpu.index for gpu in node.gpus] for node in nodes]
        self.modes: list[list[PartitionMode]] = [
            [PartitionMode.WHOLE if whole_gpus_only else gpu.mode for gpu in node.gpus] for node in nodes
        ]
        self.mig_used = [[gpu.mig_used_slices for gpu in node.gpus] for node in nodes]
        # A unit-exact shared GPU's share, as (milli, memory), or None (see GpuState.share_milli).
        self.share_size: list[list[tuple[int, int] | None]] = [
            [(gpu.share_milli, gpu.share_mem_mib) if gpu.share_milli else None for gpu in node.gpus]
            for node in nodes
        ]
        # A unit-exact MIG GPU's free carved instances (None: slices are carved at will; see GpuState).
        self.mig_free: list[list[tuple[MigInstance, ...] | None]] = [
            [
                gpu.mig_free_instances if mode is PartitionMode.MIG else None
                for gpu, mode in zip(node.gpus, modes, strict=True)
            ]
            for node, modes in zip(nodes, self.modes, strict=True)
        ]
        self.plain = [all(mode is PartitionMode.SHARED for mode in modes) for modes in self.modes]
        # Everything feasibility and node-local scores read, as one hashable value per node.
        self.node_key: list[tuple[object, ...]] = [self._key(n) for n in range(len(nodes))]
        # Each distinct node key gets a small integer (its state class), so that nodes in the same state
        # can be grouped with numpy and scored once.
        self.key_ids: dict[tuple[object, ...], int] = {}
        self.class_id = np.array([self._class_of(key) for key in self.node_key], np.int64)
        # Which task classes each node hosts (count per class): the clustering policy reads it.
        self.classes: list[dict[int, int]] = [{} for _ in nodes]
        self.bindings: dict[str, Binding] = {}
        # Releases so far: binding only takes resources away, so what could not be placed stays
        # unplaceable until this moves (the engine skips re-asking the policy in between).
        self.releases = 0
        self.changes = 0  # binds, releases and restores so far: what whole-cluster counts depend on
        # Called with a node position after every change to it (policies that keep their own indexes;
        # `listen`). Held weakly: a policy holds this state, and a state holding its policy back made the
        # pair a reference cycle, so a cycle's whole working copy (its bindings, some 50,000 objects at
        # 10,000 tasks) waited for the garbage collector instead of going when the engine did.
        self.listeners: list[weakref.WeakMethod[Callable[[int], None]]] = []
        count = len(nodes)
        width = max(self.gpu_count, default=0)
        self.version = np.zeros(count, np.int64)
        # Every node change in order (`change_log[i]` is change `log_start + i`): a score cache that
        # last looked a few changes ago reads the nodes to redo here instead of comparing every node's
        # version. Only the recent part is kept; an older reader compares versions.
        self.change_log: list[int] = []
        self.log_start = 0
        self.log_limit = max(4096, 4 * count)
        # numpy mirrors for whole-cluster sweeps (selection and explanations); -1 marks "no device".
        self.np_cpu_free = np.array(self.cpu_free, np.int64)
        self.np_mem_free = np.array(self.mem_free, np.int64)
        self.np_gpu_free = np.full((count, max(width, 1)), -1, np.int64)
        for n, frees in enumerate(self.gpu_free):
            self.np_gpu_free[n, : len(frees)] = frees
        # Each node's free milli per GPU, largest first: "has k devices with t free" is one gather
        # (column k − 1 ≥ t) instead of a count along rows of 8, which numpy does slowly.
        self.np_free_desc = -np.sort(-self.np_gpu_free, axis=1)
        self.np_schedulable = np.array(self.schedulable, bool)
        self.np_plain = np.array(self.plain, bool)
        self.np_mode = np.full((count, max(width, 1)), -1, np.int8)
        for n, modes in enumerate(self.modes):
            self.np_mode[n, : len(modes)] = [MODE_CODES[m] for m in modes]
        # Per isolation, which device columns have a partition mode it accepts (modes never change).
        self.np_mode_ok = {
            isolation: np.isin(self.np_mode, [MODE_CODES[m] for m in modes])
            for isolation, modes in ISOLATION_MODES.items()
        }
        # Idle GPU milli on schedulable nodes: what the online-SLA reserve is measured against.
        self.free_milli_total = sum(sum(self.gpu_free[n]) for n in range(count) if self.schedulable[n])

    @staticmethod
    def from_snapshot(snapshot: ClusterSnapshot, *, whole_gpus_only: bool = False) -> ClusterState:
        state = ClusterState(snapshot.nodes, whole_gpus_only=whole_gpus_only)
        for task in snapshot.running:
            state.adopt(task)
        return state

    def _key(self, n: int) -> tuple[object, ...]:
        base = (
            self.models[n],
            self.schedulable[n],
            self.cpu_free[n],
            self.mem_free[n],
            tuple(self.gpu_free[n]),
        )
        if self.plain[n]:
            return base
        extra = (
            tuple(self.modes[n]),
            tuple(self.gpu_mem_free[n]),
            tuple(self.gpu_mem_total[n]),
            tuple(self.mig_used[n]),
            tuple(self.mig_free[n]),
        )
        return (*base, *extra)

    def _class_of(self, key: tuple[object, ...]) -> int:
        cls = self.key_ids.get(key)
        if cls is None:
            cls = len(self.key_ids)
            self.key_ids[key] = cls
        return cls

    @property
    def class_count(self) -> int:
        """State classes met so far (ids are 0 … class_count − 1)."""
        return len(self.key_ids)

    def __len__(self) -> int:
        return len(self.names)

    # -- feasibility -------------------------------------------------------------------------------

    def model_allowed(self, n: int, req: Request) -> bool:
        if req.num_gpu == 0 or not req.allowed_models:
            return True
        model = self.models[n]
        return model is not None and model in req.allowed_models

    def device_fits(self, n: int, d: int, req: Request) -> bool:
        free = self.gpu_free[n][d]
        mode = self.modes[n][d]
        if mode not in ISOLATION_MODES[req.isolation]:
            return False
        if mode is PartitionMode.SHARED:
            return free >= req.gpu_milli and self.gpu_mem_free[n][d] >= req.gpu_mem_mib
        if mode is PartitionMode.WHOLE:
            return free == WHOLE_GPU_MILLI and self.gpu_mem_total[n][d] >= req.gpu_mem_mib
        return self._mig_unit(n, d, req) is not None

    def _mig_unit(self, n: int, d: int, req: Request) -> tuple[MigProfile, int] | None:
        """The MIG instance one GPU of `req` would take on device d, as (profile, start slice): on a
        unit-exact GPU the smallest free carved instance that covers it, elsewhere the smallest profile
        that does, carved at its first free start."""
        model = self.models[n]
        if not model:
            return None
        instances = self.mig_free[n][d]
        if instances is not None:
            return smallest_instance(model, instances, req.gpu_milli, req.gpu_mem_mib)
        profile = mig_profile_for(model, req.gpu_milli, req.gpu_mem_mib)
        start = mig_start(profile, self.mig_used[n][d]) if profile else None
        return None if profile is None or start is None else (profile, start)

    def eligible_devices(self, n: int, req: Request) -> list[int] | None:
        """Devices of node `n` that could take one GPU of `req`, or None when the node cannot host it."""
        if (
            not self.schedulable[n]
            or self.cpu_free[n] < req.cpu_milli
            or self.mem_free[n] < req.mem_mib
            or not self.model_allowed(n, req)
        ):
            return None
        if req.num_gpu == 0:
            return []
        if self.plain[n] and req.isolation is Isolation.MIG:
            return None  # only shared-mode GPUs here
        if self.plain[n] and not req.gpu_mem_mib:
            # Shared GPUs and no GPU-memory bound: free milli is the only test (an exclusive request
            # asks 1000 milli, so only a card nobody uses passes).
            milli = req.gpu_milli
            devices = [d for d, free in enumerate(self.gpu_free[n]) if free >= milli]
        else:
            devices = [d for d in range(self.gpu_count[n]) if self.device_fits(n, d, req)]
        return devices if len(devices) >= req.num_gpu else None

    # -- changes -----------------------------------------------------------------------------------

    def held_milli(self, n: int, d: int, req: Request) -> int:
        """The GPU milli binding one GPU of `req` to device d takes away (what a score should simulate)."""
        mode = self.modes[n][d]
        if mode is PartitionMode.SHARED:
            return self._shares(n, d, req)[0]
        if mode is PartitionMode.WHOLE:
            return WHOLE_GPU_MILLI
        unit = self._mig_unit(n, d, req)
        return min(unit[0].gpu_milli, self.gpu_free[n][d]) if unit else req.gpu_milli

    def _unit_on(self, n: int, d: int, req: Request) -> tuple[int, int, int, ComputeUnit]:
        """What binding one GPU of `req` to device d takes: (milli, GPU memory, MIG slices, unit)."""
        mode = self.modes[n][d]
        if req.isolation is Isolation.EXCLUSIVE:
            return WHOLE_GPU_MILLI, self.gpu_mem_free[n][d], 0, ComputeUnit(UnitKind.WHOLE, WHOLE_GPU_MILLI)
        if mode is PartitionMode.SHARED:
            kind = UnitKind.SHARE if req.gpu_milli < WHOLE_GPU_MILLI else UnitKind.WHOLE
            milli, mem = self._shares(n, d, req)
            return milli, mem, 0, ComputeUnit(kind, req.gpu_milli)
        if mode is PartitionMode.WHOLE:
            return WHOLE_GPU_MILLI, self.gpu_mem_free[n][d], 0, ComputeUnit(UnitKind.WHOLE, WHOLE_GPU_MILLI)
        found = self._mig_unit(n, d, req)
        if found is None:
            raise ValueError(f"no MIG unit for {req} on {self.names[n]} GPU {d}")
        profile, start = found
        milli = min(profile.gpu_milli, self.gpu_free[n][d])
        unit = ComputeUnit(UnitKind.MIG, profile.gpu_milli, profile.name, start)
        return milli, profile.mem_mib, profile.slice_mask(start), unit

    def _shares(self, n: int, d: int, req: Request) -> tuple[int, int]:
        """The compute and memory one GPU of `req` holds on shared device d: whole shares where the GPU's
        shares are known (what covers both asks), the ask itself elsewhere."""
        size = self.share_size[n][d]
        if size is None:
            return req.gpu_milli, req.gpu_mem_mib
        milli, mem = size
        count = max(-(-req.gpu_milli // milli), -(-req.gpu_mem_mib // mem) if mem else 0, 1)
        # N shares of 1000 // N milli add up to a little under 1000 (3 × 333): a task asking the whole GPU
        # holds every share, not one more than there are.
        shares = WHOLE_GPU_MILLI // milli
        fits = not mem or req.gpu_mem_mib <= shares * mem
        if count > shares and req.gpu_milli <= WHOLE_GPU_MILLI and fits:
            count = shares
        return count * milli, count * mem

    def bind(self, task_id: str, n: int, devices: tuple[int, ...], req: Request) -> Binding:
        held_milli: list[int] = []
        held_mem: list[int] = []
        held_slices: list[int] = []
        held_instances: list[MigInstance | None] = []
        unit = ComputeUnit(UnitKind.NONE, 0)
        for d in devices:
            milli, mem, slices, unit = self._unit_on(n, d, req)
            self.gpu_free[n][d] -= milli
            self.gpu_mem_free[n][d] -= mem
            self.mig_used[n][d] |= slices
            instance = None
            if unit.kind is UnitKind.MIG and self.mig_free[n][d] is not None:
                instance = (unit.mig_profile or "", unit.mig_start_slice or 0)
                self._take_instance(n, d, instance)
            held_instances.append(instance)
            self.np_gpu_free[n, d] = self.gpu_free[n][d]
            if self.schedulable[n]:
                self.free_milli_total -= milli
            held_milli.append(milli)
            held_mem.append(mem)
            held_slices.append(slices)
        binding = Binding(
            task_id,
            n,
            devices,
            tuple(held_milli),
            tuple(held_mem),
            tuple(held_slices),
            req.cpu_milli,
            req.mem_mib,
            req.num_gpu * req.gpu_milli,
            task_class(req),
            unit,
            tuple(held_instances),
        )
        self._account(binding, +1)
        return binding

    def _take_instance(self, n: int, d: int, instance: MigInstance) -> None:
        free = self.mig_free[n][d] or ()
        self.mig_free[n][d] = tuple(i for i in free if i != instance)

    def _give_instances(self, binding: Binding, sign: int) -> None:
        """Put a binding's carved instances back on their GPUs' free lists (sign -1: take them again)."""
        if not binding.held_instances:
            return
        n = binding.node
        for d, instance in zip(binding.gpu_indexes, binding.held_instances, strict=True):
            if instance is None or self.mig_free[n][d] is None:
                continue
            if sign > 0:
                self.mig_free[n][d] = tuple(sorted({*(self.mig_free[n][d] or ()), instance}))
            else:
                self._take_instance(n, d, instance)

    def release(self, task_id: str) -> Binding:
        binding = self.bindings[task_id]
        self.releases += 1
        n = binding.node
        for d, milli, mem, slices in zip(
            binding.gpu_indexes,
            binding.held_milli,
            binding.held_gpu_mem_mib,
            binding.held_slices,
            strict=True,
        ):
            self.gpu_free[n][d] += milli
            self.gpu_mem_free[n][d] += mem
            self.mig_used[n][d] &= ~slices
            self.np_gpu_free[n, d] = self.gpu_free[n][d]
            if self.schedulable[n]:
                self.free_milli_total += milli
        self._give_instances(binding, +1)
        self._account(binding, -1)
        return binding

    def restore(self, binding: Binding) -> None:
        """Put back a binding exactly as it was (after a trial release)."""
        n = binding.node
        for d, milli, mem, slices in zip(
            binding.gpu_indexes,
            binding.held_milli,
            binding.held_gpu_mem_mib,
            binding.held_slices,
            strict=True,
        ):
            self.gpu_free[n][d] -= milli
            self.gpu_mem_free[n][d] -= mem
            self.mig_used[n][d] |= slices
            self.np_gpu_free[n, d] = self.gpu_free[n][d]
            if self.schedulable[n]:
                self.free_milli_total -= milli
        self._give_instances(binding, -1)
        self._account(binding, +1)

    def _account(self, binding: Binding, sign: int) -> None:
        n = binding.node
        self.cpu_free[n] -= sign * binding.cpu_milli
        self.mem_free[n] -= sign * binding.mem_mib
        self.np_cpu_free[n] = self.cpu_free[n]
        self.np_mem_free[n] = self.mem_free[n]
        self.np_free_desc[n, : self.gpu_count[n]] = sorted(self.gpu_free[n], reverse=True)
        counts = self.classes[n]
        counts[binding.task_class] = counts.get(binding.task_class, 0) + sign
        if counts[binding.task_class] == 0:
            del counts[binding.task_class]
        if sign > 0:
            self.bindings[binding.task_id] = binding
        else:
            del self.bindings[binding.task_id]
        self.version[n] += 1
        self.changes += 1
        log = self.change_log
        log.append(n)
        if len(log) > self.log_limit:
            dropped = len(log) // 2
            del log[:dropped]
            self.log_start += dropped
        key = self._key(n)
        self.node_key[n] = key
        self.class_id[n] = self._class_of(key)
        for ref in self.listeners:
            if (listener := ref()) is not None:
                listener(n)

    def listen(self, method: Callable[[int], None]) -> None:
        """Call the bound `method` with a node position after every change to that node, for as long as
        its object lives (the state does not keep it alive)."""
        self.listeners.append(weakref.WeakMethod(method))

    def adopt(self, task: RunningTask) -> None:
        """Record a task the snapshot already shows as running.

        Node free figures in the snapshot already exclude it, so only the bookkeeping that scores and
        preemption read (classes, bindings) changes.
        """
        n = self.index.get(task.node)
        if n is None:
            return
        positions = {index: d for d, index in enumerate(self.gpu_index[n])}
        devices = tuple(positions[i] for i in task.gpu_indexes if i in positions)
        req = Request(
            task.cpu_milli, task.mem_mib, len(devices), task.gpu_milli, task.gpu_mem_mib, frozenset()
        )
        # A MIG instance holds memory slices as well as milli: record them so that a (trial) release
        # frees the slices too, not only the compute share.
        slices = 0
        unit = ComputeUnit(UnitKind.SHARE if req.is_share else UnitKind.WHOLE, task.gpu_milli)
        model = self.models[n]
        instance: MigInstance | None = None
        if task.mig_profile is not None and task.mig_start_slice is not None and model is not None:
            profile = profile_by_name(model, task.mig_profile)
            slices = profile.slice_mask(task.mig_start_slice)
            unit = ComputeUnit(UnitKind.MIG, profile.gpu_milli, profile.name, task.mig_start_slice)
            instance = (profile.name, task.mig_start_slice)
        holds = [
            self._shares(n, d, req)
            if self.modes[n][d] is PartitionMode.SHARED
            else (req.gpu_milli, req.gpu_mem_mib)
            for d in devices
        ]
        binding = Binding(
            task.task_id,
            n,
            devices,
            # On a GPU of alike shares the task holds whole shares: a trial release frees all of them.
            tuple(held[0] for held in holds),
            tuple(held[1] for held in holds),
            tuple(slices if self.modes[n][d] is PartitionMode.MIG else 0 for d in devices),
            task.cpu_milli,
            task.mem_mib,
            task.gpu_milli * len(devices),
            task_class(req),
            unit,
            # Its instance is not on the free list (the snapshot lists free units only); a trial release
            # puts it there.
            tuple(instance if self.mig_free[n][d] is not None else None for d in devices),
        )
        counts = self.classes[n]
        counts[binding.task_class] = counts.get(binding.task_class, 0) + 1
        self.bindings[task.task_id] = binding

    # -- views -------------------------------------------------------------------------------------

    def node_state(self, n: int) -> NodeState:
        model = self.models[n] or ""
        gpus = tuple(
            GpuState(
                self.gpu_index[n][d],
                model,
                self.gpu_free[n][d],
                self.gpu_mem_free[n][d],
                self.gpu_mem_total[n][d],
                self.modes[n][d],
                self.mig_used[n][d],
                self.mig_free[n][d],
                *(self.share_size[n][d] or (0, 0)),
            )
            for d in range(self.gpu_count[n])
        )
        return NodeState(
            self.names[n],
            self.cpu_total[n],
            self.cpu_free[n],
            self.mem_total[n],
            self.mem_free[n],
            gpus,
            self.schedulable[n],
        )

    def nodes(self) -> tuple[NodeState, ...]:
        return tuple(self.node_state(n) for n in range(len(self)))

    def has_devices(
        self, nodes: npt.NDArray[np.intp] | slice, count: int, milli: int
    ) -> npt.NDArray[np.bool_]:
        """Per node in `nodes`: has it `count` GPUs with at least `milli` free (any partition mode)?"""
        if count > self.np_free_desc.shape[1]:
            return np.zeros(len(self.np_free_desc[nodes]), bool)
        fits: npt.NDArray[np.bool_] = self.np_free_desc[nodes, count - 1] >= milli
        return fits

    def allowed_mask(self, req: Request) -> npt.NDArray[np.bool_]:
        if req.num_gpu == 0 or not req.allowed_models:
            return self.np_schedulable.copy()
        ids = [self.model_ids[m] for m in req.allowed_models if m in self.model_ids]
        return self.np_schedulable & np.isin(self.model_of, ids)
