"""`whalegen agent`: run the node agent, join this host to a pool, or print this host's GPUs as JSON.

    whalegen agent join --server URL --join-token T --pool P [--name N] [--state-dir DIR] [--force]
    whalegen agent [--server URL] [--token T] [--backend nvml|sim] [--sim-spec FILE] [--state-dir DIR]
    whalegen agent inspect [--backend nvml|sim] [--sim-spec FILE]

`--backend sim` without `--sim-spec` plays the example host shipped in agents/sim/example-host.yaml.

`join` trades a join token for this node's credential and keeps it in the state directory (mode 0600);
run again on a host that joined, it says so and exits 0 without spending the token (`--force` joins
anew). The agent then needs no token argument: it reads the credential (and the server it joined)
from there. A token given explicitly — `--token`, WHALEGEN_AGENT_TOKEN, or a file named by
WHALEGEN_AGENT_TOKEN_FILE (not the command line, where other users of the host can read it) — wins
over the joined one. Given a join token (WHALEGEN_AGENT_JOIN_TOKEN[_FILE]) and a pool but no
credential, the agent joins first (docker/compose.yaml does). Imports only the agent, never Django.
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
    parser.add_argument("action", nargs="?", choices=["run", "inspect", "join"], default="run")
    parser.add_argument("--server", default=os.environ.get("WHALEGEN_AGENT_SERVER"), help="control plane URL")
    parser.add_argument(
        "--token",
        default=None,
        help="this node's token (or WHALEGEN_AGENT_TOKEN[_FILE]; default: what `join` kept in --state-dir)",
    )
    parser.add_argument(
        "--join-token",
        default=None,
        help="a join token to trade for this node's credential (or WHALEGEN_AGENT_JOIN_TOKEN[_FILE])",
    )
    parser.add_argument(
        "--pool",
        default=os.environ.get("WHALEGEN_AGENT_POOL"),
        help="the pool to join (or WHALEGEN_AGENT_POOL)",
    )
    parser.add_argument(
        "--force", action="store_true", help="join: join again although this host holds a credential"
    )
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
    parser.add_argument(
        "--node-name",
        "--name",
        dest="node_name",
        default=os.environ.get("WHALEGEN_AGENT_NODE_NAME"),
        help="the node's name (or WHALEGEN_AGENT_NODE_NAME; default: the joined node's, else the hostname)",
    )
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
    return os.environ.get("WHALEGEN_AGENT_TOKEN") or None


def _join_token(args: argparse.Namespace) -> str | None:
    if args.join_token:
        return str(args.join_token)
    path = os.environ.get("WHALEGEN_AGENT_JOIN_TOKEN_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get("WHALEGEN_AGENT_JOIN_TOKEN") or None


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
    """Stamp this host's node name on every record (the plane's log fields: docs/logs-and-metrics.md,
    "Logs")."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "node", None) is None:
            record.node = self.node
        return True


def configure_logging(*, fmt: str, level: str, node: str) -> logging.Handler:
    """One stderr handler: JSON lines, or plain ones for `WHALEGEN_LOG_FORMAT=plain`; every record carries
    `component` `agent` and the node, task records their task id and attempt, Python's warnings are records
    too, and credentials are redacted in both formats. Only the standard-library formatter module is
    imported (the agent runs without Django)."""
    from whalegen.logformat import RedactFilter, formatter_for, set_component

    set_component("agent")
    logging.captureWarnings(True)
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


