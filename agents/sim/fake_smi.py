"""A stand-in `nvidia-smi` reading a simulated host (reference §9.2: `-r -i`, `mig -lgip`, `-lgipp`).

The host comes from `WHALEGEN_SIM_SPEC` (and `WHALEGEN_SIM_NODE`), plus the driver-state file named by
`WHALEGEN_SIM_STATE` when the simulated driver has one. Supported:

    nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current,mig.mode.pending,compute_mode
               --format=csv,noheader,nounits
    nvidia-smi mig -lgip | -lgipp
    nvidia-smi -r -i <index or UUID>      (needs WHALEGEN_SIM_STATE: a reset changes the driver state)

Output follows the real tool's shapes closely enough for scripts that parse it (`scripts/gpu-check`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agents.sim.core import SimGpu, SimNvmlError, SimSystem
from agents.sim.spec import build_system, load_spec
from whalegen.gpus.mig_plan import remaining_capacity

COMPUTE_MODES = {0: "Default", 2: "Prohibited", 3: "Exclusive_Process"}


def _system() -> SimSystem:
    spec = os.environ.get("WHALEGEN_SIM_SPEC")
    if not spec:
        print("nvidia-smi (simulated): set WHALEGEN_SIM_SPEC", file=sys.stderr)
        raise SystemExit(9)
    state = os.environ.get("WHALEGEN_SIM_STATE")
    return build_system(
        load_spec(spec), os.environ.get("WHALEGEN_SIM_NODE"), state_path=Path(state) if state else None
    )


def _field(gpu: SimGpu, name: str) -> str:
    mig = {1: "Enabled", 0: "Disabled"}
    values = {
        "index": str(gpu.index),
        "uuid": gpu.uuid,
        "name": gpu.sku.nvml_name,
        "memory.total": str(gpu.sku.total_mem_mib),
        "mig.mode.current": mig[gpu.mig_current] if gpu.sku.mig_capable else "[N/A]",
        "mig.mode.pending": mig[gpu.mig_pending] if gpu.sku.mig_capable else "[N/A]",
        "compute_mode": COMPUTE_MODES.get(gpu.compute_mode, str(gpu.compute_mode)),
    }
    if name not in values:
        raise SystemExit(f'Field "{name}" is not a valid field to query.')
    return values[name]


def _lgip(system: SimSystem) -> list[str]:
    lines = [
        "+" + "-" * 77 + "+",
        "| GPU instance profiles:" + " " * 54 + "|",
        "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                              Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 77 + "|",
    ]
    for gpu in system.gpus:
        if not gpu.mig_current:
            continue
        for profile in sorted(gpu.sku.gi_profiles, key=lambda p: p.index):
            free = remaining_capacity(gpu.sku.gi_profiles, gpu.placed(), profile.profile_id)
            counts = f"{free}/{profile.max_instances}"
            row = (
                f"|   {gpu.index}  MIG {profile.name:<13}{profile.profile_id:>3}     {counts}"
                f"{profile.mem_mib / 1024:>12.2f}       No  {profile.sm_count or 0:>5}"
            )
            lines.append(row.ljust(78) + "|")
    lines.append("+" + "-" * 77 + "+")
    return lines


def _lgipp(system: SimSystem) -> list[str]:
    lines = []
    for gpu in system.gpus:
        if not gpu.mig_current:
            continue
        for profile in sorted(gpu.sku.gi_profiles, key=lambda p: p.index):
            starts = ",".join(str(s) for s in profile.starts)
            where = f"{{{starts}}}:{profile.memory_slices}"
            lines.append(f"GPU  {gpu.index} Profile ID {profile.profile_id:>2} Placements: {where}")
    return lines


def main(argv: list[str]) -> int:
    system = _system()
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        for gpu in system.gpus:
            print(", ".join(_field(gpu, name.strip()) for name in query.split(",")))
        return 0
    if argv[:1] == ["mig"] and argv[1:2] in (["-lgip"], ["-lgipp"]):
        lines = _lgip(system) if argv[1] == "-lgip" else _lgipp(system)
        if not any(gpu.mig_current for gpu in system.gpus):
            print("No MIG-enabled devices found.")
            return 6
        print("\n".join(lines))
        return 0
    if argv[:1] == ["-r"] and len(argv) == 3 and argv[1] == "-i":
        target = next((g for g in system.gpus if argv[2] in {str(g.index), g.uuid}), None)
        if target is None:
            print(f"No devices were found matching {argv[2]}", file=sys.stderr)
            return 6
        try:
            system.reset(target.index)
        except SimNvmlError as error:
            print(f"GPU {target.pci_bus_id}: {error.detail or error.code.name}", file=sys.stderr)
            return 1
        system._persist()
        print(f"GPU {target.pci_bus_id} was successfully reset.")
        return 0
    print(f"nvidia-smi (simulated): unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
