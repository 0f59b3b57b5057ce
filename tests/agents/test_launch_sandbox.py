"""The launcher's sandbox (`--plan`): real processes, real cgroups, real mounts (issue #37).

These need root (cgroups, mount namespaces, setuid) and cpu, memory and pids cgroup controllers: CI runs
them as root on the same kind of host (hybrid cgroups v1, no systemd). Where a precondition is missing
the test says which instead of passing. The container test needs podman and the test image
`localhost/whalegen-test/busybox:1` that scripts/test builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents import capture
from agents.isolation.cgroups import Cgroup, CgroupError, cgroup_mounts, hierarchies
from agents.runner import LAUNCHER

TENANT_ID = 200001
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--storage-driver", "vfs"]
TEST_IMAGE = "localhost/whalegen-test/busybox:1"  # scripts/test-image builds it


def _missing_root_or_cgroups() -> str:
    if os.geteuid() != 0:
        return "the sandbox needs root (cgroups, mount namespaces, setuid): run the suite as root as CI does"
    found = hierarchies()
    missing = [name for name in ("cpu", "memory", "pids") if name not in found]
    if missing:
        return f"no cgroup hierarchy holds {', '.join(missing)}"
    return ""


needs_root = pytest.mark.skipif(bool(_missing_root_or_cgroups()), reason=_missing_root_or_cgroups() or "-")


def plan(**keys: Any) -> dict[str, Any]:
    """A sandbox plan with every key (as `SandboxPlan.to_json` writes it); nothing sandboxed by default."""
    base: dict[str, Any] = {
        "runtime": "process",
        "cgroup": "",
        "cpu_milli": None,
        "host_mem_mib": None,
        "pids_max": None,
        "uid": None,
        "gid": None,
        "private_tmp": False,
        "expose": [],
        "mask": [],
        "container": "",
        "engine": [],
        "lease_file": "",
        "stop_grace_s": 2.0,
    }
    return {**base, **keys}


@pytest.fixture
def cgroup_name() -> Iterator[str]:
    """A fresh run cgroup path; removed after the test even if the launcher failed to."""
    name = f"whalegen/test-{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(CgroupError):
        left = Cgroup(name)
        left.kill_all()
        left.remove()


class Run:
    """One launcher started as the agent starts it (its own session), with a plan."""

    def __init__(self, run_dir: Path, the_plan: dict[str, Any], command: list[str], cwd: str = "") -> None:
        self.dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "sandbox.json").write_text(json.dumps(the_plan))
        argv = [sys.executable, "-S", "-E", str(LAUNCHER), str(run_dir / "exit.json")]
        argv += ["--output", str(run_dir / "output"), "--cap-bytes", str(1 << 20)]
        argv += ["--plan", str(run_dir / "sandbox.json")]
        if cwd:
            argv += ["--cwd", cwd]
        env = {"PATH": os.environ["PATH"]}
        self.popen = subprocess.Popen([*argv, "--", *command], env=env, start_new_session=True)

    def wait(self, timeout_s: float = 30.0) -> dict[str, Any]:
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            raise
        exit_data: dict[str, Any] = json.loads((self.dir / "exit.json").read_text())
        return exit_data

    def lines(self, stream: str = "stdout") -> list[str]:
        return [line.text for line in capture.read_all(self.dir / "output") if line.stream == stream]

    def text(self) -> str:
        return "\n".join(f"{line.stream}: {line.text}" for line in capture.read_all(self.dir / "output"))


def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ---- cgroup discovery -------------------------------------------------------------------------------


def test_hierarchies_come_from_mountinfo_on_a_hybrid_and_on_a_unified_host(tmp_path: Path) -> None:
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /x/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    assert hierarchies(str(hybrid)) == {
        "cpu": (1, "/sys/fs/cgroup/cpu,cpuacct"),
        "memory": (1, "/x/memory"),
        "pids": (1, "/sys/fs/cgroup/pids"),
    }
    unified_root = tmp_path / "cg2"
    unified_root.mkdir()
    (unified_root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    unified = tmp_path / "unified"
    unified.write_text(f"30 23 0:26 / {unified_root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    assert hierarchies(str(unified)) == {name: (2, str(unified_root)) for name in ("cpu", "memory", "pids")}


def test_a_cgroup_that_cannot_be_made_says_which_and_why(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    mounts = {name: (1, str(tmp_path / "not-a-dir")) for name in ("cpu", "memory", "pids")}
    with pytest.raises(CgroupError, match=r"cannot make cgroup .*not-a-dir/whalegen/x: Not a directory"):
        Cgroup("whalegen/x", mounts).create(cpu_milli=None, host_mem_mib=None, pids_max=None)
    with pytest.raises(CgroupError, match="must be relative and below the root"):
        Cgroup("whalegen/../..", mounts)


# ---- the process sandbox ----------------------------------------------------------------------------


@needs_root
def test_the_command_runs_as_the_tenants_uid_with_no_capabilities_and_no_new_privileges(
    tmp_path: Path, cgroup_name: str
) -> None:
    run = Run(
        tmp_path / "run",
        plan(cgroup=cgroup_name, uid=TENANT_ID, gid=TENANT_ID),
        ["sh", "-c", "id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/self/status"],
    )
    assert run.wait()["exit_code"] == 0, run.text()
    out = run.lines()
    assert out[:3] == [str(TENANT_ID), str(TENANT_ID), str(TENANT_ID)]  # no supplementary groups (root's)
    status = dict(line.split(":\t") for line in out[3:])
    assert status == {"NoNewPrivs": "1", "CapEff": "0000000000000000", "CapBnd": "0000000000000000"}


@needs_root
def test_a_private_tmp_hides_the_hosts_tmp_and_keeps_the_exposed_paths(tmp_path: Path) -> None:
    # tmp_path is under /tmp/pytest-of-root (0700): unreachable by the tenant's uid on the host.
    secret = Path(f"/tmp/whalegen-host-{uuid.uuid4().hex[:8]}")
    secret.write_text("host only")
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, TENANT_ID, TENANT_ID)
    left = f"/tmp/from-task-{uuid.uuid4().hex[:8]}"
    script = f"cat {secret}; echo mine > {left} && echo wrote; ls -A /tmp; pwd; echo kept > {work}/out"
    try:
        run = Run(
            tmp_path / "run",
            plan(uid=TENANT_ID, gid=TENANT_ID, private_tmp=True, expose=[str(work)]),
            ["sh", "-c", script],
            cwd=str(work),
        )
        run.wait()
        assert "No such file or directory" in "\n".join(run.lines("stderr")), run.text()
        out = run.lines()
        assert out[0] == "wrote"  # the task's own /tmp is writable …
        # … holds only what the task wrote and the way to the exposed path, made for it (0755, not 0700)
        assert out[1:] == [Path(left).name, tmp_path.parts[2], str(work)]
        assert not Path(left).exists()  # … and is not the host's
        assert (work / "out").read_text() == "kept\n"  # the exposed directory is the host's
    finally:
        secret.unlink()


@needs_root
def test_a_masked_device_node_cannot_be_opened_but_an_unmasked_one_can(tmp_path: Path) -> None:
    devices = tmp_path / "dev"
    devices.mkdir(mode=0o755)
    for name in ("gpu-mine", "gpu-theirs"):
        os.mknod(devices / name, 0o666 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's
        os.chmod(devices / name, 0o666)
    run = Run(
        tmp_path / "run",
        plan(
            uid=TENANT_ID,
            gid=TENANT_ID,
            private_tmp=True,
            expose=[str(devices)],  # under pytest's root-only directory: reachable through the private /tmp
            mask=[str(devices / "gpu-theirs")],
        ),
        [
            "sh",
            "-c",
            f"echo x > {devices}/gpu-mine && echo mine-ok; echo x > {devices}/gpu-theirs && echo no",
        ],
    )
    run.wait()
    assert run.lines() == ["mine-ok"], run.text()
    assert "Permission denied" in run.lines("stderr")[0]
    assert os.stat(devices / "gpu-theirs").st_rdev == os.makedev(1, 3)  # the host's node is untouched


@needs_root
def test_a_sandbox_step_that_fails_is_a_launch_error_naming_it(tmp_path: Path) -> None:
    run = Run(
        tmp_path / "run",
        plan(private_tmp=True, expose=["/tmp/no-such-path-for-whalegen"]),
        ["true"],
    )
    ended = run.wait()
    assert ended["exit_code"] == 126
    assert ended["launch_error"].startswith(
        "sandbox: cannot open exposed path /tmp/no-such-path-for-whalegen"
    )
    assert run.lines("launcher") == [ended["launch_error"]]


# ---- cgroups: limits, leftovers, removal --------------------------------------------------------------


@needs_root
def test_a_run_above_its_host_memory_is_killed_and_the_exit_file_says_why(
    tmp_path: Path, cgroup_name: str
) -> None:
    run = Run(
        tmp_path / "run",
        plan(cgroup=cgroup_name, host_mem_mib=32, uid=TENANT_ID, gid=TENANT_ID),
        ["sh", "-c", 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo survived'],
    )
    ended = run.wait()
    assert ended["exit_code"] != 0 and "survived" not in run.lines(), run.text()
    assert ended["oom_killed"] is True and ended["fenced"] is False
    assert ended["killed_reason"] == "killed: host memory above its 32 MiB limit"
    assert run.lines("launcher")[-1] == "killed: host memory above its 32 MiB limit"


@needs_root
def test_a_run_that_stays_under_its_memory_limit_is_not_called_a_memory_kill(
    tmp_path: Path, cgroup_name: str
) -> None:
    run = Run(tmp_path / "run", plan(cgroup=cgroup_name, host_mem_mib=64), ["sh", "-c", "kill -9 $$"])
    ended = run.wait()
    assert (ended["signal"], ended["oom_killed"], ended["killed_reason"]) == (9, False, "")


@needs_root
def test_pids_max_stops_a_fork_loop(tmp_path: Path, cgroup_name: str) -> None:
    loop = (
        "import os, signal, time\n"
        "children = []\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except BlockingIOError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "print(len(children), flush=True)\n"
        "for pid in children:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
    )
    run = Run(tmp_path / "run", plan(cgroup=cgroup_name, pids_max=20), [sys.executable, "-c", loop])
    assert run.wait()["exit_code"] == 0, run.text()
    assert run.lines() == ["19"]  # the forking process is the 20th


@needs_root
def test_the_cpu_quota_and_limits_are_written_where_the_command_runs(
    tmp_path: Path, cgroup_name: str
) -> None:
    mounts = hierarchies()
    assert all(version == 1 for version, _ in mounts.values()), "this host's hierarchies changed: see module"
    cpu, memory, pids = (os.path.join(mounts[name][1], cgroup_name) for name in ("cpu", "memory", "pids"))
    read = (
        f"cat /proc/self/cgroup | grep -E ':(cpu|memory|pids):' | cut -d: -f3 | sort -u;"
        f" cat {cpu}/cpu.cfs_quota_us {cpu}/cpu.cfs_period_us {memory}/memory.limit_in_bytes"
        f" {memory}/memory.memsw.limit_in_bytes {pids}/pids.max"
    )
    run = Run(
        tmp_path / "run",
        plan(cgroup=cgroup_name, cpu_milli=1500, host_mem_mib=256, pids_max=64),
        ["sh", "-c", read],
    )
    assert run.wait()["exit_code"] == 0, run.text()
    assert run.lines() == [f"/{cgroup_name}", "150000", "100000", str(256 << 20), str(256 << 20), "64"]


@needs_root
def test_leftover_processes_are_killed_and_the_cgroup_removed_when_the_run_ends(
    tmp_path: Path, cgroup_name: str
) -> None:
    started = time.monotonic()
    nap = f"sleep 300.{uuid.uuid4().int % 10**6}"  # a command line no other test runs
    run = Run(
        tmp_path / "run",
        plan(cgroup=cgroup_name, uid=TENANT_ID),
        ["sh", "-c", f"setsid {nap} >/dev/null 2>&1 & {nap} & echo $!; echo done"],
    )
    ended = run.wait()
    assert ended["exit_code"] == 0
    assert time.monotonic() - started < 5  # the held-open pipe did not keep the launcher waiting
    leftover = int(run.lines()[0])
    assert not Path(f"/proc/{leftover}").exists() or "Z" in Path(f"/proc/{leftover}/stat").read_text()
    for _, mount_point in hierarchies().values():
        assert not os.path.exists(os.path.join(mount_point, cgroup_name))
    # No process of the host runs the leftovers' command line any more (the setsid one escaped the group).
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid) == nap]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@needs_root
def test_a_limit_the_kernel_refuses_is_a_launch_error_and_leaves_no_cgroup(
    tmp_path: Path, cgroup_name: str
) -> None:
    run = Run(tmp_path / "run", plan(cgroup=cgroup_name, pids_max=-5), ["true"])
    ended = run.wait()
    assert ended["exit_code"] == 126
    assert ended["launch_error"].startswith("cannot make the run's cgroup: cannot write -5 to ")
    assert "pids.max: Invalid argument" in ended["launch_error"]
    for _, mount_point in hierarchies().values():
        assert not os.path.exists(os.path.join(mount_point, cgroup_name))


# ---- the fence ---------------------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("with_cgroup", [True, False], ids=["in its cgroup", "without a cgroup: its group"])
def test_a_run_past_its_lease_is_stopped_by_its_launcher(
    tmp_path: Path, cgroup_name: str, with_cgroup: bool
) -> None:
    lease = tmp_path / "lease"
    lease.write_text(str(time.time() - 1))
    stubborn = "trap '' TERM; echo up; sleep 300 & wait; sleep 300"  # ignores SIGTERM: SIGKILL after grace
    started = time.monotonic()
    run = Run(
        tmp_path / "run",
        plan(cgroup=cgroup_name if with_cgroup else "", lease_file=str(lease), stop_grace_s=1.0),
        ["sh", "-c", stubborn],
    )
    ended = run.wait()
    assert time.monotonic() - started < 8
    assert ended["fenced"] is True and ended["oom_killed"] is False and ended["signal"] == 9
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(lease.read_text())))
    reason = (
        f"stopped on its node: the agent's lease ran out at {at}"
        " (no heartbeat acknowledged by the plane since)"
    )
    assert ended["killed_reason"] == reason
    assert run.lines("launcher")[-1] == reason


@needs_root
def test_a_run_whose_lease_keeps_moving_forward_is_not_stopped(tmp_path: Path, cgroup_name: str) -> None:
    lease = tmp_path / "lease"
    stop = threading.Event()

    def renew() -> None:  # as the agent does after each acknowledged heartbeat: atomically, ahead by 1.5 s
        while not stop.is_set():
            (tmp_path / "lease.tmp").write_text(str(time.time() + 1.5))
            os.replace(tmp_path / "lease.tmp", lease)
            stop.wait(0.3)

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        run = Run(tmp_path / "run", plan(cgroup=cgroup_name, lease_file=str(lease)), ["sleep", "4"])
        ended = run.wait()
    finally:
        stop.set()
        renewer.join()
    assert (ended["exit_code"], ended["fenced"], ended["killed_reason"]) == (0, False, "")


@needs_root
def test_a_missing_lease_file_is_no_fence_yet(tmp_path: Path) -> None:
    run = Run(tmp_path / "run", plan(lease_file=str(tmp_path / "never-written")), ["sleep", "1.5"])
    assert run.wait()["fenced"] is False


# ---- the container runtime ---------------------------------------------------------------------------


def _missing_podman() -> str:
    if shutil.which("podman") is None:
        return "podman is not installed (CI installs it from the distribution's packages)"
    done = subprocess.run(
        [*PODMAN, "image", "exists", TEST_IMAGE], capture_output=True, timeout=60, check=False
    )
    return "" if done.returncode == 0 else f"no test image {TEST_IMAGE}: run scripts/test-image"


def _container_exists(name: str) -> bool:
    done = subprocess.run(
        [*PODMAN, "container", "exists", name], capture_output=True, timeout=60, check=False
    )
    return done.returncode == 0


@needs_root
@pytest.mark.parametrize("how", ["fence", "sigterm"], ids=["its lease runs out", "the agent stops it"])
def test_no_container_outlives_its_launcher(tmp_path: Path, cgroup_name: str, how: str) -> None:
    missing = _missing_podman()
    if missing:
        pytest.fail(missing)  # scripts/test installs podman and builds the image: a gap, not a skip
    name = f"whalegen-test-{uuid.uuid4().hex[:10]}"
    lease = tmp_path / "lease"
    lease.write_text(str(time.time() + 3600))
    command = [*PODMAN, "run", "--rm=false", "--name", name, "--cgroup-parent", f"/{cgroup_name}"]
    # Raising a limit is refused on these hosts: runc would fail setting the image's defaults.
    command += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    # PID 1 of the container ignores SIGTERM unless it traps it: this one ends on it.
    command += [TEST_IMAGE, "sh", "-c", "trap 'exit 0' TERM; echo up; sleep 60 & wait"]
    the_plan = plan(
        runtime="container",
        cgroup=cgroup_name,
        host_mem_mib=256,
        container=name,
        engine=PODMAN,
        lease_file=str(lease),
        stop_grace_s=1.0,
    )
    try:
        run = Run(tmp_path / "run", the_plan, command)
        wait_for(lambda: "up" in run.lines(), timeout_s=60)
        # The container's processes live under the run's cgroup, where its limits are.
        assert Cgroup(cgroup_name).pids()
        if how == "sigterm":
            os.killpg(run.popen.pid, signal.SIGTERM)  # the agent's stop: the engine client forwards it
        else:
            lease.write_text(str(time.time() - 1))
        ended = run.wait(timeout_s=90)
        assert not _container_exists(name)
        assert ended["fenced"] is (how == "fence"), ended
        # Nor its cgroup, in any hierarchy (the engine makes the parent path in all of them).
        for _, mount_point, _ in cgroup_mounts():
            assert not os.path.exists(os.path.join(mount_point, cgroup_name))
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True, timeout=60, check=False)


@needs_root
@pytest.mark.parametrize(
    ("script", "oom_killed"),
    [
        ('x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo survived', True),
        ("sleep 30 & kill -9 $!; wait $!", False),
    ],
    ids=["above its host memory: a memory kill", "137 for another reason: not one"],
)
def test_a_container_killed_for_memory_says_so(
    tmp_path: Path, cgroup_name: str, script: str, oom_killed: bool
) -> None:
    missing = _missing_podman()
    if missing:
        pytest.fail(missing)  # scripts/test installs podman and builds the image: a gap, not a skip
    name = f"whalegen-test-{uuid.uuid4().hex[:10]}"
    command = [*PODMAN, "run", "--name", name, "--cgroup-parent", f"/{cgroup_name}"]
    command += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", TEST_IMAGE, "sh", "-c", script]
    the_plan = plan(runtime="container", cgroup=cgroup_name, host_mem_mib=32, container=name, engine=PODMAN)
    try:
        run = Run(tmp_path / "run", the_plan, command)
        ended = run.wait(timeout_s=90)
        assert ended["exit_code"] == 137, run.text()  # the engine client reports the container's SIGKILL
        assert ended["oom_killed"] is oom_killed
        words = "killed: host memory above its 32 MiB limit" if oom_killed else ""
        assert ended["killed_reason"] == words
        assert not _container_exists(name)
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True, timeout=60, check=False)


@needs_root
def test_stale_empty_run_cgroups_of_a_node_are_pruned_and_live_or_young_or_others_are_not(
    cgroup_name: str,
) -> None:
    from agents.isolation.cgroups import prune_stale

    root = cgroup_name  # a private root for this test: whalegen/<unique>
    made = {
        name: Cgroup(f"{root}/{name}") for name in ("n1-7-0-aaa", "n1-8-0-bbb", "n1-9-0-ccc", "n2-7-0-ddd")
    }
    for cgroup in made.values():
        cgroup.create(cpu_milli=None, host_mem_mib=None, pids_max=None)
    busy = subprocess.Popen(["sleep", "30"])
    try:
        made["n1-8-0-bbb"].join(busy.pid)
        # Old enough, one node's: pruned unless a process is in it; the other node's stays.
        later = time.time() + 600
        assert prune_stale(root, "n1-", older_than_s=300, now_s=later) == 2
        left = {name for name, cgroup in made.items() if os.path.isdir(cgroup.unique_dirs()[0])}
        assert left == {"n1-8-0-bbb", "n2-7-0-ddd"}
        # Young: kept, whatever it holds (its launcher may not have moved its command in yet).
        young = Cgroup(f"{root}/n1-10-0-eee")
        young.create(cpu_milli=None, host_mem_mib=None, pids_max=None)
        assert prune_stale(root, "n1-", older_than_s=300, now_s=time.time()) == 0
    finally:
        busy.kill()
        busy.wait()
        for name in [*made, "n1-10-0-eee"]:
            Cgroup(f"{root}/{name}").remove(timeout_s=2.0)
        Cgroup(root).remove(timeout_s=2.0)
