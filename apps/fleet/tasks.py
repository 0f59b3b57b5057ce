"""Celery tasks for the fleet: thin, idempotent."""

from __future__ import annotations

from celery import shared_task

from apps.fleet.services import drains_complete, nodes_mark_lost


@shared_task(name="apps.fleet.tasks.nodes_check_health")
def nodes_check_health() -> dict[str, list[int]]:
    """Beat entry "fleet-node-health": mark silent nodes lost (requeueing their tasks), finish drains.
    Safe to run twice or concurrently: every change is a compare-and-set."""
    return {"lost": nodes_mark_lost(), "drained": drains_complete()}
