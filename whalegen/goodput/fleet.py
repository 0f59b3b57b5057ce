"""The fleet of a goodput replay, from a YAML file (`--fleet FILE`; docs/notes/goodput-design.md §4).

```yaml
name: default-mixed
pools:
  - name: h100-train
    gpu_model: H100          # a catalogue name or alias (whalegen/gpus/catalogue.py)
    nodes: 4                 # identical nodes in the pool
    gpus_per_node: 8
    cpu_cores: 112           # per node
    mem_gib: 2048            # host memory per node
    gpus:                    # optional; GPUs not listed are whole. Counts are per node.
      - {mode: mig, count: 2, layout: [3g.40gb, 2g.20gb, 2g.20gb]}
      - {mode: mps, count: 2, max_shares: 2}
      - {mode: time-slice, count: 1, max_shares: 4}
```

Every error is one line that names the file and the field (`pools[1].gpus[0].layout: …`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from whalegen.gpus.catalogue import UnknownGpuModel, get_model
from whalegen.gpus.mig import mig_profiles, profile_by_name
from whalegen.gpus.mig_plan import Wanted, plan_placements
from whalegen.placement.types import WHOLE_GPU_MILLI, GpuState, NodeState, PartitionMode

# CUDA MPS accepts at most 48 client contexts per GPU on Volta and later (NVIDIA MPS documentation,
# "Limitations"); a time slice has no hardware bound, so the same ceiling keeps a typo from passing.
MAX_SHARES = 48


class GpuMode(StrEnum):
    WHOLE = "whole"
    MPS = "mps"
    TIME_SLICE = "time-slice"
    MIG = "mig"


@dataclass(frozen=True)
class GpuGroup:
    """`count` GPUs of each node in one mode."""

    mode: GpuMode
    count: int
    layout: tuple[str, ...] = ()  # MIG profile names, for mode mig
    max_shares: int = 1  # tasks that may share one GPU (mps, time-slice); 1 for whole and mig


@dataclass(frozen=True)
class PoolSpec:
    name: str
    gpu_model: str  # canonical catalogue name
    nodes: int
    gpus_per_node: int
    cpu_milli: int  # per node
    mem_mib: int  # per node
    gpus: tuple[GpuGroup, ...]  # per node; counts add up to gpus_per_node

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class FleetSpec:
    name: str
    pools: tuple[PoolSpec, ...]

    @property
    def total_gpus(self) -> int:
        return sum(pool.total_gpus for pool in self.pools)

    def gpus_by_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for pool in self.pools:
            counts[pool.gpu_model] = counts.get(pool.gpu_model, 0) + pool.total_gpus
        return counts


class FleetError(ValueError):
    pass


_POOL_KEYS = {"name", "gpu_model", "nodes", "gpus_per_node", "cpu_cores", "mem_gib", "gpus"}
_GROUP_KEYS = {"mode", "count", "layout", "max_shares"}


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FleetError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _no_unknown(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        field = f"{where}.{unknown[0]}" if where else unknown[0]
        raise FleetError(f"{field}: unknown field (allowed: {', '.join(sorted(allowed))})")


def _positive_int(data: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if value is None:
        raise FleetError(f"{where}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FleetError(f"{where}.{key}: must be a positive integer, got {value!r}")
    return value


def _positive_number(data: Mapping[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if value is None:
        raise FleetError(f"{where}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise FleetError(f"{where}.{key}: must be a positive number, got {value!r}")
    return float(value)


def _group(raw: object, model: str, where: str) -> GpuGroup:
    data = _mapping(raw, where)
    _no_unknown(data, _GROUP_KEYS, where)
    try:
        mode = GpuMode(str(data.get("mode", "")))
    except ValueError:
        modes = ", ".join(m.value for m in GpuMode)
        raise FleetError(f"{where}.mode: must be one of {modes}, got {data.get('mode')!r}") from None
    count = _positive_int(data, "count", where)
    if mode is GpuMode.MIG:
        if "max_shares" in data:
            raise FleetError(f"{where}.max_shares: MIG instances are not shared; use more instances")
        return GpuGroup(mode, count, _layout(data.get("layout"), model, f"{where}.layout"))
    if "layout" in data:
        raise FleetError(f"{where}.layout: only mode mig takes a layout")
    if mode is GpuMode.WHOLE:
        if "max_shares" in data:
            raise FleetError(f"{where}.max_shares: a whole GPU runs one task; use mode mps or time-slice")
        return GpuGroup(mode, count)
    shares = _positive_int(data, "max_shares", where, default=2)
    if not 2 <= shares <= MAX_SHARES:
        raise FleetError(f"{where}.max_shares: must be 2 … {MAX_SHARES}, got {shares}")
    return GpuGroup(mode, count, max_shares=shares)


def _layout(raw: object, model: str, where: str) -> tuple[str, ...]:
    """MIG profile names that fit one GPU of `model` together (whalegen/gpus/mig_plan.py)."""
    profiles = mig_profiles(model)
    if not profiles:
        raise FleetError(f"{where}: {model} has no MIG")
    if not isinstance(raw, list) or not raw or not all(isinstance(name, str) for name in raw):
        raise FleetError(f"{where}: must be a non-empty list of MIG profile names, e.g. [3g.40gb, 4g.40gb]")
    wanted = []
    for name in raw:
        try:
            wanted.append(Wanted(profile_by_name(model, name).profile_id))
        except LookupError as error:
            raise FleetError(f"{where}: {error}") from None
    if plan_placements(profiles, (), wanted) is None:
        raise FleetError(f"{where}: {', '.join(raw)} do not fit one {model} together (MIG slice geometry)")
    return tuple(raw)


def _pool(raw: object, where: str) -> PoolSpec:
    data = _mapping(raw, where)
    _no_unknown(data, _POOL_KEYS, where)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise FleetError(f"{where}.name: required, a non-empty string")
    try:
        model = get_model(str(data.get("gpu_model", "")))
    except UnknownGpuModel as error:
        raise FleetError(f"{where}.gpu_model: {error}") from None
    if model.opaque:
        raise FleetError(
            f"{where}.gpu_model: {model.name} has no published figures; the speed model needs them"
        )
    gpus_per_node = _positive_int(data, "gpus_per_node", where)
    raw_groups = data.get("gpus", [])
    if not isinstance(raw_groups, list):
        raise FleetError(f"{where}.gpus: must be a list of {{mode, count}} groups")
    groups = [_group(g, model.name, f"{where}.gpus[{i}]") for i, g in enumerate(raw_groups)]
    listed = sum(g.count for g in groups)
    if listed > gpus_per_node:
        raise FleetError(
            f"{where}.gpus: the groups count {listed} GPUs, more than gpus_per_node {gpus_per_node}"
        )
    if listed < gpus_per_node:
        groups.append(GpuGroup(GpuMode.WHOLE, gpus_per_node - listed))
    return PoolSpec(
        name=name.strip(),
        gpu_model=model.name,
        nodes=_positive_int(data, "nodes", where),
        gpus_per_node=gpus_per_node,
        cpu_milli=round(_positive_number(data, "cpu_cores", where) * 1000),
        mem_mib=round(_positive_number(data, "mem_gib", where) * 1024),
        gpus=tuple(groups),
    )


def parse_fleet(data: object, source: str = "fleet") -> FleetSpec:
    """Validate a parsed document; FleetError names `source` and the field."""
    try:
        top = _mapping(data, "document")
        _no_unknown(top, {"name", "pools"}, "")
        pools_raw = top.get("pools")
        if not isinstance(pools_raw, list) or not pools_raw:
            raise FleetError("pools: required, a non-empty list")
        pools = tuple(_pool(p, f"pools[{i}]") for i, p in enumerate(pools_raw))
        seen: set[str] = set()
        for i, pool in enumerate(pools):
            if pool.name in seen:
                raise FleetError(f"pools[{i}].name: duplicate pool name {pool.name!r}")
            seen.add(pool.name)
    except FleetError as error:
        raise FleetError(f"{source}: {error}") from None
    return FleetSpec(str(top.get("name", Path(source).stem)), pools)


def load_fleet(path: Path) -> FleetSpec:
    if not path.is_file():
        raise FleetError(f"{path}: fleet file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else "invalid YAML"
        raise FleetError(f"{path}: not valid YAML ({first})") from None
    return parse_fleet(data, str(path))


_PARTITION = {
    GpuMode.WHOLE: PartitionMode.WHOLE,
    GpuMode.MPS: PartitionMode.SHARED,
    GpuMode.TIME_SLICE: PartitionMode.SHARED,
    GpuMode.MIG: PartitionMode.MIG,
}


def fleet_nodes(fleet: FleetSpec) -> tuple[NodeState, ...]:
    """The fleet as idle placement nodes, named `<pool>-<n>` (n from 0), GPUs in the groups' order.

    An MPS or time-sliced GPU of `max_shares` N is cut into N alike shares (1000 // N milli and 1/N of the
    memory each; GpuState.share_milli): a task holds whole shares, so at most N tasks share the GPU. The
    MIG layout is lost here, on purpose and visibly: a MIG GPU starts with no instance and the engine
    carves the smallest profile that fits each request.
    """
    nodes = []
    for pool in fleet.pools:
        memory = get_model(pool.gpu_model).mem_mib or 0
        groups = [group for group in pool.gpus for _ in range(group.count)]
        for n in range(pool.nodes):
            gpus = tuple(_gpu_state(i, pool.gpu_model, memory, group) for i, group in enumerate(groups))
            nodes.append(
                NodeState(
                    f"{pool.name}-{n}", pool.cpu_milli, pool.cpu_milli, pool.mem_mib, pool.mem_mib, gpus
                )
            )
    return tuple(nodes)


def _gpu_state(index: int, model: str, memory_mib: int, group: GpuGroup) -> GpuState:
    mode = _PARTITION[group.mode]
    shares = group.max_shares if mode is PartitionMode.SHARED else 1
    return GpuState(
        index,
        model,
        WHOLE_GPU_MILLI,
        memory_mib,
        memory_mib,
        mode,
        share_milli=WHOLE_GPU_MILLI // shares if shares > 1 else 0,
        share_mem_mib=memory_mib // shares if shares > 1 else 0,
    )
