"""Unit-exact pools for `decide` tests, built through the same rule the production reader uses
(`whalegen.scheduling.snapshot.gpu_picture`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from whalegen.gpus.mig import profile_by_name
from whalegen.placement.types import NodeState, PartitionMode, Quota, RunningTask, TaskRequest
from whalegen.scheduling import Snapshot
from whalegen.scheduling.snapshot import GpuFacts, UnitFact, gpu_picture

H100 = "H100-80GB"
H100_MEM = 81_559


@dataclass(frozen=True)
class Gpu:
    """A GPU spec: `whole` (free or held), `mig` with its layout [(profile, start, held)], or `mps` with
    `shares` units of which `held` are taken."""

    mode: str
    held: bool = False
    layout: tuple[tuple[str, int, bool], ...] = ()
    shares: int = 4
    held_shares: int = 0


def whole(*, held: bool = False) -> Gpu:
    return Gpu("whole", held=held)


def mig(*layout: tuple[str, int, bool]) -> Gpu:
    return Gpu("mig", layout=tuple(layout))


def mps(shares: int = 4, held: int = 0) -> Gpu:
    return Gpu("mps", shares=shares, held_shares=held)


@dataclass
class Pool:
    nodes: list[tuple[str, Sequence[Gpu], int, int]] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def node(self, name: str, *gpus: Gpu, cpu_milli: int = 64_000, mem_mib: int = 512 * 1024) -> Pool:
        self.nodes.append((name, gpus, cpu_milli, mem_mib))
        return self

    def _units(self, spec: Gpu) -> tuple[PartitionMode, tuple[UnitFact, ...]]:
        if spec.mode == "whole":
            return PartitionMode.WHOLE, (UnitFact(next(self.ids), "whole", 1000, H100_MEM, spec.held),)
        if spec.mode == "mps":
            units = tuple(
                UnitFact(
                    next(self.ids), "mps", 1000 // spec.shares, H100_MEM // spec.shares, i < spec.held_shares
                )
                for i in range(spec.shares)
            )
            return PartitionMode.SHARED, units
        units = []
        for profile_name, start, held in spec.layout:
            profile = profile_by_name(H100, profile_name)
            units.append(
                UnitFact(next(self.ids), "mig", profile.gpu_milli, profile.mem_mib, held, profile.name, start)
            )
        return PartitionMode.MIG, tuple(units)

    def snapshot(
        self,
        pending: Sequence[TaskRequest] = (),
        *,
        running: Sequence[RunningTask] = (),
        quotas: Sequence[Quota] = (),
        expected_end_s: dict[str, float | None] | None = None,
        expected_runtime_s: dict[str, float | None] | None = None,
    ) -> Snapshot:
        from whalegen.placement.types import ClusterSnapshot

        nodes: list[NodeState] = []
        free_units = {}
        views = {}
        idle = {}
        for name, gpus, cpu, mem in self.nodes:
            states = []
            for index, spec in enumerate(gpus):
                mode, units = self._units(spec)
                picture = gpu_picture(GpuFacts(name, index, H100, H100_MEM, mode, units))
                states.append(picture.state)
                if picture.free_units:
                    free_units[(name, index)] = picture.free_units
                views[(name, index)] = picture.view
                if picture.idle_mig is not None:
                    idle[(name, index)] = picture.idle_mig
            nodes.append(NodeState(name, cpu, cpu, mem, mem, tuple(states)))
        return Snapshot(
            cluster=ClusterSnapshot(tuple(nodes), tuple(pending), tuple(running), tuple(quotas)),
            free_units=free_units,
            gpu_views=views,
            idle_mig=idle,
            expected_end_s=expected_end_s or {},
            expected_runtime_s=expected_runtime_s or {},
        )
