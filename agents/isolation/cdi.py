"""Container Device Interface (CDI) specs: which device nodes a named device is, read from spec files.

A CDI spec file (JSON or YAML; the format of github.com/cncf-tags/container-device-interface, SPEC.md)
names the devices of one kind:

```yaml
cdiVersion: "0.5.0"
kind: nvidia.com/gpu                 # vendor/class
devices:
  - name: GPU-3f1c…                  # with `nvidia-ctk cdi generate --device-name-strategy=uuid`
    containerEdits:
      deviceNodes:
        - path: /dev/nvidia0         # the path inside the container
          hostPath: /dev/nvidia0     # optional: the host's node, when it lives elsewhere
containerEdits:                      # spec-wide: every device of the kind needs these
  deviceNodes:
    - path: /dev/nvidiactl
    - path: /dev/nvidia-uvm
```

A device's fully-qualified name is `vendor/class=name` (`nvidia.com/gpu=GPU-3f1c…`): what
`podman run --device` takes (podman reads the same directories from 4.1 on; 4.3.1 checked here).

The agent needs two things from the specs, and this module gives them as pure functions over a
frozen `CdiRegistry`:
- a container run: nothing but the names (the engine applies the spec itself);
- a process run (no container): which host device nodes to make unopenable, i.e. every device node of
  the kind that is not one of the run's own (`mask_nodes`). The spec-wide nodes (`/dev/nvidiactl`,
  `/dev/nvidia-uvm`) are shared by every GPU task and never masked.

Spec directories, lowest priority first (CDI's own order): `/etc/cdi`, then `/var/run/cdi` (written at
run time, e.g. by the simulated backend). A device defined in several files is taken from the directory
of highest priority. A malformed file does not hide the others: its error is kept in
`CdiRegistry.errors`, and a lookup of a device it would have defined says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
SPEC_SUFFIXES = (".json", ".yaml", ".yml")

# The CDI spec's name rules (SPEC.md, "Qualified names"): vendor is a domain-like name, class starts
# with a letter, a device name may also hold ':' (nvidia-ctk's MIG names are `0:1`).
_VENDOR = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiError(ValueError):
    """A spec or a device name that does not follow the CDI format; the message says where and why."""


@dataclass(frozen=True)
class CdiSpec:
    source: str  # the file it came from
    version: str
    kind: str  # vendor/class
    devices: dict[str, tuple[str, ...]]  # device name → its host device node paths
    common_nodes: tuple[str, ...]  # the spec-wide containerEdits' host device node paths


@dataclass(frozen=True)
class CdiRegistry:
    specs: tuple[CdiSpec, ...] = ()  # lowest priority first
    errors: tuple[str, ...] = field(default=())  # one line per file that could not be read


def parse_kind(kind: str) -> tuple[str, str]:
    """`vendor/class` → (vendor, class), or CdiError."""
    vendor, slash, klass = kind.partition("/")
    if not slash or not _VENDOR.match(vendor) or not _CLASS.match(klass):
        raise CdiError(f"{kind!r} is not a CDI kind (vendor/class, e.g. nvidia.com/gpu)")
    return vendor, klass


def parse_qualified_name(device: str) -> tuple[str, str]:
    """`vendor/class=name` → (kind, name), or CdiError."""
    kind, equals, name = device.partition("=")
    if not equals:
        raise CdiError(f"{device!r} is not a fully-qualified CDI device name (vendor/class=name)")
    parse_kind(kind)
    if not _NAME.match(name):
        raise CdiError(f"{device!r}: {name!r} is not a CDI device name")
    return kind, name


def qualified_name(kind: str, name: str) -> str:
    parse_kind(kind)
    if not _NAME.match(name):
        raise CdiError(f"{name!r} is not a CDI device name")
    return f"{kind}={name}"


def _host_nodes(edits: Any, where: str) -> tuple[str, ...]:
    """The host paths of a containerEdits' deviceNodes (hostPath when given, else path)."""
    if edits is None:
        return ()
    if not isinstance(edits, dict):
        raise CdiError(f"{where}: containerEdits must be a mapping")
    nodes = edits.get("deviceNodes") or []
    if not isinstance(nodes, list):
        raise CdiError(f"{where}: containerEdits.deviceNodes must be a list")
    found = []
    for index, node in enumerate(nodes):
        at = f"{where}: containerEdits.deviceNodes[{index}]"
        if not isinstance(node, dict) or not isinstance(node.get("path"), str):
            raise CdiError(f"{at} needs a `path`")
        host = node.get("hostPath") or node["path"]
        if not isinstance(host, str) or not host.startswith("/") or not node["path"].startswith("/"):
            raise CdiError(f"{at}: path and hostPath must be absolute paths")
        found.append(host)
    return tuple(found)


