"""The simulated host's CDI spec: device nodes for its GPUs and MIG slots, and the spec that names them.

So that a container run on the simulator takes the same code path as on a real host (issue 37, item 2):
the simulated backend names its devices in CDI, podman applies the spec, and the process runtime masks
the nodes a run was not given.

- Kind `sim.whalegen.dev/gpu-<8 hex>`: the hex is of the simulated host's directory, so the many
  simulated hosts one test machine runs at once never define the same device.
- Device nodes live in `<host dir>/dev/`: as root, character devices with /dev/null's numbers (1:3, so
  opening one is harmless and a container's device cgroup allows nothing new); not root, empty regular
  files (a non-root agent runs no containers, and masking needs only paths). Inside a container they
  appear where the real ones would: `/dev/nvidia<i>`, `/dev/nvidiactl`, `/dev/nvidia-uvm`.
- A whole GPU is named by its UUID, as nvidia-ctk's uuid strategy does.
- A MIG instance is named by its GPU's UUID and its GPU instance's placement start,
  `<GPU uuid>-mig<start>`, not by its MIG UUID: the simulator's MIG UUIDs are new at every carve, and
  a name fixed by placement lets the spec, written once when the backend opens, name every instance
  the agent may ever carve. (A real host's spec must be regenerated after a re-carve instead.) At most
  one GPU instance starts at a slice at a time; compute instances of one GPU instance share its name.
  Its nodes are the parent GPU's node and a cap node of the slot, as nvidia-ctk gives a MIG device its
  parent's /dev/nvidia<i> and its /dev/nvidia-caps/nvidia-cap<N> nodes.
- The spec file `whalegen-sim-<8 hex>.json` goes to `/var/run/cdi` (podman reads it there) as root, else
  to `<host dir>/cdi`; `WHALEGEN_SIM_CDI_DIR` or an argument chooses another. It is removed on close;
  specs of simulated hosts whose directory is gone (an agent killed with -9 in a test) are pruned
  when another opens.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.isolation.cdi import qualified_name
from agents.sim.core import SimGpu, SimSystem

CDI_VERSION = "0.5.0"  # podman 4.3 reads it (checked), and nvidia-ctk writes it
VENDOR = "sim.whalegen.dev"
SPEC_PREFIX = "whalegen-sim-"
ENV_CDI_DIR = "WHALEGEN_SIM_CDI_DIR"
RUN_CDI_DIR = Path("/var/run/cdi")
NULL_DEVICE = (1, 3)  # /dev/null's major and minor


@dataclass(frozen=True)
class SimCdi:
    host_dir: Path
    spec_dir: Path

    @property
    def key(self) -> str:
        return hashlib.sha256(str(self.host_dir.resolve()).encode()).hexdigest()[:8]

    @property
    def kind(self) -> str:
        return f"{VENDOR}/gpu-{self.key}"

    @property
    def spec_path(self) -> Path:
        return self.spec_dir / f"{SPEC_PREFIX}{self.key}.json"

    @property
    def dev_dir(self) -> Path:
        return self.host_dir / "dev"


def sim_cdi(host_dir: Path, spec_dir: Path | None = None, environ: dict[str, str] | None = None) -> SimCdi:
    """Where a simulated host at `host_dir` keeps its nodes and spec (see the module's notes)."""
    env = os.environ if environ is None else environ
    if spec_dir is None:
        chosen = env.get(ENV_CDI_DIR)
        spec_dir = Path(chosen) if chosen else RUN_CDI_DIR if os.geteuid() == 0 else host_dir / "cdi"
    return SimCdi(host_dir=host_dir, spec_dir=spec_dir)


def mig_name(gpu_uuid: str, start: int) -> str:
    return f"{gpu_uuid}-mig{start}"


def device_name(cdi: SimCdi, system: SimSystem, uuid: str) -> str:
    """A GPU or MIG UUID of `system` → its fully-qualified CDI name, or LookupError."""
    located = system.locate_uuid(uuid)
    if located is None:
        raise LookupError(f"no GPU or MIG device {uuid} on this simulated host")
    index, gi_id, _ci_id = located
    gpu = system.gpus[index]
    if gi_id is None:
        return qualified_name(cdi.kind, gpu.uuid)
    return qualified_name(cdi.kind, mig_name(gpu.uuid, gpu.gis[gi_id].start))


def _mig_starts(gpu: SimGpu) -> list[int]:
    return sorted({start for profile in gpu.sku.gi_profiles for start in profile.starts})


def _node(cdi: SimCdi, relative: str) -> dict[str, str]:
    return {"path": f"/dev/{relative}", "hostPath": str(cdi.dev_dir / relative)}


def spec_document(cdi: SimCdi, system: SimSystem) -> dict[str, Any]:
    """The CDI spec of `system`'s GPUs and every MIG slot they have (nvidia-ctk's shape)."""
    devices: list[dict[str, Any]] = []
    for gpu in system.gpus:
        parent = _node(cdi, f"nvidia{gpu.index}")
        devices.append({"name": gpu.uuid, "containerEdits": {"deviceNodes": [parent]}})
        for start in _mig_starts(gpu):
            cap = _node(cdi, f"nvidia-caps/nvidia{gpu.index}-mig{start}")
            devices.append(
                {"name": mig_name(gpu.uuid, start), "containerEdits": {"deviceNodes": [parent, cap]}}
            )
    common = [_node(cdi, "nvidiactl"), _node(cdi, "nvidia-uvm")]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi.kind,
        "devices": devices,
        "containerEdits": {"deviceNodes": common},
    }


def _make_node(path: Path) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*NULL_DEVICE))
    else:
        path.touch()
    path.chmod(0o666)  # the umask took some: every task may open the nodes it was given


def _prune_stale(spec_dir: Path) -> None:
    """Remove specs of simulated hosts whose directory is gone (their agent never closed)."""
    for path in spec_dir.glob(f"{SPEC_PREFIX}*.json"):
        try:
            host = json.loads(path.read_text())["containerEdits"]["deviceNodes"][0]["hostPath"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue  # not ours to judge
        if not Path(host).parent.exists():
            path.unlink(missing_ok=True)


def write_spec(cdi: SimCdi, system: SimSystem) -> Path:
    """Create the device nodes and (atomically) the spec file; idempotent."""
    document = spec_document(cdi, system)
    for edits in [document["containerEdits"], *(d["containerEdits"] for d in document["devices"])]:
        for node in edits["deviceNodes"]:
            _make_node(Path(node["hostPath"]))
    cdi.spec_dir.mkdir(parents=True, exist_ok=True)
    _prune_stale(cdi.spec_dir)
    # A name without .json while partial: podman and agents.isolation.cdi read only finished files.
    tmp = cdi.spec_dir / f".{cdi.spec_path.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(document, indent=1))
    tmp.chmod(0o644)
    os.replace(tmp, cdi.spec_path)
    return cdi.spec_path


def remove_spec(cdi: SimCdi) -> None:
    cdi.spec_path.unlink(missing_ok=True)
