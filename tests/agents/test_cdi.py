"""CDI spec files (agents.isolation.cdi): nvidia-ctk-shaped JSON and YAML, names, common nodes, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.isolation.cdi import (
    CdiError,
    all_device_nodes,
    common_nodes,
    device_nodes,
    load_registry,
    load_spec,
    mask_nodes,
    parse_qualified_name,
    qualified_name,
)

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"
MIG0 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

# What `nvidia-ctk cdi generate --device-name-strategy=uuid` writes, cut down to the parts we read.
NVIDIA_YAML = f"""
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: {GPU0}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
- name: {GPU1}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: {MIG0}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia-caps/nvidia-cap21
    - path: /dev/nvidia-caps/nvidia-cap22
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06
    options: [ro, nosuid, nodev, bind]
"""

HEAD = '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": '


def sim_json(kind: str = "sim.whalegen.dev/gpu-0badcafe") -> dict[str, object]:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {
                "name": "GPU-a",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/h/dev/n0"}]},
            },
            {
                "name": "GPU-b",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/h/dev/n1"}]},
            },
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/h/dev/ctl"}]},
    }


@pytest.fixture
def spec_dirs(tmp_path: Path) -> tuple[Path, Path]:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(NVIDIA_YAML)
    (run / "sim.json").write_text(json.dumps(sim_json()))
    return etc, run


def test_a_yaml_spec_like_nvidia_ctks_gives_each_devices_nodes(spec_dirs: tuple[Path, Path]) -> None:
    registry = load_registry(spec_dirs)
    assert registry.errors == ()
    assert device_nodes(registry, f"nvidia.com/gpu={GPU0}") == (
        "/dev/nvidia0",
        "/dev/dri/card1",
        "/dev/dri/renderD128",
    )
    assert device_nodes(registry, f"nvidia.com/gpu={MIG0}") == (
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    )
    assert common_nodes(registry, "nvidia.com/gpu") == (
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl",
    )


def test_a_json_spec_gives_host_paths_where_it_names_them(spec_dirs: tuple[Path, Path]) -> None:
    registry = load_registry(spec_dirs)
    kind = "sim.whalegen.dev/gpu-0badcafe"
    assert device_nodes(registry, f"{kind}=GPU-b") == ("/h/dev/n1",)
    assert common_nodes(registry, kind) == ("/h/dev/ctl",)
    assert all_device_nodes(registry, kind) == ("/h/dev/n0", "/h/dev/n1")


def test_a_process_run_masks_the_other_gpus_but_never_the_shared_nodes(spec_dirs: tuple[Path, Path]) -> None:
    registry = load_registry(spec_dirs)
    mask = mask_nodes(registry, kind="nvidia.com/gpu", given=[f"nvidia.com/gpu={GPU1}"])
    assert mask == (
        "/dev/nvidia0",
        "/dev/dri/card1",
        "/dev/dri/renderD128",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    )
    assert "/dev/nvidiactl" not in mask
    # A MIG run keeps its parent GPU's node (every instance on that GPU needs it) and its caps.
    mig_mask = mask_nodes(registry, kind="nvidia.com/gpu", given=[f"nvidia.com/gpu={MIG0}"])
    assert mig_mask == ("/dev/dri/card1", "/dev/dri/renderD128", "/dev/nvidia1")
    # A run without GPUs gets none of them.
    assert set(mask_nodes(registry, kind="nvidia.com/gpu", given=[])) >= {"/dev/nvidia0", "/dev/nvidia1"}


def test_the_later_directory_wins_a_device_defined_twice(tmp_path: Path) -> None:
    low, high = tmp_path / "etc", tmp_path / "run"
    low.mkdir()
    high.mkdir()
    (low / "a.json").write_text(json.dumps(sim_json()))
    moved = sim_json()
    moved["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = "/elsewhere"  # type: ignore[index]
    (high / "b.json").write_text(json.dumps(moved))
    assert device_nodes(load_registry([low, high]), "sim.whalegen.dev/gpu-0badcafe=GPU-a") == ("/elsewhere",)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("nvidia.com/gpu=GPU-1234", ("nvidia.com/gpu", "GPU-1234")),
        ("nvidia.com/gpu=0:1", ("nvidia.com/gpu", "0:1")),
        ("nvidia.com/gpu=all", ("nvidia.com/gpu", "all")),
    ],
    ids=["a uuid name", "a mig index name", "all"],
)
def test_qualified_names_parse(name: str, want: tuple[str, str]) -> None:
    assert parse_qualified_name(name) == want
    assert qualified_name(*want) == name


@pytest.mark.parametrize(
    "name",
    ["GPU-1234", "nvidia.com=GPU-1", "nvidia.com/gpu=", "nvidia.com/9gpu=x", "nvidia.com/gpu=a b", "/gpu=x"],
    ids=["no kind", "no class", "no name", "class starts with a digit", "a space in the name", "no vendor"],
)
def test_malformed_qualified_names_are_refused(name: str) -> None:
    with pytest.raises(CdiError, match="CDI"):
        parse_qualified_name(name)


@pytest.mark.parametrize(
    ("text", "suffix", "want"),
    [
        ("{not json", ".json", "not valid JSON"),
        ("kind: [unclosed", ".yaml", "not valid YAML"),
        ("- a list", ".yaml", "a CDI spec is a mapping"),
        (
            '{"kind": "nvidia.com/gpu", "devices": [{"name": "x", "containerEdits": {}}]}',
            ".json",
            "cdiVersion is missing",
        ),
        ('{"cdiVersion": "0.5.0", "kind": "gpu", "devices": []}', ".json", "not a CDI kind"),
        ('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}', ".json", "non-empty list"),
        (
            '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"containerEdits": {}}]}',
            ".json",
            r"devices\[0\] needs a `name`",
        ),
        (
            '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "x"}]}',
            ".json",
            "needs containerEdits",
        ),
        (
            HEAD + '[{"name": "x", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]}',
            ".json",
            "must be absolute",
        ),
        (
            HEAD + '[{"name": "x", "containerEdits": {}}, {"name": "x", "containerEdits": {}}]}',
            ".json",
            "defined twice",
        ),
    ],
    ids=[
        "broken json",
        "broken yaml",
        "not a mapping",
        "no version",
        "a kind without a class",
        "no devices",
        "a device without a name",
        "a device without edits",
        "a relative node path",
        "a device twice",
    ],
)
def test_a_malformed_spec_is_refused_with_its_file_and_reason(
    tmp_path: Path, text: str, suffix: str, want: str
) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_text(text)
    with pytest.raises(CdiError, match=want) as caught:
        load_spec(path)
    assert str(path) in str(caught.value)
    assert "Traceback" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_malformed_file_does_not_hide_the_others_and_a_lookup_names_it(
    spec_dirs: tuple[Path, Path],
) -> None:
    (spec_dirs[1] / "broken.json").write_text("{")
    registry = load_registry(spec_dirs)
    assert device_nodes(registry, f"nvidia.com/gpu={GPU1}") == ("/dev/nvidia1",)
    assert len(registry.errors) == 1 and "broken.json" in registry.errors[0]
    with pytest.raises(CdiError, match=r"no CDI device nvidia.com/gpu=GPU-nope.*broken.json"):
        device_nodes(registry, "nvidia.com/gpu=GPU-nope")


def test_missing_spec_directories_are_no_error(tmp_path: Path) -> None:
    assert load_registry([tmp_path / "absent"]).specs == ()
