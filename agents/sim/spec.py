"""Fleets for the simulated NVML, described in a small YAML or JSON document.

```yaml
driver_version: "570.124.06"
nodes:
  - name: node-a
    root: true                    # false: NVML's NO_PERMISSION on management calls
    auto_placement: lowest-first  # or observed-a100 (what CreateGpuInstance without placement does)
    gpus:
      - sku: h100-80gb-sxm        # a key of whalegen.gpus.skus.SKUS
        count: 2
        mig: enabled              # enabled | disabled (initial mode, current = pending)
        reset_supported: true     # false: a passthrough VM (RESET_REQUIRED)
      - sku: l40s
```
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agents.sim.core import CallLog, SimClock, SimGpu, SimSystem, gpu_uuid
from whalegen.gpus.skus import get_sku

# The host `whalegen agent --backend sim` plays without --sim-spec; shipped as package data (pyproject.toml).
EXAMPLE_HOST_SPEC = Path(__file__).with_name("example-host.yaml")


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class NodeSpec:
    name: str
    data: dict[str, Any]


def load_spec(path: Path | str) -> dict[str, Any]:
    text = Path(path).read_text()
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise SpecError(f"{path}: a simulator spec needs a non-empty `nodes` list")
    return data


def node_spec(spec: dict[str, Any], name: str | None = None) -> NodeSpec:
    nodes = spec["nodes"]
    if name is None:
        return NodeSpec(str(nodes[0].get("name", "node-0")), nodes[0])
    for node in nodes:
        if node.get("name") == name:
            return NodeSpec(name, node)
    raise SpecError(f"no node {name!r} in the spec (have: {', '.join(str(n.get('name')) for n in nodes)})")


def build_system(
    spec: dict[str, Any],
    node: str | None = None,
    *,
    clock: SimClock | None = None,
    call_log_path: Path | None = None,
    control_dir: Path | None = None,
    proc_dir: Path | None = None,
    state_path: Path | None = None,
) -> SimSystem:
    chosen = node_spec(spec, node)
    gpus: list[SimGpu] = []
    for row in chosen.data.get("gpus", []):
        try:
            sku = get_sku(str(row["sku"]))
        except (KeyError, LookupError) as error:
            raise SpecError(f"node {chosen.name}: {error}") from None
        mig = str(row.get("mig", "disabled"))
        if mig not in {"enabled", "disabled"}:
            raise SpecError(f"node {chosen.name}: mig must be enabled or disabled, not {mig!r}")
        if mig == "enabled" and not sku.mig_capable:
            raise SpecError(f"node {chosen.name}: {sku.key} has no MIG")
        for _ in range(int(row.get("count", 1))):
            index = len(gpus)
            mode = 1 if mig == "enabled" else 0
            gpus.append(
                SimGpu(
                    index=index,
                    sku=sku,
                    uuid=gpu_uuid(chosen.name, index),
                    pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                    reset_supported=bool(row.get("reset_supported", True)),
                    mig_query_mode_independent=bool(row.get("mig_query_mode_independent", False)),
                    mig_current=mode,
                    mig_pending=mode,
                    attached_clients=set(row.get("attached_clients", [])),
                )
            )
    return SimSystem(
        gpus,
        driver_version=str(spec.get("driver_version", "570.124.06")),
        root=bool(chosen.data.get("root", True)),
        mig_config_capability=bool(chosen.data.get("mig_config_capability", False)),
        auto_placement=str(chosen.data.get("auto_placement", "lowest-first")),
        clock=clock,
        call_log=CallLog(call_log_path),
        control_dir=control_dir,
        proc_dir=proc_dir,
        state_path=state_path,
    )
