"""One run's cgroup: made with its limits before the command starts, emptied and removed after it ends.

Used by the launcher (`agents/launch.py`), so it imports only `os`: the launcher starts with every task.

Hierarchies. Each controller we limit (cpu, memory, pids) is found in /proc/self/mountinfo, not assumed at
/sys/fs/cgroup/<name>: a v1 mount (fstype `cgroup`) whose super options name the controller, else the
cgroup v2 mount (fstype `cgroup2`) whose `cgroup.controllers` lists it. A hybrid host (v1 controllers, an
empty v2 tree at /sys/fs/cgroup/unified) thus gets v1 for all three; a unified host one v2 directory.

The run's cgroup is a path relative to each hierarchy's root (`whalegen/<run>`), the same path the
container engine gets as `--cgroup-parent /<path>`, so a container's own cgroup is made under ours and
our limits and counters cover it.

Killed for memory. On the hosts seen (kernel 6.18, hybrid v1, no systemd) the v1 `memory.oom_control`
`oom_kill` counter stays 0 after a kill inside the cgroup, while `memory.failcnt` counts each time usage
hit the limit of a process directly in it. For a container, whose processes are in the engine's child
cgroup, even failcnt stays 0 (seen with podman 4.3 and runc); the peak, `memory.max_usage_in_bytes`,
reaches the limit. So a run counts as killed for memory when its command died of a SIGKILL the launcher
did not send and any of: v2 `memory.events` oom_kill > 0; v1 oom_kill > 0, a failcnt > 0 (memory or
memory+swap), or a peak within one charge batch of the limit. (failcnt and the peak also count reclaims
that succeeded; with the SIGKILL they are the best evidence v1 gives here.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

CONTROLLERS = ("cpu", "memory", "pids")
CFS_PERIOD_US = 100_000
# The kernel charges memory to a cgroup in batches of 64 pages: a peak within one batch of the limit is a
# run that reached it (the charge that did not fit failed).
CHARGE_BATCH_BYTES = 64 * 4096
MOUNTINFO = "/proc/self/mountinfo"


class CgroupError(Exception):
    """The cgroup could not be made or limited; the message says which file and why."""


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes (\040 …).
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_mounts(mountinfo: str = MOUNTINFO) -> list[tuple[str, str, list[str]]]:
    """Every cgroup mount: (fstype `cgroup` or `cgroup2`, mount point, super options)."""
    found = []
    with open(mountinfo) as lines:
        for line in lines:
            # `id parent major:minor root mount-point options [optional…] - fstype source super-options`
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((tail[0], _unescape(fields[4]), tail[2].split(",")))
    return found


def hierarchies(mountinfo: str = MOUNTINFO) -> dict[str, tuple[int, str]]:
    """Where each of cpu, memory and pids is mounted: controller → (cgroup version, mount point).
    A controller mounted nowhere is absent."""
    v1: dict[str, str] = {}
    v2: list[str] = []
    for fstype, mount_point, options in cgroup_mounts(mountinfo):
        if fstype == "cgroup":
            for option in options:
                if option in CONTROLLERS:
                    v1.setdefault(option, mount_point)
        else:
            v2.append(mount_point)
    found = {name: (1, path) for name, path in v1.items()}
    for mount_point in v2:
        try:
            with open(os.path.join(mount_point, "cgroup.controllers")) as listed:
                available = listed.read().split()
        except OSError:
            continue
        for name in CONTROLLERS:
            if name in available:
                found.setdefault(name, (2, mount_point))
    return found


class Cgroup:
    """A run's cgroup in every hierarchy that holds one of our controllers. (A plain class: the launcher
    avoids `dataclasses`.)"""

    def __init__(self, relative: str, mounts: dict[str, tuple[int, str]] | None = None) -> None:
        relative = relative.strip("/")
        if not relative or ".." in relative.split("/"):
            raise CgroupError(f"cgroup path {relative!r} must be relative and below the root")
        self.relative = relative
        self.mounts = hierarchies() if mounts is None else mounts
        missing = [name for name in CONTROLLERS if name not in self.mounts]
        if missing:
            raise CgroupError(f"no cgroup hierarchy holds the {', '.join(missing)} controller")
        # controller → the run's directory in its hierarchy (v2: one directory for all three)
        self.dirs = {name: os.path.join(self.mounts[name][1], relative) for name in CONTROLLERS}

    def version(self, controller: str) -> int:
        return self.mounts[controller][0]

    def unique_dirs(self) -> list[str]:
        return sorted(set(self.dirs.values()))

    # ---- make --------------------------------------------------------------------------------------
    def create(self, *, cpu_milli: int | None, host_mem_mib: int | None, pids_max: int | None) -> None:
        """Make the directories and write the limits; CgroupError names the file that refused."""
        for mount_version, mount_point in set(self.mounts.values()):
            if mount_version == 2:
                self._enable_v2_controllers(mount_point)
        for path in self.unique_dirs():
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as error:
                raise CgroupError(
                    f"cannot make cgroup {path}: {error.strerror} (errno {error.errno})"
                ) from None
        if cpu_milli is not None:
            # 1000 milli-CPUs = one CPU = the whole period; at least 1 ms per period (the kernel's floor).
            quota = max(cpu_milli * CFS_PERIOD_US // 1000, 1000)
            if self.version("cpu") == 1:
                self._write("cpu", "cpu.cfs_period_us", str(CFS_PERIOD_US))
                self._write("cpu", "cpu.cfs_quota_us", str(quota))
            else:
                self._write("cpu", "cpu.max", f"{quota} {CFS_PERIOD_US}")
        if host_mem_mib is not None:
            limit = str(host_mem_mib << 20)
            if self.version("memory") == 1:
                self._write("memory", "memory.limit_in_bytes", limit)
                # Memory plus swap at the same figure: swap cannot extend the limit (the file exists only
                # when the kernel accounts swap).
                if os.path.exists(os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")):
                    self._write("memory", "memory.memsw.limit_in_bytes", limit)
            else:
                self._write("memory", "memory.max", limit)
                if os.path.exists(os.path.join(self.dirs["memory"], "memory.swap.max")):
                    self._write("memory", "memory.swap.max", "0")
        if pids_max is not None:
            self._write("pids", "pids.max", str(pids_max))

    def _enable_v2_controllers(self, mount_point: str) -> None:
        """v2 limits a child only for controllers its parent enabled in `cgroup.subtree_control`: enable
        ours at the root and at every level above the run's directory."""
        wanted = [name for name in CONTROLLERS if self.mounts[name] == (2, mount_point)]
        parts = self.relative.split("/")
        for depth in range(len(parts)):
            level = os.path.join(mount_point, *parts[:depth])
            os.makedirs(level, exist_ok=True)
            control = os.path.join(level, "cgroup.subtree_control")
            try:
                with open(control, "w") as out:
                    out.write(" ".join(f"+{name}" for name in wanted))
            except OSError as error:
                raise CgroupError(
                    f"cannot enable {', '.join(wanted)} in {control}: {error.strerror} (errno {error.errno})"
                ) from None

    def _write(self, controller: str, name: str, value: str) -> None:
        path = os.path.join(self.dirs[controller], name)
        try:
            with open(path, "w") as out:
                out.write(value)
        except OSError as error:
            raise CgroupError(
                f"cannot write {value} to {path}: {error.strerror} (errno {error.errno})"
            ) from None

    # ---- join and watch ----------------------------------------------------------------------------
    def join(self, pid: int = 0) -> None:
        """Move `pid` (0: the caller) into the run's cgroup in every hierarchy."""
        for path in self.unique_dirs():
            with open(os.path.join(path, "cgroup.procs"), "w") as out:
                out.write(str(pid or os.getpid()))

    def pids(self) -> set[int]:
        """Every process in the run's cgroup or below it (a container's cgroup is a child of ours)."""
        found: set[int] = set()
        for top in self.unique_dirs():
            for directory, _, _ in os.walk(top):
                try:
                    with open(os.path.join(directory, "cgroup.procs")) as procs:
                        found.update(int(pid) for pid in procs.read().split())
                except OSError:
                    continue
        return found

    def signal_all(self, signum: int) -> int:
        """Send `signum` to every process in the cgroup; returns how many there were."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return len(pids)

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL everything in the cgroup until it is empty (a fork racing the first sweep is caught by
        the next); True once empty."""
        deadline = time.monotonic() + timeout_s
        while self.signal_all(signal.SIGKILL):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def memory_killed(self) -> bool:
        """Whether the memory controller reports a kill or a hit of the limit (see the module's note)."""
        directory = self.dirs["memory"]
        if self.version("memory") == 2:
            return _counter(os.path.join(directory, "memory.events"), "oom_kill") > 0
        if _counter(os.path.join(directory, "memory.oom_control"), "oom_kill") > 0:
            return True
        for prefix in ("memory.", "memory.memsw."):
            if _number(os.path.join(directory, f"{prefix}failcnt")) > 0:
                return True
            limit = _number(os.path.join(directory, f"{prefix}limit_in_bytes"))
            peak = _number(os.path.join(directory, f"{prefix}max_usage_in_bytes"))
            if 0 < limit - CHARGE_BATCH_BYTES <= peak:
                return True
        return False

    # ---- remove ------------------------------------------------------------------------------------
    def remove(self, timeout_s: float = 2.0) -> bool:
        """rmdir the run's directories, deepest first, retried briefly while the last processes exit. True
        when all are gone; a busy one is left. Also the same path in every other cgroup hierarchy: a
        container engine given our path as the parent makes it (and its `conmon` child) in all of them."""
        try:
            tops = sorted({os.path.join(mount_point, self.relative) for _, mount_point, _ in cgroup_mounts()})
        except OSError:
            tops = self.unique_dirs()
        deadline = time.monotonic() + timeout_s
        while True:
            left = False
            for top in tops:
                if not os.path.isdir(top):
                    continue
                for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
                    try:
                        os.rmdir(directory)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        left = True
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.05)


