"""The node operator's isolation settings and the agent's decisions from them, per run.

Pure: it reads no files and starts nothing. The agent asks `refusal` whether a run may start here at all
(every "no" a sentence), `task_env` for the run's whole environment (never the agent's own) and
`process_plan` for what the launcher does around a process run. docs/isolation.md has the threat model.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agents.isolation.plan import SandboxPlan
from whalegen.protocol import TaskRuntime, TaskSpec

# A run's PATH when its own `env` names none: the standard system directories, nothing of the agent's.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HostPolicy:
    """What this host allows, from the agent's configuration and who the agent runs as."""

    is_root: bool  # the agent can drop privileges, make cgroups and mount namespaces
    agent_uid: int
    single_tenant: bool = False  # the operator's word: one tenant at a time uses this host
    uid_min: int = 200_000  # the tenants' uids the plane may ask for (WHALEGEN_AGENT_UID_RANGE)
    uid_max: int = 299_999
    cgroup_root: str = "whalegen"  # the runs' cgroups go under this, in each controller
    private_tmp: bool = True  # process runs get a /tmp of their own (needs root)
    container_ready: str | None = None  # None: the container engine works here; else why it does not


def refusal(spec: TaskSpec, policy: HostPolicy, live_tenants: Iterable[str]) -> str | None:
    """Why this run must not start on this host, or None. A refused run ends `rejected` with the
    sentence; it never runs with less isolation than it was sent with."""
    if spec.runtime is TaskRuntime.CONTAINER:
        if not spec.image:
            return "container run without an image"
        if policy.container_ready is not None:
            return f"this host cannot run containers: {policy.container_ready}"
    if policy.is_root:
        uid, gid = spec.run_as_uid, spec.run_as_gid
        if uid is None or gid is None:
            return (
                "the plane named no uid for this run (a plane before protocol 1.4?): "
                "this host runs no task as root or as its agent's user"
            )
        for what, value in (("uid", uid), ("gid", gid)):
            if not policy.uid_min <= value <= policy.uid_max:
                return (
                    f"{what} {value} is outside this host's range for tenants' runs "
                    f"({policy.uid_min}-{policy.uid_max}, WHALEGEN_AGENT_UID_RANGE)"
                )
        return None
    # Not root: every run would be this agent's own user, with its credential in reach.
    if spec.runtime is TaskRuntime.CONTAINER:
        return "this agent is not root: it cannot run containers (rootful podman)"
    if not policy.single_tenant:
        return (
            f"this agent is not root (uid {policy.agent_uid}) and cannot start a run as its tenant's "
            "user; a host that only one tenant uses may say so with WHALEGEN_AGENT_SINGLE_TENANT=true"
        )
    others = sorted({t for t in live_tenants if t != spec.tenant})
    if others:
        return (
            f"single-tenant host (agent not root): tenant {others[0]!r} has runs here; "
            f"a run of tenant {spec.tenant!r} waits for another host"
        )
    return None


def task_env(
    spec: TaskSpec, *, backend_env: Mapping[str, str], device_env: Mapping[str, str], home: str
) -> dict[str, str]:
    """A run's whole environment: a standard PATH, HOME, what the GPU backend needs its programs to have
    (the simulated NVML's process directory), the task's own `env`, then what the agent sets for its
    devices (CUDA_VISIBLE_DEVICES, the MPS pipe and limits), which the task's `env` cannot override."""
    env = {"PATH": DEFAULT_PATH, "HOME": home or "/", "LANG": "C.UTF-8"}
    env.update(backend_env)
    env.update(spec.env)
    env.update(device_env)
    return env


def run_name(node_name: str, plane: str, task_id: str, attempt: int) -> str:
    """A name for a run's cgroup (and container) unique on this host: two agents of two planes may both
    call a node `gpu-01` and both run task 7."""
    digest = hashlib.sha256(f"{plane}|{node_name}|{task_id}|{attempt}".encode()).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{node_name}-{task_id}-{attempt}")[:80]
    return f"{safe}-{digest}"


def run_prefix(node_name: str) -> str:
    """What every run name (`run_name`) of this node begins with."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{node_name}-")


def process_plan(
    spec: TaskSpec,
    policy: HostPolicy,
    *,
    name: str,
    expose: Iterable[str],
    mask: Iterable[str],
    lease_file: str,
) -> SandboxPlan:
    """The launcher's work around a process run: as root, the tenant's uid in a cgroup with the run's
    limits, its own /tmp, the other GPUs' device nodes masked; not root, only the fence."""
    if not policy.is_root:
        return SandboxPlan(runtime="process", lease_file=lease_file, stop_grace_s=spec.stop_grace_s)
    return SandboxPlan(
        runtime="process",
        cgroup=f"{policy.cgroup_root}/{name}",
        # 0 asks for no share at all, which no program survives: the plane's "no limit".
        cpu_milli=spec.cpu_milli or None,
        host_mem_mib=spec.host_mem_mib or None,
        pids_max=spec.pids_max or None,
        uid=spec.run_as_uid,
        gid=spec.run_as_gid,
        private_tmp=policy.private_tmp,
        expose=tuple(dict.fromkeys(expose)),
        mask=tuple(dict.fromkeys(mask)),
        lease_file=lease_file,
        stop_grace_s=spec.stop_grace_s,
    )


def parse_uid_range(text: str) -> tuple[int, int]:
    """`200000-299999` → (200000, 299999); the low end at least 1000 (system accounts stay out)."""
    low, sep, high = text.strip().partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"a uid range reads LOW-HIGH, e.g. 200000-299999 (got {text!r})")
    lo, hi = int(low), int(high)
    if lo < 1000 or hi < lo:
        raise ValueError(f"uid range {text!r}: the low end must be at least 1000 and not above the high")
    return lo, hi
