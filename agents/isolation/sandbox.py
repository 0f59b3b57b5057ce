"""The process runtime's sandbox: what the launcher's forked child does to itself before it execs the command.

Used by the launcher (`agents/launch.py`), so it imports only `os` and `ctypes` (Python 3.11 has no
`os.unshare` or `mount`). Every step runs in the child, as root, in this order (`enter`):

1. Join the run's cgroup (the limits apply from the first instruction of the command on).
2. A mount namespace of its own (when /tmp is private or devices are masked), with every mount made a
   slave of the host's: nothing mounted here reaches the host, the host's new mounts still reach here.
3. Private /tmp: open every `expose` path first (O_PATH: a handle that survives the covering), mount a
   fresh tmpfs (mode 1777) on /tmp, then re-create each exposed path that lay under /tmp (directories
   0755 on the way, an empty file for a file) and bind-mount the original back on it from
   /proc/self/fd/N. The parents on the way are the tmpfs's own, so an exposed directory under a
   root-only one (pytest's /tmp/pytest-of-root is 0700) is reachable by the task's uid.
4. Mask: bind-mount an empty root-owned mode-000 file over each other GPU's device node: opening it fails
   for any uid without CAP_DAC_OVERRIDE, and the task has no capabilities (step 6).
5. chdir to the working directory: after the mounts (it may be an exposed path), while still root (a run
   directory under a root-only path still works as the working directory).
6. Drop: no supplementary groups, the plan's gid then uid (all capabilities go with uid 0), an empty
   capability bounding set, and no new privileges (a setuid binary cannot give them back).

A step that fails raises SandboxError naming it; the launcher reports that as a launch error (exit 126).
"""

from __future__ import annotations

import ctypes
import os

from agents.isolation.cgroups import Cgroup

CLONE_NEWNS = 0x00020000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_LAST_POSSIBLE = 63  # the bounding set's drop stops at the first capability the kernel does not know
MASK_FILE = "masked-device"


class SandboxError(Exception):
    """A sandbox step failed; the message names the step and the error."""


_libc: ctypes.CDLL | None = None


def _c(name: str, *args: object) -> None:
    """Call a libc function that returns -1 and sets errno on failure."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _c(
        "mount",
        None if source is None else source.encode(),
        target.encode(),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        None if data is None else data.encode(),
    )


def _under_tmp(path: str) -> bool:
    return os.path.normpath(path).startswith("/tmp/")


def _step(name: str, error: OSError) -> SandboxError:
    why = error.strerror or str(error)
    return SandboxError(f"sandbox: cannot {name}: {why} (errno {error.errno})")


def enter(plan: dict[str, object], cgroup: Cgroup | None, *, cwd: str | None, sandbox_dir: str) -> None:
    """Steps 1–6 above in the calling (child) process; `sandbox_dir` is a root-only directory of the
    run's where the mask file is made."""
    # 1. cgroup
    if cgroup is not None:
        try:
            cgroup.join()
        except OSError as error:
            raise _step(f"join cgroup {cgroup.relative}", error) from None
    expose = [str(path) for path in _list(plan.get("expose"))]
    mask = [str(path) for path in _list(plan.get("mask"))]
    private_tmp = bool(plan.get("private_tmp"))
    # 2. mount namespace
    if private_tmp or mask:
        try:
            _c("unshare", ctypes.c_int(CLONE_NEWNS))
        except OSError as error:
            raise _step("make a mount namespace (unshare)", error) from None
        try:
            _mount(None, "/", None, MS_REC | MS_SLAVE)
        except OSError as error:
            raise _step("make / a slave of the host's mounts", error) from None
    # The mask file is made and held before /tmp is covered: the run's directory may lie under /tmp.
    blank = _mask_file(sandbox_dir) if mask else None
    # 3. private /tmp
    if private_tmp:
        _private_tmp([path for path in expose if _under_tmp(path)])
    # 4. mask
    if blank is not None:
        _mask(mask, blank)
    # 5. working directory
    if cwd is not None:
        os.chdir(cwd)  # its OSError is the launcher's "cannot change to working directory" message
    # 6. drop privileges
    uid, gid = plan.get("uid"), plan.get("gid")
    if uid is not None:
        try:
            os.setgroups([])
            os.setgid(int(str(gid if gid is not None else uid)))
        except OSError as error:
            raise _step(f"take gid {gid}", error) from None
        try:
            for cap in range(CAP_LAST_POSSIBLE + 1):
                _c("prctl", ctypes.c_int(PR_CAPBSET_DROP), ctypes.c_ulong(cap), 0, 0, 0)
        except OSError as error:
            if error.errno != 22:  # EINVAL: past the last capability this kernel knows
                raise _step("empty the capability bounding set", error) from None
        try:
            os.setuid(int(str(uid)))
        except OSError as error:
            raise _step(f"take uid {uid}", error) from None
    try:
        _c("prctl", ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), 0, 0, 0)
    except OSError as error:
        raise _step("set no_new_privs", error) from None


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _private_tmp(expose: list[str]) -> None:
    kept: list[tuple[str, int, bool]] = []
    for path in expose:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as error:
            raise _step(f"open exposed path {path}", error) from None
        kept.append((os.path.normpath(path), fd, os.path.isdir(f"/proc/self/fd/{fd}")))
    try:
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    except OSError as error:
        raise _step("mount a private /tmp", error) from None
    # Shallow paths first: an exposed directory inside another exposed one lands on the outer's mount.
    for path, fd, is_dir in sorted(kept, key=lambda item: item[0].count("/")):
        try:
            _make_path(os.path.dirname(path))
            if is_dir:
                os.makedirs(path, mode=0o755, exist_ok=True)
            elif not os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        except OSError as error:
            raise _step(f"expose {path} in the private /tmp", error) from None
        finally:
            os.close(fd)


def _make_path(directory: str) -> None:
    """mkdir -p with 0755 directories whatever the umask (the task's uid must be able to pass)."""
    if os.path.isdir(directory):
        return
    _make_path(os.path.dirname(directory))
    os.mkdir(directory)
    os.chmod(directory, 0o755)


def _mask_file(sandbox_dir: str) -> int:
    """An empty root-owned mode-000 file in the run's directory, held open (O_PATH) for the binds."""
    blank = os.path.join(sandbox_dir, MASK_FILE)
    try:
        fd = os.open(blank, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0)
        os.fchown(fd, 0, 0)
        os.fchmod(fd, 0)
        os.close(fd)
        return os.open(blank, os.O_PATH | os.O_CLOEXEC)
    except OSError as error:
        raise _step(f"make the mask file {blank}", error) from None


def _mask(paths: list[str], blank: int) -> None:
    for path in paths:
        if not os.path.lexists(path):
            continue  # a device that is gone needs no hiding
        try:
            _mount(f"/proc/self/fd/{blank}", path, None, MS_BIND)
        except OSError as error:
            raise _step(f"mask {path}", error) from None
    os.close(blank)
