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
    from apps.workloads.services import TaskSubmission, task_submit

    waiting, _ = task_submit(
        tenant=world.tenant_a,
        request=TaskSubmission(queue="train", name="big-run", gpu_count=2),
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


@pytest.fixture(autouse=True)
def _fresh_dashboard_figures() -> Any:
    """Per-cycle figures live in Redis, keyed by pool and cycle ids and the cycle's start: clear them
    around every test, so a test never reads another's."""
    from apps.dashboard.caching import clear

    clear()
    yield
    clear()


@dataclass
class WhatIfJobs:
    """The what-if decisions the pages started, held instead of sent to a worker; `run()` does them here
    as the worker would (`decide_cycle`, by ids), inside the test's transaction."""

    started: list[tuple[int, tuple[str, ...], int]]

    def run(self) -> int:
        from apps.dashboard.whatif import decide_cycle

        done = len(self.started)
        for pool_id, policies, cycle_id in self.started:
            decide_cycle(pool_id=pool_id, policies=policies, cycle_id=cycle_id)
        self.started.clear()
        return done


@pytest.fixture
def whatif_jobs(monkeypatch: Any) -> WhatIfJobs:
    from apps.dashboard import whatif

    jobs = WhatIfJobs(started=[])
    monkeypatch.setattr(
        whatif, "_start", lambda pool_id, policies, cycle: jobs.started.append((pool_id, policies, cycle.id))
    )
    return jobs
