"""The container engine adapter: podman's argv for one run, and whether the engine is usable here.

Everything but `engine_available` and `image_present` is a pure function of a frozen `EngineConfig`
and the run's data; the launcher executes the argv (`SandboxPlan.runtime == "container"`).

Choices, and why:
- Rootful podman (the agent is root on GPU hosts), `--runtime runc`: crun refuses hybrid cgroups v1
  hosts; `--cgroup-manager cgroupfs`: no systemd on many hosts; `--storage-driver vfs`: works on every
  filesystem (overlay needs kernel support the hosts we saw lacked). All one string an operator can
  replace (`WHALEGEN_AGENT_PODMAN_OPTIONS`).
- Network `bridge` by default: a network namespace of the task's own with outbound NAT, so a training
  task reaches its data and registries but not the host's loopback services or its abstract unix
  sockets (those belong to the host's network namespace). `host` is the operator's choice for
  multi-node NCCL over the host's fabric; tests use `none`.
- `--ulimit nofile=…` and `--ulimit nproc=…` always explicit: podman's defaults are above what the
  agent itself has on hosts like ours, and runc is refused raising a limit ("error setting rlimit …
  operation not permitted"). They are the agent's own soft limit (never above), nproc also at most
  `kernel.pid_max` (more processes cannot exist; values above it were refused there too).
- `--init` (podman's catatonit, a Recommends of Debian's podman; scripts/test installs it): PID 1 that
  reaps zombies and forwards SIGTERM, so a task's dataloader workers do not linger and `podman stop`
  reaches the program instead of a shell that ignores it.
- `--env-file`, never `--env KEY=VALUE`: argv is world-readable in /proc/<pid>/cmdline.
- `--log-driver none`: the run's output goes to the attached stdout/stderr the launcher captures, and is
  not also copied into the engine's storage.
- `--user UID:GID`, `--security-opt no-new-privileges`, `--cap-drop all`: no tenant is root, gains
  privileges by exec, or keeps a capability (issue 37, item 3).
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BINARY = "podman"
DEFAULT_GLOBAL_OPTIONS = ("--runtime", "runc", "--cgroup-manager", "cgroupfs", "--storage-driver", "vfs")
DEFAULT_NETWORK = "bridge"
PULL_POLICIES = ("always", "missing", "never", "newer")
# Where Debian's catatonit and podman's own packaging put the init podman's --init runs.
INIT_BINARIES = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")
# RLIMIT_* of RLIM_INFINITY still needs a number on podman's command line: the kernel's default
# fs.nr_open, the most open files a process can have unless an operator raised it.
UNLIMITED_NOFILE = 1 << 20
PID_MAX_PATH = Path("/proc/sys/kernel/pid_max")
ENV_OPTIONS = "WHALEGEN_AGENT_PODMAN_OPTIONS"
ENV_BINARY = "WHALEGEN_AGENT_PODMAN"
ENV_NETWORK = "WHALEGEN_AGENT_CONTAINER_NETWORK"
ENV_INIT = "WHALEGEN_AGENT_CONTAINER_INIT"
ENGINE_TIMEOUT_S = 60.0

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class EngineConfig:
    binary: str = DEFAULT_BINARY
    global_options: tuple[str, ...] = DEFAULT_GLOBAL_OPTIONS
    network: str = DEFAULT_NETWORK
    nofile: int = 1024  # --ulimit nofile=N:N
    nproc: int = 1024  # --ulimit nproc=N:N
    init: bool = True  # --init (catatonit as the container's PID 1)

    @property
    def prefix(self) -> tuple[str, ...]:
        """The engine's argv prefix (what `SandboxPlan.engine` holds for the launcher's `rm`)."""
        return (self.binary, *self.global_options)


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    read_only: bool = True


def _soft_limit(which: int, cap: int) -> int:
    soft, _hard = resource.getrlimit(which)
    return cap if soft == resource.RLIM_INFINITY else min(soft, cap)


def _pid_max() -> int:
    try:
        return int(PID_MAX_PATH.read_text())
    except (OSError, ValueError):
        return 32768  # the kernel's default pid_max


def _env_flag(value: str) -> bool:
    return value.strip().lower() not in {"0", "false", "no", "off"}


def engine_config_from_env(environ: Mapping[str, str]) -> EngineConfig:
    """The agent's engine settings: `WHALEGEN_AGENT_PODMAN` (binary), `WHALEGEN_AGENT_PODMAN_OPTIONS`
    (global options, one shell-quoted string), `WHALEGEN_AGENT_CONTAINER_NETWORK` (bridge | host |
    none | a podman network name), `WHALEGEN_AGENT_CONTAINER_INIT` (0 to run without --init); the
    ulimits from the agent's own soft limits at the time of the call."""
    options = environ.get(ENV_OPTIONS)
    return EngineConfig(
        binary=environ.get(ENV_BINARY) or DEFAULT_BINARY,
        global_options=DEFAULT_GLOBAL_OPTIONS if options is None else tuple(shlex.split(options)),
        network=environ.get(ENV_NETWORK) or DEFAULT_NETWORK,
        nofile=_soft_limit(resource.RLIMIT_NOFILE, UNLIMITED_NOFILE),
        nproc=_soft_limit(resource.RLIMIT_NPROC, _pid_max()),
        init=_env_flag(environ.get(ENV_INIT, "1")),
    )


