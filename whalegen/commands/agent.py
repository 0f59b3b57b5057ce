"""`whalegen agent`: run the node agent, or `whalegen agent inspect` to print this host's GPUs as JSON.

    whalegen agent --server URL --token T [--backend nvml|sim] [--sim-spec FILE] [--state-dir DIR]
    whalegen agent inspect [--backend nvml|sim] [--sim-spec FILE]

`--backend sim` without `--sim-spec` plays the example host shipped in agents/sim/example-host.yaml.

The token may come from WHALEGEN_AGENT_TOKEN or a file named by WHALEGEN_AGENT_TOKEN_FILE instead of
the command line (where other users of the host can read it). Imports only the agent, never Django.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = "/var/lib/whalegen-agent"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["run", "inspect"], default="run")
    parser.add_argument("--server", default=os.environ.get("WHALEGEN_AGENT_SERVER"), help="control plane URL")
    parser.add_argument("--token", default=None, help="this node's token (or WHALEGEN_AGENT_TOKEN[_FILE])")
    parser.add_argument(
        "--backend", choices=["nvml", "sim"], default=os.environ.get("WHALEGEN_AGENT_BACKEND", "nvml")
    )
    parser.add_argument(
        "--sim-spec",
        type=Path,
        default=Path(spec) if (spec := os.environ.get("WHALEGEN_AGENT_SIM_SPEC")) else None,
        help="YAML/JSON fleet spec for --backend sim (or WHALEGEN_AGENT_SIM_SPEC; default: the example "
        "host agents/sim/example-host.yaml, two H100 80GB and an L40S)",
    )
    parser.add_argument("--sim-node", help="which node of the spec this agent plays (default: the first)")
    parser.add_argument(
        "--state-dir", type=Path, default=Path(os.environ.get("WHALEGEN_AGENT_STATE_DIR", DEFAULT_STATE_DIR))
    )
    parser.add_argument("--node-name", default=None, help="name to register under (default: hostname)")
    parser.add_argument(
        "--allow-mig-mode-change",
        action="store_true",
        default=os.environ.get("WHALEGEN_AGENT_ALLOW_MIG_MODE_CHANGE", "") in {"1", "true", "yes"},
        help="let the agent enable/disable MIG when the desired state asks (off by default)",
    )
    parser.add_argument("--heartbeat-s", type=float, default=10.0)
    parser.add_argument("--poll-wait-s", type=float, default=20.0)
    parser.add_argument("--tick-s", type=float, default=1.0)
    parser.add_argument("--reconcile-s", type=float, default=30.0)
    parser.add_argument(
        "--log-cap-mib",
        type=float,
        default=float(os.environ.get("WHALEGEN_AGENT_LOG_CAP_MIB", "10")),
        help="captured output kept per run: its first and last halves of this (10)",
    )
    parser.add_argument("--log-level", default=os.environ.get("WHALEGEN_LOG_LEVEL", "INFO"))
    # Isolation (docs/isolation.md).
    parser.add_argument(
        "--single-tenant",
        action="store_true",
        default=os.environ.get("WHALEGEN_AGENT_SINGLE_TENANT", "") in {"1", "true", "yes"},
        help="the operator's word that one tenant at a time uses this host: an agent that is not root "
        "then runs tasks as its own user (refused otherwise)",
    )
    parser.add_argument(
        "--uid-range",
        default=os.environ.get("WHALEGEN_AGENT_UID_RANGE", "200000-299999"),
        help="the uids (and gids) the plane may ask a run to take, LOW-HIGH (200000-299999)",
    )
    parser.add_argument(
        "--container-engine",
        choices=["podman", "none"],
        default=os.environ.get("WHALEGEN_AGENT_CONTAINER_ENGINE", "podman"),
        help="what runs container tasks (podman, rootful; its options from WHALEGEN_AGENT_PODMAN_OPTIONS); "
        "none: this host refuses them",
    )
    parser.add_argument(
        "--cgroup-root",
        default=os.environ.get("WHALEGEN_AGENT_CGROUP_ROOT", "whalegen"),
        help="the runs' cgroups go under this, in each controller (whalegen)",
    )


def _token(args: argparse.Namespace) -> str | None:
    if args.token:
        return str(args.token)
    path = os.environ.get("WHALEGEN_AGENT_TOKEN_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get("WHALEGEN_AGENT_TOKEN")


def _backend(args: argparse.Namespace, sim_dir: Path) -> Any:
    if args.backend == "sim":
        from agents.sim.backend import from_spec_file
        from agents.sim.spec import EXAMPLE_HOST_SPEC

        spec = args.sim_spec if args.sim_spec is not None else EXAMPLE_HOST_SPEC
        _, backend = from_spec_file(spec, args.sim_node, sim_dir)
        return backend
    from agents.backend import NvmlBackend

    return NvmlBackend()


def _inspect(args: argparse.Namespace) -> int:
    from agents.backend import BackendError
    from agents.inspect import inspect_host

    with tempfile.TemporaryDirectory(prefix="whalegen-inspect-") as tmp:
        backend = _backend(args, Path(tmp))
        try:
            backend.open()
        except BackendError as error:
            print(json.dumps({"ok": False, "error": error.failure.to_dict()}, indent=2))
            return 1
        try:
            print(json.dumps(inspect_host(backend), indent=2, sort_keys=True))
        finally:
            backend.close()
    return 0


class NodeContextFilter(logging.Filter):
    """Stamp this host's node name on every record (the plane's log fields: docs/operations.md, "Logs")."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "node", None) is None:
            record.node = self.node
        return True


