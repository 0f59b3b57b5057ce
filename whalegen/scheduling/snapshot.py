"""From the units a GPU has to what the engine and `decide` see of it: one rule, used by the production
snapshot reader and by every test that builds a pool by hand."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from whalegen.gpus.mig import MEMORY_SLICES, mig_profiles
from whalegen.placement.recarve import FreeInstance, IdleMigGpu
from whalegen.placement.repartition import CarvedUnit, GpuView
from whalegen.placement.types import WHOLE_GPU_MILLI, GpuState, PartitionMode
from whalegen.scheduling.types import FreeUnit

ALL_SLICES = (1 << MEMORY_SLICES) - 1


@dataclass(frozen=True)
class UnitFact:
    unit_id: int
    kind: str  # "whole", "mig", "mps", "time_slice"
    gpu_milli: int
    mem_mib: int
    held: bool
    mig_profile: str = ""
    mig_start: int | None = None


@dataclass(frozen=True)
class GpuFacts:
    node: str
    index: int
    model: str
    mem_mib: int
    mode: PartitionMode
    units: tuple[UnitFact, ...]
    healthy: bool = True
    stopping: bool = False  # a released task's process may still run on it
    claimed_by: tuple[str, ...] = ()  # tasks an earlier cycle re-carved it for
    layout_ok: bool = True  # False while the agent reports it could not apply the planned layout


@dataclass(frozen=True)
class GpuPicture:
    state: GpuState
    free_units: tuple[FreeUnit, ...]  # empty when the GPU takes nothing new
    view: GpuView
    idle_mig: IdleMigGpu | None


def engine_gpu(gpu: GpuState, free: Sequence[FreeUnit]) -> GpuState:
    """`gpu` as the engine should see it when exactly `free` are its free units (the rule of
    `gpu_picture`, for a GPU some of whose units a cycle has just bound)."""
    free_milli = sum(u.gpu_milli for u in free)
    used_slices = 0
    instances = None
    if gpu.mode is PartitionMode.MIG:
        profiles = {p.name: p for p in mig_profiles(gpu.model)}
        open_slices = 0
        for u in free:
            profile = profiles.get(u.mig_profile)
            if profile is not None and u.mig_start is not None:
                open_slices |= profile.slice_mask(u.mig_start)
        used_slices = ALL_SLICES & ~open_slices
        if used_slices == 0:
            free_milli = WHOLE_GPU_MILLI
        instances = carved(free)
    return replace(
        gpu,
        free_milli=min(free_milli, WHOLE_GPU_MILLI),
        free_mem_mib=sum(u.mem_mib for u in free),
        mig_used_slices=used_slices,
        mig_free_instances=instances,
    )


def carved(free: Sequence[FreeUnit | UnitFact]) -> tuple[tuple[str, int], ...]:
    """The free MIG instances among these units, as the engine takes them (GpuState.mig_free_instances)."""
    return tuple(
        sorted((u.mig_profile, u.mig_start) for u in free if u.mig_profile and u.mig_start is not None)
    )


def alike_shares(g: GpuFacts) -> tuple[int, int]:
    """One share's (milli, memory) on a shared GPU whose shares are all alike, else (0, 0): the engine
    then holds whole shares per task, as the commit binds them (GpuState.share_milli)."""
    if g.mode is not PartitionMode.SHARED or not g.units:
        return 0, 0
    sizes = {(u.gpu_milli, u.mem_mib) for u in g.units}
    if len(sizes) != 1:
        return 0, 0
    milli, mem = sizes.pop()
    return (milli, mem) if milli > 0 else (0, 0)


def gpu_picture(g: GpuFacts) -> GpuPicture:
    free = [u for u in g.units if not u.held]
    view = GpuView(
        name=f"GPU {g.index} on {g.node}",
        model=g.model,
        mode=g.mode,
        units=tuple(CarvedUnit(u.mig_profile, u.mig_start, u.held) for u in g.units),
        healthy=g.healthy,
        stopping=g.stopping,
        claimed_by=g.claimed_by,
    )
    # Promised to a repartition, unhealthy, or its layout not applied: full to the engine.
    usable = g.healthy and not g.claimed_by and g.layout_ok
    free_milli = sum(u.gpu_milli for u in free) if usable else 0
    free_mem = sum(u.mem_mib for u in free) if usable else 0
    used_slices = 0
    instances = None
    idle: IdleMigGpu | None = None
    if g.mode is PartitionMode.MIG:
        instances = carved(free) if usable else ()
        # The engine sees the free carved instances only: slices outside them are unusable without a new
        # layout. An idle GPU may still be re-carved, but only for tasks no present unit holds.
        open_slices = 0
        if usable:
            profiles = {p.name: p for p in mig_profiles(g.model)}
            for u in free:
                profile = profiles.get(u.mig_profile)
                if profile is not None and u.mig_start is not None:
                    open_slices |= profile.slice_mask(u.mig_start)
        used_slices = ALL_SLICES & ~open_slices
        if used_slices == 0:
            # Carved instances need not add up to 1000 (two 3g on an H100 are 856 milli); with every
            # slice free, whatever instance covers them gets all the compute.
            free_milli = WHOLE_GPU_MILLI
        if usable and len(free) == len(g.units) and not g.stopping:
            idle = IdleMigGpu(
                g.node,
                g.index,
                tuple(FreeInstance(u.mig_profile, u.mig_start, u.gpu_milli, u.mem_mib) for u in free),
            )
    share_milli, share_mem = alike_shares(g)
    state = GpuState(
        index=g.index,
        model=g.model,
        free_milli=min(free_milli, WHOLE_GPU_MILLI),
        free_mem_mib=free_mem,
        total_mem_mib=g.mem_mib,
        mode=g.mode,
        mig_used_slices=used_slices,
        mig_free_instances=instances,
        share_milli=share_milli,
        share_mem_mib=share_mem,
    )
    units = (
        tuple(FreeUnit(u.unit_id, u.kind, u.gpu_milli, u.mem_mib, u.mig_profile, u.mig_start) for u in free)
        if usable
        else ()
    )
    return GpuPicture(state, units, view, idle)