def container_name(node: str, task_id: str, attempt: int, plane: str) -> str:
    """`whalegen-<task>-a<attempt>-<hash>`: readable in `podman ps`, and unique per plane, node, task
    and attempt, so two agents on one host (two planes, or two simulated nodes) never collide."""
    key = _NAME_UNSAFE.sub("-", f"{task_id}-a{attempt}").strip("-.")[:40]
    digest = hashlib.sha256(f"{plane}\0{node}\0{task_id}\0{attempt}".encode()).hexdigest()[:10]
    return f"whalegen-{key}-{digest}"


def env_file_text(env: Mapping[str, str]) -> str:
    """The `--env-file` content for `env`, or ValueError. podman reads one KEY=VALUE a line, and takes a
    line without `=` (or a key ending in `*`) from *its own* environment: the agent's. So every key must
    be a plain name and no value may hold a newline (it would start such a line)."""
    lines = []
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise ValueError(f"environment key {key!r} is not a name ([A-Za-z_][A-Za-z0-9_]*)")
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(
                f"environment value of {key} holds a line break or NUL (an env file cannot carry it)"
            )
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def _mount_arg(mount: Mount) -> str:
    for path in (mount.host, mount.container):
        if not path.startswith("/") or ":" in path or "," in path:
            raise ValueError(f"mount path {path!r} must be absolute and hold no ':' or ','")
    return f"{mount.host}:{mount.container}:{'ro' if mount.read_only else 'rw'}"


def run_argv(
    config: EngineConfig,
    *,
    name: str,
    image: str,
    command: Sequence[str],
    uid: int,
    gid: int,
    env_file: str,
    cdi_devices: Sequence[str] = (),
    mounts: Sequence[Mount] = (),
    workdir: str = "",
    cgroup_parent: str = "",
    pull_policy: str = "missing",
    pids_max: int | None = None,
) -> list[str]:
    """`podman … run` for one run, in the foreground (the launcher waits on it; output attached).

    `cgroup_parent`: the run's cgroup relative to each controller's root (the plan's `cgroup`); the
    container's own cgroup goes under it, so the limits the launcher wrote there hold. `cdi_devices`:
    fully-qualified CDI names (`GpuBackend.cdi_device`). Refuses root (uid or gid 0), an unknown pull
    policy, an empty command, a mount path podman's -v cannot carry."""
    if uid <= 0 or gid <= 0:
        raise ValueError(f"a task never runs as root in its container (uid {uid}, gid {gid})")
    if pull_policy not in PULL_POLICIES:
        raise ValueError(f"pull policy {pull_policy!r} is not one of {', '.join(PULL_POLICIES)}")
    if not command:
        raise ValueError("a container run needs a command")
    if not image or image.startswith("-"):
        raise ValueError(f"image {image!r} is not an image reference")
    argv = [*config.prefix, "run", "--rm", "--name", name]
    if cgroup_parent:
        argv += ["--cgroup-parent", "/" + cgroup_parent.strip("/")]
    argv += [
        "--user",
        f"{uid}:{gid}",
        "--security-opt",
        "no-new-privileges",
        "--cap-drop",
        "all",
        "--network",
        config.network,
        "--log-driver",
        "none",
        "--env-file",
        env_file,
        "--pull",
        pull_policy,
        "--ulimit",
        f"nofile={config.nofile}:{config.nofile}",
        "--ulimit",
        f"nproc={config.nproc}:{config.nproc}",
    ]
    if pids_max is not None:
        argv += ["--pids-limit", str(pids_max)]
    if config.init:
        argv.append("--init")
    for device in cdi_devices:
        argv += ["--device", device]
    for mount in mounts:
        argv += ["-v", _mount_arg(mount)]
    if workdir:
        argv += ["--workdir", workdir]
    # Everything after the image is the task's own argv, never read as podman options.
    return [*argv, image, *command]


def stop_argv(config: EngineConfig, name: str, *, grace_s: float = 10.0) -> list[str]:
    """SIGTERM to the container's PID 1, SIGKILL after `grace_s`; no error when it is already gone."""
    return [*config.prefix, "stop", "--ignore", "--time", str(max(0, round(grace_s))), name]


def rm_argv(config: EngineConfig, name: str) -> list[str]:
    """Remove the container, killing it at once when it still runs; no error when it is already gone."""
    return [*config.prefix, "rm", "--force", "--ignore", "--time", "0", name]


def _run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)


def engine_available(config: EngineConfig, *, timeout_s: float = ENGINE_TIMEOUT_S) -> str | None:
    """None when containers can run here; else the reason in words (for the agent's start-up line)."""
    if shutil.which(config.binary) is None:
        return f"{config.binary} is not installed (Debian: apt-get install podman runc catatonit)"
    if os.geteuid() != 0:
        return "the agent is not root: WhaleGen runs rootful podman (tasks take unprivileged uids)"
    has_init = any(Path(path).exists() for path in INIT_BINARIES) or shutil.which("catatonit")
    if config.init and not has_init:
        return f"podman's --init needs catatonit (apt-get install catatonit), or set {ENV_INIT}=0"
    try:
        done = _run([*config.prefix, "info", "--format", "{{.Host.OCIRuntime.Name}}"], timeout_s)
    except subprocess.TimeoutExpired:
        return f"`{config.binary} info` did not answer within {timeout_s:.0f} s"
    except OSError as error:
        return f"{config.binary} cannot be run: {error.strerror}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"`{shlex.join([*config.prefix, 'info'])}` failed: {last}"
    return None


def image_present(config: EngineConfig, image: str, *, timeout_s: float = ENGINE_TIMEOUT_S) -> bool:
    """Whether `image` is in the engine's local storage (what pull policy `never` needs)."""
    return _run([*config.prefix, "image", "exists", image], timeout_s).returncode == 0
