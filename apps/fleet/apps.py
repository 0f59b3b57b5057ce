from typing import Any

from django.apps import AppConfig


def _node_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A deleted node's heartbeats are refused at once: its fingerprint in Redis (which every process's
    shortcut trusts) goes now and once the deletion commits (a beat in between may write it back)."""
    from django.db import transaction

    from apps.fleet import liveness

    node_id = instance.pk
    liveness.forget([node_id])
    transaction.on_commit(lambda: liveness.forget([node_id]))


class FleetConfig(AppConfig):
    name = "apps.fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from apps.common import hooks
        from apps.fleet.agents import desired_generation
        from apps.fleet.changes import node_changed
        from apps.fleet.selectors import stopping_unit_rows
        from apps.inventory.models import Node

        hooks.nodes_changed.register(node_changed)
        hooks.desired_generation.register(desired_generation)
        hooks.stopping_unit_rows.register(stopping_unit_rows)

        post_delete.connect(_node_deleted, sender=Node, dispatch_uid="fleet-forget-deleted-node")
