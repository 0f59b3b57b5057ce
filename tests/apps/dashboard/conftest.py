"""A world the dashboard can show: the shared personas (tests/conftest.py), one real scheduling cycle
over the H100 pool, and a task of A that cannot fit and so waits with the solver's reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class Scene:
    world: Any
    placed: Any  # A's task the cycle placed on the whole H100
    waiting: Any  # A's two-GPU task: the node has one whole GPU, so it waits
    cycle: Any


@pytest.fixture
def scene(world: Any) -> Scene:
    from apps.scheduling.models import Cycle
    from apps.scheduling.services import cycle_run
    from apps.workloads.services import TaskRequest, task_submit

    waiting, _ = task_submit(
        tenant=world.tenant_a,
        request=TaskRequest(queue="train", name="big-run", gpu_count=2),
        submitted_by=world.alice,
    )
    report = cycle_run(pool_id=world.h100.pk)
    for task in (world.task_a, world.task_b, waiting):
        task.refresh_from_db()
    world.quota_a.refresh_from_db()
    return Scene(
        world=world, placed=world.task_a, waiting=waiting, cycle=Cycle.objects.get(pk=report.cycle_id)
    )


@pytest.fixture
def page():
    """`page(user)` → a Django test client with `user` logged in (None: anonymous)."""
    from django.test import Client

    def make(user: Any = None) -> Client:
        client = Client()
        if user is not None:
            client.force_login(user)
        return client

    return make
