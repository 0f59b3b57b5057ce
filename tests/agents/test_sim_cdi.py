"""The simulated host's CDI spec (agents.sim.cdi): names, nodes, MIG slots, one kind per host."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.backend import BackendError
from agents.isolation.cdi import device_nodes, load_registry, mask_nodes
from agents.sim.backend import SimBackend, from_spec_file

HOST_SPEC = """
nodes:
  - name: node-a
    gpus:
      - sku: h100-80gb-sxm
        mig: enabled
      - sku: l40s
"""


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[SimBackend]:
    spec = tmp_path / "host.yaml"
    spec.write_text(HOST_SPEC)
    _, backend = from_spec_file(spec, None, tmp_path / "host", cdi_dir=tmp_path / "cdi")
    backend.open()
    yield backend
    backend.close()


def test_opening_writes_a_spec_naming_each_gpu_by_uuid(opened: SimBackend) -> None:
    assert opened.cdi is not None
    registry = load_registry(opened.cdi_spec_dirs())
    assert registry.errors == ()
    gpus = opened.inventory()
    names = [opened.cdi_device(gpu.uuid) for gpu in gpus]
    assert names == [f"{opened.cdi.kind}={gpu.uuid}" for gpu in gpus]
    nodes = device_nodes(registry, names[1])
    assert nodes == (str(opened.cdi.dev_dir / "nvidia1"),)
    kind = 0o020000 if os.geteuid() == 0 else 0o100000  # a character device as root, else a file
    assert stat.S_IFMT(os.stat(nodes[0]).st_mode) == kind
    assert mask_nodes(registry, kind=opened.cdi.kind, given=[names[1]])[0] == str(
        opened.cdi.dev_dir / "nvidia0"
    )


def test_a_mig_instance_is_named_by_its_gpu_and_start_so_the_spec_never_changes(opened: SimBackend) -> None:
    assert opened.cdi is not None
    before = opened.cdi.spec_path.read_text()
    profile = next(p for p in opened.gi_profiles(0) if p.name == "1g.10gb")
    gi = opened.create_gi(0, profile.profile_id, 3, 1)
    opened.create_default_ci(0, gi)
    mig = next(i for i in opened.instances(0) if i.gi_id == gi)
    assert mig.mig_uuid is not None
    name = opened.cdi_device(mig.mig_uuid)
    gpu_uuid = opened.inventory()[0].uuid
    assert name == f"{opened.cdi.kind}={gpu_uuid}-mig3"
    assert opened.cdi.spec_path.read_text() == before
    nodes = device_nodes(load_registry(opened.cdi_spec_dirs()), name)
    assert nodes == (
        str(opened.cdi.dev_dir / "nvidia0"),
        str(opened.cdi.dev_dir / "nvidia-caps/nvidia0-mig3"),
    )


def test_two_simulated_hosts_get_two_kinds_and_closing_removes_the_spec(tmp_path: Path) -> None:
    spec = tmp_path / "host.yaml"
    spec.write_text(HOST_SPEC)
    _, one = from_spec_file(spec, None, tmp_path / "one", cdi_dir=tmp_path / "cdi")
    _, two = from_spec_file(spec, None, tmp_path / "two", cdi_dir=tmp_path / "cdi")
    assert one.cdi is not None and two.cdi is not None
    assert one.cdi.kind != two.cdi.kind and one.cdi.kind.startswith("sim.whalegen.dev/gpu-")
    one.open()
    assert json.loads(one.cdi.spec_path.read_text())["kind"] == one.cdi.kind
    one.close()
    assert not one.cdi.spec_path.exists()


def test_a_stale_spec_of_a_vanished_host_is_pruned(tmp_path: Path, opened: SimBackend) -> None:
    assert opened.cdi is not None
    stale = json.loads(opened.cdi.spec_path.read_text())
    stale["containerEdits"]["deviceNodes"][0]["hostPath"] = str(tmp_path / "gone/dev/nvidiactl")
    stale_path = opened.cdi.spec_dir / "whalegen-sim-00000000.json"
    stale_path.write_text(json.dumps(stale))
    opened.open()
    assert not stale_path.exists()


def test_an_unknown_uuid_is_refused_in_words(opened: SimBackend) -> None:
    with pytest.raises(LookupError, match="no GPU or MIG device GPU-nope"):
        opened.cdi_device("GPU-nope")
    assert not issubclass(LookupError, BackendError)