def configure_logging(*, fmt: str, level: str, node: str) -> logging.Handler:
    """One stderr handler: plain lines, or JSON lines for `WHALEGEN_LOG_FORMAT=json`; every record carries
    the node, task records their task id and attempt, and credentials are redacted in both formats.
    Only the standard-library formatter module is imported (the agent runs without Django)."""
    from whalegen.logformat import RedactFilter, formatter_for

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_for(fmt))
    handler.addFilter(NodeContextFilter(node))
    handler.addFilter(RedactFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return handler


def run(args: argparse.Namespace) -> int:
    configure_logging(
        fmt=os.environ.get("WHALEGEN_LOG_FORMAT", "plain"),
        level=str(args.log_level),
        node=args.node_name or os.uname().nodename,
    )
    if args.action == "inspect":
        return _inspect(args)
    token = _token(args)
    if not args.server or not token:
        print("whalegen agent: --server and --token (or WHALEGEN_AGENT_TOKEN) are required", file=sys.stderr)
        return 2
    from agents.agent import Agent, AgentConfig
    from agents.isolation.host import parse_uid_range
    from agents.isolation.podman import engine_config_from_env

    try:
        uid_range = parse_uid_range(str(args.uid_range))
    except ValueError as error:
        print(f"whalegen agent: --uid-range: {error}", file=sys.stderr)
        return 2
    config = AgentConfig(
        server=args.server,
        token=token,
        state_dir=args.state_dir,
        node_name=args.node_name or os.uname().nodename,
        allow_mig_mode_change=args.allow_mig_mode_change,
        heartbeat_s=args.heartbeat_s,
        poll_wait_s=args.poll_wait_s,
        tick_s=args.tick_s,
        reconcile_s=args.reconcile_s,
        log_cap_bytes=int(args.log_cap_mib * (1 << 20)),
        single_tenant=args.single_tenant,
        uid_range=uid_range,
        cgroup_root=str(args.cgroup_root),
        container_engine=engine_config_from_env(os.environ) if args.container_engine == "podman" else None,
    )
    args.state_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(config, _backend(args, args.state_dir / "sim"))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: agent.stop())
    agent.run()
    return 0