def parse_spec(data: Any, *, source: str) -> CdiSpec:
    """A spec document (already decoded from JSON or YAML) → CdiSpec, or CdiError naming `source`."""
    if not isinstance(data, dict):
        raise CdiError(f"{source}: a CDI spec is a mapping with cdiVersion, kind and devices")
    version, kind, devices = data.get("cdiVersion"), data.get("kind"), data.get("devices")
    if not isinstance(version, str) or not version:
        raise CdiError(f'{source}: cdiVersion is missing (a string such as "0.5.0")')
    if not isinstance(kind, str):
        raise CdiError(f"{source}: kind is missing (vendor/class, e.g. nvidia.com/gpu)")
    try:
        parse_kind(kind)
    except CdiError as error:
        raise CdiError(f"{source}: {error}") from None
    if not isinstance(devices, list) or not devices:
        raise CdiError(f"{source}: devices must be a non-empty list")
    named: dict[str, tuple[str, ...]] = {}
    for index, device in enumerate(devices):
        where = f"{source}: devices[{index}]"
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            raise CdiError(f"{where} needs a `name`")
        name = device["name"]
        if not _NAME.match(name):
            raise CdiError(f"{where}: {name!r} is not a CDI device name")
        if name in named:
            raise CdiError(f"{where}: device {name!r} is defined twice")
        if "containerEdits" not in device:
            raise CdiError(f"{where} ({name}) needs containerEdits")
        named[name] = _host_nodes(device["containerEdits"], f"{where} ({name})")
    common = _host_nodes(data.get("containerEdits"), source)
    return CdiSpec(source=source, version=version, kind=kind, devices=named, common_nodes=common)


def load_spec(path: Path) -> CdiSpec:
    """One spec file (JSON by its `.json` suffix, else YAML) → CdiSpec, or CdiError."""
    try:
        text = path.read_text()
    except OSError as error:
        raise CdiError(f"{path}: cannot be read ({error.strerror})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        syntax = "JSON" if path.suffix == ".json" else "YAML"
        raise CdiError(f"{path}: not valid {syntax} ({first})") from None
    return parse_spec(data, source=str(path))


def load_registry(spec_dirs: Sequence[Path] = DEFAULT_SPEC_DIRS) -> CdiRegistry:
    """Every spec file of `spec_dirs` (lowest priority first; a missing directory is no error)."""
    specs: list[CdiSpec] = []
    errors: list[str] = []
    for spec_dir in spec_dirs:
        if not spec_dir.is_dir():
            continue
        for path in sorted(p for p in spec_dir.iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file()):
            try:
                specs.append(load_spec(path))
            except CdiError as error:
                errors.append(str(error))
    return CdiRegistry(specs=tuple(specs), errors=tuple(errors))


def _of_kind(registry: CdiRegistry, kind: str) -> list[CdiSpec]:
    return [spec for spec in registry.specs if spec.kind == kind]


def device_nodes(registry: CdiRegistry, device: str) -> tuple[str, ...]:
    """The host device nodes of one fully-qualified device (not the spec-wide ones), or CdiError."""
    kind, name = parse_qualified_name(device)
    # Highest priority last in `specs`: the last definition wins.
    for spec in reversed(_of_kind(registry, kind)):
        if name in spec.devices:
            return spec.devices[name]
    broken = f"; specs that could not be read: {'; '.join(registry.errors)}" if registry.errors else ""
    raise CdiError(f"no CDI device {device} in any spec{broken}")


def common_nodes(registry: CdiRegistry, kind: str) -> tuple[str, ...]:
    """The spec-wide device nodes of `kind` (shared by every device of it: never masked)."""
    return tuple(dict.fromkeys(node for spec in _of_kind(registry, kind) for node in spec.common_nodes))


def all_device_nodes(registry: CdiRegistry, kind: str) -> tuple[str, ...]:
    """Every device-level host node of `kind`, each once (spec-wide nodes left out)."""
    common = set(common_nodes(registry, kind))
    nodes = (node for spec in _of_kind(registry, kind) for paths in spec.devices.values() for node in paths)
    return tuple(node for node in dict.fromkeys(nodes) if node not in common)


def mask_nodes(registry: CdiRegistry, *, kind: str, given: Iterable[str]) -> tuple[str, ...]:
    """For a process run given the devices `given` (fully-qualified, of `kind`; none for a run without
    GPUs): the host nodes of `kind` it was not given, to make unopenable. A node a given device also
    uses (a MIG device's parent GPU node, shared by every instance on that GPU) stays open."""
    kept: set[str] = set()
    for device in given:
        if parse_qualified_name(device)[0] != kind:
            raise CdiError(f"{device} is not a device of kind {kind}")
        kept.update(device_nodes(registry, device))
    return tuple(node for node in all_device_nodes(registry, kind) if node not in kept)
