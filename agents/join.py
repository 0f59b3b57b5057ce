"""A host makes itself a node (`whalegen agent join`): describe the host as NVML sees it, trade the join
token for the node's own credential, and keep that credential in the state directory, owner-only.

The credential file is what `whalegen agent` reads when it is given no token, and what makes joining
again a no-op: a host that holds one does not spend another join token (docs/agent.md, "Joining").
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.backend import GpuBackend
from agents.client import PlaneClient
from agents.state import write_json_atomic
from whalegen import __version__
from whalegen.protocol import Join, Joined

CREDENTIAL_FILE = "node-credential.json"


@dataclass(frozen=True)
class NodeCredential:
    """What the plane answered the join with, and where from: enough for the agent to start alone."""

    credential: str
    server: str
    node_id: str
    node_name: str
    cluster: str
    pool: str
    joined_at_s: float
    pending_approval: bool = False

    def describe(self) -> str:
        where = f"{self.cluster}/{self.node_name}"
        return f"node {where} (id {self.node_id}) in pool {self.pool} at {self.server}"


def credential_path(state_dir: Path) -> Path:
    return state_dir / CREDENTIAL_FILE


def credential_load(state_dir: Path) -> NodeCredential | None:
    """The credential this host joined with, or None when it has not joined (or the file is unusable:
    then joining again is the way back, and the file is left for the operator to look at)."""
    try:
        data: Any = json.loads(credential_path(state_dir).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("credential"), str) or not data["credential"]:
        return None
    fields = {name: data.get(name) for name in NodeCredential.__dataclass_fields__}
    try:
        return NodeCredential(**fields)  # type: ignore[arg-type]
    except TypeError:
        return None


def credential_save(state_dir: Path, credential: NodeCredential) -> Path:
    """Owner-only, as everything the agent keeps (agents.state): mode 0600 in a directory tasks may pass
    through but not list (0711, what the agent makes it at start). Written atomically, so a crash leaves
    the old file or the new one, never half of one."""
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o711)
    path = credential_path(state_dir)
    write_json_atomic(path, credential.__dict__)
    return path


def host_cpu_milli() -> int:
    """The CPUs this process may use (its affinity: a container's or a cgroup's cpuset), in milli."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    return count * 1000


def host_mem_mib() -> int:
    """MemTotal from /proc/meminfo (Linux), else physical pages × page size."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


def join_message(*, backend: GpuBackend, join_token: str, pool: str, node_name: str) -> Join:
    """The host as it is: GPUs, MIG state and instances from the backend (what `whalegen agent inspect`
    reads), CPUs and memory from the kernel."""
    return Join(
        join_token=join_token,
        pool=pool,
        node_name=node_name,
        hostname=socket.gethostname(),
        agent_version=__version__,
        cpu_milli=host_cpu_milli(),
        mem_mib=host_mem_mib(),
        driver_version=backend.driver_version(),
        inventory=tuple(backend.inventory()),
    )


def join(
    *,
    server: str,
    backend: GpuBackend,
    join_token: str,
    pool: str,
    node_name: str,
    state_dir: Path,
    timeout_s: float = 30.0,
) -> NodeCredential:
    """Join and keep the credential. Raises `PlaneUnavailable` (try again later) or `PlaneRejected` (the
    plane said no, with its reason in `.detail`); the backend must be open."""
    message = join_message(backend=backend, join_token=join_token, pool=pool, node_name=node_name)
    client = PlaneClient(server, None, timeout_s=timeout_s)
    try:
        joined: Joined = client.join(message)
    finally:
        client.close()
    credential = NodeCredential(
        credential=joined.credential,
        server=server,
        node_id=joined.node_id,
        node_name=joined.node_name,
        cluster=joined.cluster,
        pool=joined.pool,
        joined_at_s=time.time(),
        pending_approval=joined.pending_approval,
    )
    credential_save(state_dir, credential)
    return credential
