"""Real containers through podman (agents.isolation.podman), given GPUs of a simulated host by CDI.

CI runs these as root with podman installed by scripts/test. They never skip: a host without a usable
engine fails here with the reason, since a green run without containers would prove nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.isolation.podman import (
    EngineConfig,
    Mount,
    container_name,
    engine_available,
    engine_config_from_env,
    env_file_text,
    image_present,
    rm_argv,
    run_argv,
    stop_argv,
)
from agents.sim.backend import SimBackend, from_spec_file

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/whalegen-test/busybox:1"
UID, GID = 20001, 20001
TWO_GPUS = "nodes:\n  - name: node-a\n    gpus:\n      - sku: l40s\n        count: 2\n"


@pytest.fixture(scope="session")
def engine() -> EngineConfig:
    config = dataclasses.replace(engine_config_from_env(os.environ), network="none")
    reason = engine_available(config)
    if reason is not None:
        pytest.fail(f"container tests need a usable podman: {reason}")
    if not image_present(config, IMAGE):
        built = subprocess.run(
            [str(REPO / "scripts/test-image")], capture_output=True, text=True, check=False
        )
        if built.returncode != 0:
            pytest.fail(f"scripts/test-image failed: {built.stderr.strip()}")
    return config


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SimBackend]:
    """A simulated host with two GPUs whose CDI spec podman reads (/var/run/cdi as root)."""
    spec = tmp_path / "host.yaml"
    spec.write_text(TWO_GPUS)
    _, backend = from_spec_file(spec, None, tmp_path / "sim")
    backend.open()
    yield backend
    backend.close()


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    path = tmp_path / "env"
    path.write_text(env_file_text({"WHALEGEN_TASK_ID": "t-1"}))
    path.chmod(0o600)  # podman (root) reads it; the task never sees the file
    return path


def _name() -> str:
    return container_name("node-test", uuid.uuid4().hex[:12], 1, "test-plane")


def run(
    engine: EngineConfig, env_file: Path, script: str, **options: object
) -> subprocess.CompletedProcess[str]:
    argv = run_argv(
        engine,
        name=_name(),
        image=str(options.pop("image", IMAGE)),
        command=["sh", "-c", script],
        uid=UID,
        gid=GID,
        env_file=str(env_file),
        **options,  # type: ignore[arg-type]
    )
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_the_container_runs_as_the_given_uid_without_privileges(engine: EngineConfig, env_file: Path) -> None:
    done = run(
        engine,
        env_file,
        "id -u; id -g; grep -E '^(NoNewPrivs|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[:2] == [str(UID), str(GID)]
    status = dict(line.split(":\t") for line in lines[2:] if line)
    assert status == {
        "CapPrm": "0" * 16,
        "CapEff": "0" * 16,
        "CapBnd": "0" * 16,
        "CapAmb": "0" * 16,
        "NoNewPrivs": "1",
    }


def test_the_container_sees_only_its_own_gpu(engine: EngineConfig, env_file: Path, host: SimBackend) -> None:
    _first, second = host.inventory()
    device = host.cdi_device(second.uuid)
    assert device.startswith("sim.whalegen.dev/gpu-")
    done = run(engine, env_file, "ls /dev", cdi_devices=[device])
    assert done.returncode == 0, done.stderr
    seen = set(done.stdout.split())
    assert {"nvidia1", "nvidiactl", "nvidia-uvm"} <= seen
    assert "nvidia0" not in seen
    # Its node opens (the simulator's nodes are /dev/null's numbers); no node can be made, even in /tmp.
    done = run(engine, env_file, "head -c0 /dev/nvidia1 && mknod /tmp/nvidia0 c 1 3", cdi_devices=[device])
    assert done.returncode != 0 and "Operation not permitted" in done.stderr


def test_the_environment_comes_from_the_file_and_never_from_argv(
    engine: EngineConfig, tmp_path: Path, env_file: Path
) -> None:
    secret = f"hf_{uuid.uuid4().hex}"
    env_file.write_text(env_file_text({"HF_TOKEN": secret, "WHALEGEN_TASK_ID": "t-1"}))
    name = _name()
    argv = run_argv(
        engine,
        name=name,
        image=IMAGE,
        command=["sh", "-c", 'echo "$HF_TOKEN"; sleep 3'],
        uid=UID,
        gid=GID,
        env_file=str(env_file),
    )
    assert not any(secret in arg for arg in argv)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # the container runs: podman, conmon, runc's children all have their argv now
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                assert secret.encode() not in cmdline.read_bytes(), f"{cmdline} shows the secret"
            except OSError:
                continue  # a process that ended meanwhile
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == secret


def test_network_none_leaves_only_loopback(engine: EngineConfig, env_file: Path) -> None:
    done = run(engine, env_file, "ls /sys/class/net")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["lo"]


def test_a_read_only_mount_is_visible_and_not_writable(
    engine: EngineConfig, env_file: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "weights.txt").write_text("layer-0\n")
    data.chmod(0o755)
    tmp_path.chmod(0o755)
    mounts = [Mount(str(data), "/data", read_only=True)]
    done = run(
        engine,
        env_file,
        "cat /data/weights.txt; touch /data/x || echo refused",
        mounts=mounts,
        workdir="/data",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["layer-0", "refused"]


def test_pull_policy_never_with_a_missing_image_fails_in_words(engine: EngineConfig, env_file: Path) -> None:
    done = run(engine, env_file, "true", image="localhost/whalegen-test/absent:0", pull_policy="never")
    assert done.returncode == 125
    assert "localhost/whalegen-test/absent:0: image not known" in done.stderr


def test_the_pids_limit_and_cgroup_parent_hold(engine: EngineConfig, env_file: Path) -> None:
    parent = f"whalegen-test/{uuid.uuid4().hex[:8]}"
    try:
        done = run(
            engine,
            env_file,
            "cat /sys/fs/cgroup/pids/pids.max; grep pids /proc/self/cgroup",
            cgroup_parent=parent,
            pids_max=64,
        )
        assert done.returncode == 0, done.stderr
        limit, cgroup = done.stdout.split()
        assert limit == "64"
        assert cgroup.split(":")[2].startswith(f"/{parent}/libpod-")
    finally:
        # conmon leaves its cgroup beside the container's: remove the subtree, deepest first.
        for root in Path("/sys/fs/cgroup").iterdir():
            for path in sorted((root / parent).glob("**/"), key=lambda p: len(p.parts), reverse=True):
                path.rmdir()
            with contextlib.suppress(OSError):  # another test's parent may be there too
                (root / parent).parent.rmdir()


def test_rm_removes_a_running_container(engine: EngineConfig, env_file: Path) -> None:
    name = _name()
    argv = run_argv(
        engine, name=name, image=IMAGE, command=["sleep", "300"], uid=UID, gid=GID, env_file=str(env_file)
    )
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        exists = [*engine.prefix, "container", "exists", name]
        while subprocess.run(exists, check=False).returncode != 0:
            assert time.monotonic() < deadline and proc.poll() is None, "the container never started"
            time.sleep(0.1)
        removed = subprocess.run(
            rm_argv(engine, name), capture_output=True, text=True, timeout=60, check=False
        )
        assert removed.returncode == 0, removed.stderr
        proc.wait(timeout=30)
        assert subprocess.run(exists, check=False).returncode == 1
        # Stopping or removing what is gone is no error (the launcher's cleanup may run twice).
        assert subprocess.run(rm_argv(engine, name), check=False, capture_output=True).returncode == 0
        assert subprocess.run(stop_argv(engine, name), check=False, capture_output=True).returncode == 0
    finally:
        proc.kill()


def test_container_names_are_unique_per_plane_node_task_and_attempt() -> None:
    names = {
        container_name(node, task, attempt, plane)
        for node in ("n1", "n2")
        for task in ("t/1", "t-1")
        for attempt in (1, 2)
        for plane in ("p1", "p2")
    }
    assert len(names) == 16
    assert all(name.startswith("whalegen-t-1-a") for name in names)


@pytest.mark.parametrize(
    ("change", "want"),
    [
        ({"uid": 0}, "never runs as root"),
        ({"pull_policy": "sometimes"}, "pull policy"),
        ({"command": []}, "needs a command"),
        ({"mounts": [Mount("/a:b", "/c")]}, "mount path"),
    ],
    ids=["root", "an unknown pull policy", "no command", "a mount path with a colon"],
)
def test_run_argv_refuses(change: dict[str, object], want: str) -> None:
    options: dict[str, object] = {
        "name": "n",
        "image": IMAGE,
        "command": ["true"],
        "uid": UID,
        "gid": GID,
        "env_file": "/e",
        **change,
    }
    with pytest.raises(ValueError, match=want):
        run_argv(EngineConfig(), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "env", [{"A B": "x"}, {"GLOB*": "x"}, {"K": "line\nOTHER"}], ids=["a space", "a glob", "a newline"]
)
def test_env_file_text_refuses_what_podman_would_read_from_the_agents_environment(
    env: dict[str, str],
) -> None:
    with pytest.raises(ValueError):
        env_file_text(env)