def prune_stale(root: str, prefix: str, *, older_than_s: float, now_s: float) -> int:
    """Remove the run cgroups under `root` named `prefix…` that are older than `older_than_s` and hold no
    process: what launchers killed outright (SIGKILL to their group, a test's or a demo's clean-up) could
    not remove. The kernel refuses to remove a cgroup that holds a process, and the age keeps a launcher
    that has just made its cgroup (and not yet moved its command in) out of reach. Returns how many runs'
    cgroups went."""
    removed = 0
    try:
        tops = sorted({os.path.join(point, root.strip("/")) for _, point, _ in cgroup_mounts()})
    except OSError:
        return 0
    names: set[str] = set()
    for top in tops:
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    ours = entry.is_dir(follow_symlinks=False) and entry.name.startswith(prefix)
                    if ours and now_s - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
                        names.add(entry.name)
        except OSError:
            continue
    for name in sorted(names):
        try:
            cgroup = Cgroup(f"{root.strip('/')}/{name}")
        except CgroupError:
            return removed
        if not cgroup.pids() and cgroup.remove(timeout_s=0.0):
            removed += 1
    return removed


def _number(path: str) -> int:
    try:
        with open(path) as source:
            return int(source.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _counter(path: str, key: str) -> int:
    """A `key value` line of a flat-keyed cgroup file (memory.events, memory.oom_control); 0 if absent."""
    try:
        with open(path) as lines:
            for line in lines:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value.strip() or 0)
    except (OSError, ValueError):
        pass
    return 0