def _join(args: argparse.Namespace, *, to_log: bool = False) -> int:
    """`whalegen agent join`: 0 when this host holds a credential afterwards (joined now, or before);
    otherwise the plane's reason, one line, with the exit status a provisioning script acts on. Printed for
    a person running `join`; `to_log`: log records, like every other line of an agent that joins by itself
    before it runs (JSON by default: docs/logs-and-metrics.md, "Logs")."""

    def tell(message: str, *, error: bool = False) -> None:
        if to_log:
            logging.getLogger("whalegen.agent").log(logging.ERROR if error else logging.INFO, message)
        else:
            print(message, file=sys.stderr if error else sys.stdout)

    from agents.backend import BackendError
    from agents.client import PlaneRejected, PlaneUnavailable
    from agents.join import credential_load, credential_path, join
    from whalegen.commands._errors import EXIT_AUTH, EXIT_INVALID, EXIT_UNREACHABLE

    held = credential_load(args.state_dir)
    if held is not None and not args.force:
        tell(f"whalegen agent join: this host already joined as {held.describe()}; nothing to do "
             f"(its credential: {credential_path(args.state_dir)}; --force joins again)")  # fmt: skip
        return 0
    join_token = _join_token(args)
    missing = [flag for flag, value in (("--server", args.server), ("--join-token", join_token),
                                        ("--pool", args.pool)) if not value]  # fmt: skip
    if missing:
        tell(f"whalegen agent join: {', '.join(missing)} required (or WHALEGEN_AGENT_SERVER, "
             "WHALEGEN_AGENT_JOIN_TOKEN[_FILE], WHALEGEN_AGENT_POOL)", error=True)  # fmt: skip
        return 2
    assert join_token is not None
    args.state_dir.mkdir(parents=True, exist_ok=True)
    backend = _backend(args, args.state_dir / "sim")
    try:
        backend.open()
    except BackendError as error:
        tell(f"whalegen agent join: cannot read this host's GPUs: {error}", error=True)
        return 1
    try:
        node = join(
            server=args.server,
            backend=backend,
            join_token=join_token,
            pool=args.pool,
            node_name=args.node_name or os.uname().nodename,
            state_dir=args.state_dir,
        )
    except PlaneUnavailable as error:
        tell(f"whalegen agent join: the plane did not answer ({error}); try again", error=True)
        return EXIT_UNREACHABLE
    except PlaneRejected as error:
        tell(f"whalegen agent join: refused: {error.detail}", error=True)
        return {400: EXIT_INVALID, 401: EXIT_AUTH, 403: EXIT_AUTH}.get(error.status, 1)
    finally:
        backend.close()
    tell(f"whalegen agent join: joined as {node.describe()}; credential kept in "
         f"{credential_path(args.state_dir)} (mode 0600)")  # fmt: skip
    if node.pending_approval:
        tell("whalegen agent join: the pool needs a platform admin's approval of this node; it heartbeats "
             "but takes no work until then")  # fmt: skip
    return 0


def run(args: argparse.Namespace) -> int:
    from agents.join import credential_load

    joined = credential_load(args.state_dir)
    configure_logging(
        fmt=os.environ.get("WHALEGEN_LOG_FORMAT", "json"),
        level=str(args.log_level),
        node=args.node_name or (joined.node_name if joined else os.uname().nodename),
    )
    if args.action == "inspect":
        return _inspect(args)
    if args.action == "join":
        return _join(args)
    token = _token(args)
    if token is None and joined is None and _join_token(args):
        # Join if needed, then run: what a container or unit that starts from nothing does.
        code = _join(args, to_log=True)
        if code != 0:
            return code
        joined = credential_load(args.state_dir)
    if token is None and joined is not None:
        token = joined.credential
        args.server = args.server or joined.server
        args.node_name = args.node_name or joined.node_name
    # From here on a refusal is a log line like the agent's others: a supervisor's log reads it.
    if not args.server or not token:
        logging.getLogger("whalegen.agent").error(
            "whalegen agent: --server and --token (or WHALEGEN_AGENT_TOKEN[_FILE]) are required, unless this "
            "host joined (`whalegen agent join`, or a join token in WHALEGEN_AGENT_JOIN_TOKEN[_FILE])"
        )
        return 2
    from agents.agent import Agent, AgentConfig
    from agents.isolation.host import parse_uid_range
    from agents.isolation.podman import engine_config_from_env

    try:
        uid_range = parse_uid_range(str(args.uid_range))
    except ValueError as error:
        logging.getLogger("whalegen.agent").error("whalegen agent: --uid-range: %s", error)
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
