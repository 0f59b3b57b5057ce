"""The sandbox plan: what the launcher does around one run's command (docs/isolation.md).

The agent decides (which uid, which cgroup and limits, which GPU device nodes to hide, which container
to clean up); the launcher obeys. The plan travels as a JSON file beside the run's exit file, in the
run's directory under the agent's state directory (owner-only: a task never reads it). The launcher
reads it with `json` alone and knows its keys by name (`agents/launch.py` imports as little as it can),
so this module is the one place that names them.

Keys (every one present; `to_json` writes them all):
- `runtime`: "process" (the launcher forks the command itself, in the sandbox below) or "container"
  (the command is the container engine's `run …` argv; the engine does the sandbox, see
  `agents.isolation.podman`).
- `cgroup`: the run's cgroup, relative to each controller's root ("" = none: an agent that is not root
  cannot make one). The launcher makes it, writes the limits, puts the command in it (process), or hands
  it to the engine as the container's parent (container), and removes it when the run has ended.
- `cpu_milli`, `host_mem_mib`, `pids_max`: the limits (null = none).
- `uid`, `gid`: process runs: the unprivileged ids the command takes (null = stay the launcher's own:
  an agent that is not root, on a host its operator declared single-tenant).
- `private_tmp`: process runs: a fresh /tmp of the run's own (a mount namespace; needs root).
- `expose`: host paths kept reachable at the same path although the private /tmp covers them (the run's
  working directory, a simulated GPU's process directory, an MPS pipe directory under /tmp).
- `mask`: device nodes of GPUs that are not the run's: made unopenable in the run's mount namespace.
- `container`: container runs: the container's name; `engine`: the engine's argv prefix (for `rm`).
- `lease_file`: a file holding the wall-clock time (seconds) until which the run may go on; the agent
  moves it forward after each heartbeat the plane acknowledged. Past it the launcher stops the run
  (the fence: docs/isolation.md, "No run outlives its fence"). "" = no fence.
- `stop_grace_s`: SIGTERM → SIGKILL grace when the launcher itself stops the run (the fence).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PLAN_FILE = "sandbox.json"


@dataclass(frozen=True)
class SandboxPlan:
    runtime: str = "process"
    cgroup: str = ""
    cpu_milli: int | None = None
    host_mem_mib: int | None = None
    pids_max: int | None = None
    uid: int | None = None
    gid: int | None = None
    private_tmp: bool = False
    expose: tuple[str, ...] = ()
    mask: tuple[str, ...] = ()
    container: str = ""
    engine: tuple[str, ...] = ()
    lease_file: str = ""
    stop_grace_s: float = 10.0

    def to_json(self) -> str:
        data = asdict(self)
        data["expose"], data["mask"], data["engine"] = list(self.expose), list(self.mask), list(self.engine)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SandboxPlan:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("expose", "mask", "engine"):
            known[name] = tuple(known.get(name) or ())
        return cls(**known)

    def write(self, task_dir: Path) -> Path:
        """The plan as `task_dir/sandbox.json`, owner-only."""
        path = task_dir / PLAN_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.to_json())
        os.replace(tmp, path)
        return path
