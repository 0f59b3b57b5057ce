"""`python manage.py issue_node_token CLUSTER/NODE`: a new agent credential for a node, printed once.

The previous credential stops working at once; give the new one to the node's agent
(`whalegen agent --token …` or `WHALEGEN_AGENT_TOKEN_FILE`).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.fleet.nodes import node_token_issue
from apps.inventory.models import Node


class Command(BaseCommand):
    help = "Issue a new agent credential for a node (CLUSTER/NODE or the node id); prints it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="CLUSTER/NODE, e.g. eu-west-1/eu-h100-01, or the node's id")

    def handle(self, *args: Any, **options: Any) -> None:
        ref: str = options["node"]
        if ref.isdigit():
            node = Node.objects.filter(pk=int(ref)).first()
        elif "/" in ref:
            cluster, name = ref.split("/", 1)
            node = Node.objects.filter(cluster__name=cluster, name=name).first()
        else:
            raise CommandError("name the node as CLUSTER/NODE or by its id")
        if node is None:
            raise CommandError(f"no node {ref!r}")
        self.stdout.write(node_token_issue(node=node))
