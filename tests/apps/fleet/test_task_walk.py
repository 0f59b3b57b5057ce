"""One task's walk from the API to its end (docs/architecture.md, "One task's walk"): submit, admission
and cycle, agent fetch, run report, end report, accounting. Profiled, it shows every call from apps/ into
whalegen/; the pure core never calls back into apps/ on the way (ARCHITECTURE §1: it takes data and
returns data). Run with -s to see the call sites of each step."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.apps.fleet.test_agent_api import DESIRED, report, task_report
from whalegen import protocol as p

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db


def _tree(filename: str) -> str | None:
    """'apps' or 'whalegen' (its Django wiring in whalegen/config aside) for a file of this checkout."""
    try:
        parts = Path(filename).resolve().relative_to(ROOT).parts
    except ValueError:
        return None
    if parts[0] == "apps" or (parts[0] == "whalegen" and parts[1:2] != ("config",)):
        return parts[0]
    return None


def _where(code: Any) -> str:
    return f"{Path(code.co_filename).resolve().relative_to(ROOT)}:{code.co_name}"


class _Crossings:
    """Per step: (caller, callee) → calls, for each call from a function in one tree into the other."""

    def __init__(self) -> None:
        self.step = ""
        self.sites: dict[str, dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        caller, callee = frame.f_back.f_code, frame.f_code
        into, out_of = _tree(callee.co_filename), _tree(caller.co_filename)
        if into and out_of and into != out_of:
            self.sites[self.step][(_where(caller), _where(callee))] += 1

    def run(self, step: str, call: Callable[[], Any]) -> Any:
        self.step = step
        sys.setprofile(self)
        try:
            return call()
        finally:
            sys.setprofile(None)


def test_one_tasks_walk_calls_into_the_core_and_never_back(fleet: Any, agent_client: Any, api: Any) -> None:
    from apps.scheduling.services import cycle_run
    from apps.workloads.models import Task

    # Only the walked task is pending, so the cycle places it on node A's whole GPU.
    Task.objects.filter(state=Task.State.PENDING).update(state=Task.State.CANCELLED)
    seen = _Crossings()
    body = {"tenant": fleet.tenant_a.slug, "queue": "train", "command": ["python", "train.py"]}
    answer = seen.run("1 submit", lambda: api(fleet.alice).post("/api/v1/tasks/", body, format="json"))
    assert answer.status_code == 201, answer.content
    task = Task.objects.get(pk=answer.json()["id"])
    seen.run("2 admission and cycle", lambda: cycle_run(pool_id=fleet.h100.pk))
    task.refresh_from_db()
    assert task.state == Task.State.ASSIGNED and task.assignments.get().node_id == fleet.node.pk
    client = agent_client(fleet.token_a)
    fetched = seen.run("3 agent fetch", lambda: client.get(DESIRED, {"generation": 0, "wait_s": 0}))
    assert str(task.pk) in {t.task_id for t in p.DesiredState.from_dict(fetched.json()).tasks}
    running = task_report(task, p.TaskState.RUNNING, pid=7)
    seen.run("4 run report", lambda: report(client, fleet.node, 1, running))
    ended = task_report(task, p.TaskState.SUCCEEDED, exit_code=0)
    seen.run("5 end report", lambda: report(client, fleet.node, 2, ended))
    task.refresh_from_db()
    assert task.state == Task.State.SUCCEEDED
    accounting = api(fleet.root)
    usage = seen.run("6 accounting", lambda: accounting.get("/api/v1/accounting/", {"group_by": "tenant"}))
    assert usage.status_code == 200

    for step, sites in seen.sites.items():
        print(f"{step}: {len(sites)} call sites, {sum(sites.values())} calls")
        for (caller, callee), calls in sorted(sites.items()):
            print(f"    {caller} -> {callee} x{calls}")
    # The "about twelve" counted by hand at module level: distinct apps/ module -> whalegen/ module.
    modules = {(c.split(":")[0], e.split(":")[0]) for sites in seen.sites.values() for c, e in sites}
    print(f"module edges: {len(modules)}")
    for caller, callee in sorted(modules):
        print(f"    {caller} -> {callee}")
    back = [site for sites in seen.sites.values() for site in sites if site[0].startswith("whalegen/")]
    assert back == []
    assert seen.sites["2 admission and cycle"]  # the walk did reach the core (decide)
