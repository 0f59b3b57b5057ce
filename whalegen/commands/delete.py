"""`whalegen delete KIND NAME`: take away what a platform operator gave, straight in the database.

    whalegen delete join-token NAME|ID|PREFIX     revoke it: no host joins with it any more
    whalegen delete node-credential CLUSTER/NODE  revoke the node's credential: its agent is refused,
                                                  and a (reinstalled) host may join under that name

Neither removes a row: a revoked join token stays listed (`GET /api/v1/join-tokens/`) with who revoked
it and when, and a node keeps its GPUs and history. Runs wherever the plane's settings point, like
`whalegen create`.
"""

from __future__ import annotations

import argparse
import getpass
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True)
    token = sub.add_parser("join-token", help="revoke a join token")
    token.add_argument("ref", help="the token's name, id, or the first characters of its secret (wgj_…)")
    credential = sub.add_parser("node-credential", help="revoke a node's agent credential")
    credential.add_argument("ref", help="CLUSTER/NODE or the node's id")


def run(args: argparse.Namespace) -> int:
    from whalegen.commands._plane import plane_setup

    plane_setup()
    from apps.fleet.join import join_token_revoke, node_credential_revoke
    from apps.fleet.selectors import join_token_find, node_find

    actor = f"cli:{getpass.getuser()}"
    if args.kind == "join-token":
        token = join_token_find(ref=args.ref)
        if token is None:
            print(f"whalegen delete join-token: no join token {args.ref!r}", file=sys.stderr)
            return 1
        token = join_token_revoke(token=token, actor=actor)
        when = f"{token.revoked_at:%Y-%m-%d %H:%M:%S} UTC"
        print(f"join token {token.name} revoked at {when} by {token.revoked_by}")
        return 0
    node = node_find(ref=args.ref)
    if node is None:
        print(f"whalegen delete node-credential: no node {args.ref!r} (name it CLUSTER/NODE or by id)",
              file=sys.stderr)  # fmt: skip
        return 1
    node_credential_revoke(node=node, actor=actor)
    print(f"the credential of node {node.cluster.name}/{node.name} is revoked; its agent is refused from now "
          "on, and a host may join under this name")  # fmt: skip
    return 0
