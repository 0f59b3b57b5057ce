"""`whalegen approve node CLUSTER/NODE`: a platform operator lets a node that joined with an approval
token take work (the same as `POST /api/v1/nodes/<id>/approve/`), straight in the database."""

from __future__ import annotations

import argparse
import getpass
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True)
    node = sub.add_parser("node", help="approve a node that joined with an approval token")
    node.add_argument("ref", help="CLUSTER/NODE or the node's id")


def run(args: argparse.Namespace) -> int:
    from whalegen.commands._plane import plane_setup

    plane_setup()
    from apps.common.errors import ApplicationError
    from apps.fleet.join import node_approve
    from apps.fleet.selectors import node_find

    node = node_find(ref=args.ref)
    if node is None:
        print(f"whalegen approve node: no node {args.ref!r} (name it CLUSTER/NODE or by id)", file=sys.stderr)
        return 1
    try:
        node = node_approve(node=node, actor=f"cli:{getpass.getuser()}")
    except ApplicationError as error:
        print(f"whalegen approve node: {error.message}", file=sys.stderr)
        return 1
    print(f"node {node.cluster.name}/{node.name} approved; it is {node.state}")
    return 0
