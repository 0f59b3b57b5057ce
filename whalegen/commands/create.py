"""`whalegen create join-token`: a platform operator makes a join token, straight in the database.

    whalegen create join-token --pool P [--cluster C] [--ttl 1h] [--uses N | --unlimited] [--approval]
                               [--name NAME]
    whalegen create join-token --bootstrap

The secret is printed once on standard output (only its hash is kept), what it allows on standard error;
hand it to `whalegen agent join --join-token … --pool P` on the GPU hosts. `--bootstrap` is for a stack
that starts from nothing (docker/compose.yaml's migrate step): it makes or refreshes the token whose
secret the operator chose in WHALEGEN_BOOTSTRAP_JOIN_TOKEN, for WHALEGEN_BOOTSTRAP_POOL in
WHALEGEN_BOOTSTRAP_CLUSTER (both made when missing), and does nothing when the variable is unset.

Runs wherever the plane's settings point, like `whalegen token create`; remote admins use
`POST /api/v1/join-tokens/`. Listing is `GET /api/v1/join-tokens/`; revoking is `whalegen delete
join-token`.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import re
import sys

from whalegen.logformat import structured_stdio

# The bootstrap token is refreshed at every start of the stack, so a day is plenty for its agent to join
# and short enough that a secret copied from an old .env stops working.
BOOTSTRAP_TTL_S = 24 * 3600
_TTL = re.compile(r"(\d+)\s*([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> int:
    """`90`, `90s`, `30m`, `1h`, `7d` → seconds. Raises ValueError for anything else or zero."""
    match = _TTL.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a lifetime such as 30m, 1h or 7d")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True)
    token = sub.add_parser("join-token", help="a token GPU hosts trade for their node credential")
    token.add_argument("--pool", help="the pool the hosts join")
    token.add_argument("--cluster", help="the cluster of the new nodes (default: the pool's only one)")
    token.add_argument("--ttl", default="1h", help="how long it may be used: 30m, 1h, 7d (default 1h)")
    uses = token.add_mutually_exclusive_group()
    uses.add_argument("--uses", type=int, default=1, help="how many hosts may join with it (default 1)")
    uses.add_argument("--unlimited", action="store_true", help="any number of hosts until it expires")
    token.add_argument(
        "--approval", action="store_true", help="its nodes take no work until a platform admin approves them"
    )
    token.add_argument("--name", default="", help="a name to revoke it by (default: POOL-xxxxxx)")
    token.add_argument(
        "--bootstrap",
        action="store_true",
        help="make or refresh the token of WHALEGEN_BOOTSTRAP_JOIN_TOKEN (docker/compose.yaml)",
    )


def _setup() -> None:
    from whalegen.commands._plane import plane_setup

    plane_setup()


def _refusal(exc: Exception) -> int:
    from django.core.exceptions import ValidationError

    assert isinstance(exc, ValidationError)
    for field, messages in exc.message_dict.items():
        for message in messages:
            print(f"whalegen create join-token: {field}: {message}", file=sys.stderr)
    return 1


def _bootstrap() -> int:
    # The compose stack's start-up step: what it says is log lines there (docs/logs-and-metrics.md, "Logs").
    with structured_stdio("whalegen.create", stderr_level=logging.INFO, prefix="whalegen create join-token:"):
        return _bootstrap_token()


def _bootstrap_token() -> int:
    secret = os.environ.get("WHALEGEN_BOOTSTRAP_JOIN_TOKEN", "").strip()
    if not secret:
        print("whalegen create join-token: WHALEGEN_BOOTSTRAP_JOIN_TOKEN is not set; no bootstrap token",
              file=sys.stderr)  # fmt: skip
        return 0
    _setup()
    from django.core.exceptions import ValidationError

    from apps.fleet.join import join_token_bootstrap

    try:
        token, made = join_token_bootstrap(
            secret=secret,
            pool_name=os.environ.get("WHALEGEN_BOOTSTRAP_POOL", "sim"),
            cluster_name=os.environ.get("WHALEGEN_BOOTSTRAP_CLUSTER", "local"),
            ttl_s=BOOTSTRAP_TTL_S,
        )
    except ValidationError as exc:
        return _refusal(exc)
    if token.revoked_at is not None:
        print(f"whalegen create join-token: the bootstrap token {token.name} was revoked; choose a new "
              "WHALEGEN_BOOTSTRAP_JOIN_TOKEN", file=sys.stderr)  # fmt: skip
        return 0
    verb = "made" if made else "refreshed"
    where = f"pool {token.pool.name} in cluster {token.cluster.name}"
    until = f"{token.expires_at:%Y-%m-%d %H:%M} UTC"
    said = f"{verb} bootstrap token {token.name} for {where}, expires {until}"
    print(f"whalegen create join-token: {said}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.bootstrap:
        return _bootstrap()
    if not args.pool:
        print("whalegen create join-token: --pool is required", file=sys.stderr)
        return 2
    try:
        ttl_s = parse_ttl(args.ttl)
    except ValueError as error:
        print(f"whalegen create join-token: --ttl: {error}", file=sys.stderr)
        return 2
    _setup()
    from django.core.exceptions import ValidationError

    from apps.fleet.join import join_token_create
    from apps.fleet.selectors import join_token_target

    try:
        pool, cluster = join_token_target(pool_name=args.pool, cluster_name=args.cluster)
        token, raw = join_token_create(
            pool=pool,
            cluster=cluster,
            ttl_s=ttl_s,
            max_uses=None if args.unlimited else args.uses,
            requires_approval=args.approval,
            name=args.name,
            created_by=f"cli:{getpass.getuser()}",
        )
    except ValidationError as exc:
        return _refusal(exc)
    uses = "any number of hosts" if token.max_uses is None else f"{token.max_uses} host(s)"
    approval = "; its nodes wait for a platform admin's approval" if token.requires_approval else ""
    where = f"pool {pool.name} in cluster {cluster.name}"
    until = f"{token.expires_at:%Y-%m-%d %H:%M} UTC"
    print(raw)
    said = f"join token {token.name} ({token.prefix}…) for {where}: {uses}, until {until}{approval}"
    print(f"{said}; shown once", file=sys.stderr)
    return 0
