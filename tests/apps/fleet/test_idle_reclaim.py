"""Idle reclaim on real PostgreSQL (docs/idle-reclaim.md): running tasks whose GPUs stayed
near 0 % SM for the window are flagged once, told in their events, and — where the queue says `preempt`
— preempted for pending work that could use the GPU; online-SLA tasks go to a platform admin first.

The world here: one pool of two whole H100s on one node; the task under test runs on GPU 0 and has for
an hour; telemetry arrives every 30 s (WHALEGEN_TELEMETRY_SAMPLE_S).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.factories import GpuSampleFactory, QueueFactory, TaskFactory, UserFactory
from tests.apps.fleet.conftest import assign

WINDOW_S = 1800.0
SAMPLE_S = 30.0


@dataclass
class Pool:
    pool: Any
    node: Any
    gpus: list[Any]
    now: datetime


@pytest.fixture
def pool(db: None) -> Pool:
    from apps.inventory.services import gpu_add
    from tests.apps.factories import NodeFactory

    node = NodeFactory()
    gpus = [gpu_add(node=node, index=i, model="H100-80GB") for i in range(2)]
    return Pool(pool=node.pool, node=node, gpus=gpus, now=timezone.now())


def config() -> Any:
    from apps.fleet.idle import IdleConfig

    return IdleConfig(after_s=WINDOW_S, util_pct=5, sample_s=SAMPLE_S)


def running(world: Pool, *, gpu: int = 0, policy: str = "notify", **fields: Any) -> Any:
    """A task of its own queue (with `policy`) running on GPU `gpu` for the last hour."""
    from apps.workloads.models import Task
    from apps.workloads.services import task_transition

    queue = QueueFactory(pool=world.pool, idle_reclaim=policy)
    task = TaskFactory(queue=queue, **fields)
    assign(task, world.node, world.gpus[gpu].units.all())
    task = task_transition(task=task, to_state=Task.State.RUNNING, actor="agent:n", reason="started")
    Task.objects.filter(pk=task.pk).update(started_at=world.now - timedelta(hours=1))
    task.refresh_from_db()
    return task


def telemetry(
    world: Pool, *, gpu: int = 0, util_pct: int | None = 0, minutes: float = 40, busy_at: float = -1
) -> None:
    """Samples of GPU `gpu` every 30 s over the last `minutes`; the one `busy_at` minutes ago at 60 %."""
    from apps.fleet.models import GpuSample

    samples = []
    for k in range(int(minutes * 60 / SAMPLE_S) + 1):
        at = world.now - timedelta(seconds=k * SAMPLE_S)
        busy = busy_at >= 0 and abs(k * SAMPLE_S - busy_at * 60) < SAMPLE_S / 2
        samples.append(GpuSample(gpu=world.gpus[gpu], at=at, util_gpu_pct=60 if busy else util_pct))
    GpuSample.objects.bulk_create(samples)


def pending_work(world: Pool, **fields: Any) -> Any:
    """A pending task the last cycle could not place for lack of capacity."""
    return TaskFactory(queue=QueueFactory(pool=world.pool), **{"why_pending_code": "no_capacity", **fields})


def check(world: Pool, *, later_s: float = 0.0) -> Any:
    from apps.fleet.idle import idle_check_pool

    return idle_check_pool(pool_id=world.pool.pk, now=world.now + timedelta(seconds=later_s), config=config())


def idle_events(task: Any) -> list[str]:
    return [e.reason for e in task.events.filter(actor="system:idle_check").order_by("id")]


def test_a_task_idle_for_the_whole_window_is_flagged_once_with_one_event(pool: Pool) -> None:
    task = running(pool)
    telemetry(pool)
    first = check(pool)
    again = check(pool, later_s=60)
    task.refresh_from_db()
    assert first.flagged == [task.pk] and again.flagged == []
    assert task.idle_flagged_at == pool.now
    [event] = idle_events(task)
    assert event.startswith("flagged idle: every GPU it holds stayed below 5% SM utilisation for 30 min")
    assert "keeps its GPUs (queue policy notify)" in event


@pytest.mark.parametrize(
    ("minutes", "busy_at", "util_pct"),
    [(20, -1, 0), (40, 10, 0), (40, -1, None)],
    ids=["idle for less than the window", "one busy sample inside the window", "no utilisation figure (MIG)"],
)
def test_a_task_is_not_flagged_without_a_whole_idle_window(
    pool: Pool, minutes: float, busy_at: float, util_pct: int | None
) -> None:
    task = running(pool)
    telemetry(pool, minutes=minutes, busy_at=busy_at, util_pct=util_pct)
    assert check(pool).flagged == []
    task.refresh_from_db()
    assert task.idle_flagged_at is None and idle_events(task) == []


def test_a_flagged_task_whose_gpu_gets_busy_is_unflagged_and_told(pool: Pool) -> None:
    task = running(pool)
    telemetry(pool)
    check(pool)
    GpuSampleFactory(gpu=pool.gpus[0], at=pool.now + timedelta(seconds=30), util_gpu_pct=80)
    assert check(pool, later_s=30).cleared == [task.pk]
    task.refresh_from_db()
    assert task.idle_flagged_at is None
    assert idle_events(task)[-1] == "no longer idle: its GPUs are busy again"


def test_a_flagged_task_whose_telemetry_stops_keeps_its_flag_and_is_not_called_busy(pool: Pool) -> None:
    # The demo restarted: its agents sent nothing for a while, and the check said "no longer idle: its
    # GPUs are busy again" of a task at 0 % throughout, then flagged it again. No samples is no verdict.
    task = running(pool)
    telemetry(pool)
    check(pool)
    quiet = check(pool, later_s=300)  # five minutes without a sample: the window's end is not covered
    assert quiet.cleared == [] and quiet.flagged == []
    GpuSampleFactory(gpu=pool.gpus[0], at=pool.now + timedelta(seconds=310), util_gpu_pct=0)
    back = check(pool, later_s=320)  # samples again, still idle: nothing to say
    assert back.cleared == [] and back.flagged == []
    task.refresh_from_db()
    assert task.idle_flagged_at == pool.now
    assert len(idle_events(task)) == 1 and idle_events(task)[0].startswith("flagged idle")


def test_a_queue_with_reclaim_off_is_not_watched(pool: Pool) -> None:
    task = running(pool, policy="off")
    telemetry(pool)
    assert check(pool).flagged == []
    assert idle_events(task) == []


def test_notify_flags_but_never_preempts_even_with_work_pending(pool: Pool) -> None:
    task = running(pool, policy="notify")
    telemetry(pool)
    pending_work(pool)
    result = check(pool)
    task.refresh_from_db()
    assert result.preempted == [] and task.state == "running"


def test_preempt_requeues_an_idle_preemptible_task_for_pending_work_that_fits(pool: Pool) -> None:
    task = running(pool, policy="preempt")
    telemetry(pool)
    waiting = pending_work(pool)
    assert check(pool).preempted == [task.pk]
    task.refresh_from_db()
    assert (task.state, task.attempts, task.idle_flagged_at) == ("pending", 1, None)
    moves = list(task.events.filter(to_state="preempted").values_list("reason", flat=True))
    assert moves == [
        "reclaimed while idle (every GPU it holds stayed below 5% SM utilisation for 30 min): "
        f"pending task {waiting.pk} could use its GPUs"
    ]
    # Requeued, it no longer holds its GPU: the next check finds nothing to flag or reclaim.
    again = check(pool, later_s=60)
    assert (again.flagged, again.preempted) == ([], [])


@pytest.mark.parametrize(
    "waiting",
    [None, {"gpu_count": 2}, {"allowed_gpu_models": ["L4"]}, {"why_pending_code": "quota_exceeded"}],
    ids=[
        "nothing pending",
        "pending work larger than its GPUs",
        "pending work for another GPU model",
        "pending work held back by its quota, not capacity",
    ],
)
def test_preempt_keeps_the_task_when_no_pending_work_could_use_its_gpu(pool: Pool, waiting: Any) -> None:
    task = running(pool, policy="preempt")
    telemetry(pool)
    if waiting is not None:
        pending_work(pool, **waiting)
    result = check(pool)
    task.refresh_from_db()
    assert task.state == "running" and result.kept[task.pk] == "no pending work could use its GPUs"


def test_a_non_preemptible_task_is_never_preempted(pool: Pool) -> None:
    task = running(pool, policy="preempt", preemptible=False)
    telemetry(pool)
    pending_work(pool)
    result = check(pool)
    task.refresh_from_db()
    assert task.state == "running" and result.kept[task.pk] == "not preemptible"
    assert "it is not preemptible" in idle_events(task)[0]


def test_each_pending_task_frees_one_idle_task_the_longest_flagged_first(pool: Pool) -> None:
    first = running(pool, gpu=0, policy="preempt")
    second = running(pool, gpu=1, policy="preempt")
    telemetry(pool, gpu=0)
    telemetry(pool, gpu=1)
    pending_work(pool)
    assert check(pool).preempted == [first.pk]
    second.refresh_from_db()
    assert second.state == "running"


@pytest.fixture
def online(pool: Pool) -> Any:
    """An idle online-SLA task in a preempting queue, with work pending: the check asks an admin."""
    task = running(pool, policy="preempt", sla_class="online")
    telemetry(pool)
    pending_work(pool)
    result = check(pool)
    assert result.requested == [task.pk] and result.preempted == []
    return task


def test_an_idle_online_task_goes_to_an_admin_once_and_keeps_running(pool: Pool, online: Any) -> None:
    from apps.approvals.models import ReclaimRequest

    assert check(pool, later_s=60).requested == []
    online.refresh_from_db()
    assert online.state == "running"
    [request] = ReclaimRequest.objects.filter(task=online)
    assert (request.state, request.attempt) == ("pending", 0)
    assert idle_events(online)[-1].startswith(f"reclaim request {request.pk} raised: online SLA")


def test_an_approved_reclaim_preempts_the_online_task(pool: Pool, online: Any) -> None:
    from apps.approvals.models import ReclaimRequest
    from apps.approvals.services import reclaim_approve

    admin = UserFactory(username="root", is_staff=True)
    request = reclaim_approve(request=ReclaimRequest.objects.get(task=online), by=admin, comment="ok")
    online.refresh_from_db()
    assert (request.state, request.decided_by, online.state, online.attempts) == (
        "approved",
        admin,
        "pending",
        1,
    )
    [preempted] = online.events.filter(to_state="preempted").values_list("reason", flat=True)
    assert preempted == f"reclaimed while idle: reclaim request {request.pk} approved by user:root: ok"


def test_a_rejected_reclaim_keeps_the_task_and_is_not_asked_again(pool: Pool, online: Any) -> None:
    from apps.approvals.models import ReclaimRequest
    from apps.approvals.services import reclaim_approve, reclaim_reject
    from apps.common.errors import Conflict

    admin = UserFactory(username="root", is_staff=True)
    request = ReclaimRequest.objects.get(task=online)
    reclaim_reject(request=request, by=admin, comment="demo for the board at 3 pm")
    again = check(pool, later_s=60)
    online.refresh_from_db()
    assert online.state == "running" and again.requested == [] and again.preempted == []
    assert again.kept[online.pk] == "a reclaim request for this run exists"
    assert (
        idle_events(online)[-1]
        == f"reclaim request {request.pk} rejected by user:root: demo for the board at 3 pm"
    )
    with pytest.raises(Conflict, match="is rejected, not pending"):
        reclaim_approve(request=request, by=admin)


def test_a_pending_request_is_withdrawn_when_the_task_gets_busy(pool: Pool, online: Any) -> None:
    from apps.approvals.models import ReclaimRequest

    GpuSampleFactory(gpu=pool.gpus[0], at=pool.now + timedelta(seconds=30), util_gpu_pct=90)
    check(pool, later_s=30)
    assert ReclaimRequest.objects.get(task=online).state == "withdrawn"


def test_the_beat_task_checks_every_pool_by_id(pool: Pool) -> None:
    from apps.fleet.tasks import idle_check
    from apps.workloads.models import Task

    task = running(pool)
    telemetry(pool, minutes=40)
    # The Celery task reads the clock itself: the samples above end at `pool.now`, moments ago.
    result = idle_check.apply(args=[pool.pool.pk]).get()
    assert result["flagged"] == [task.pk]
    assert Task.objects.get(pk=task.pk).idle_flagged_at is not None


def test_the_task_api_and_page_show_the_flag_and_metrics_count_the_idle_task(
    pool: Pool, settings: Any
) -> None:
    from django.test import Client
    from rest_framework.test import APIClient

    from tests.apps.metrics.test_metrics_endpoint import scrape, value

    task = running(pool)
    other = running(pool, gpu=1)
    telemetry(pool)
    check(pool)
    client = APIClient()
    client.force_authenticate(UserFactory(username="root", is_staff=True))
    shown = client.get(f"/api/v1/tasks/{task.pk}/").json()
    assert shown["idle_flagged_at"] is not None
    assert client.get(f"/api/v1/tasks/{other.pk}/").json()["idle_flagged_at"] is None
    browser = Client()
    browser.force_login(UserFactory(username="root", is_staff=True))
    assert 'id="task-idle"' in browser.get(f"/tasks/{task.pk}/").content.decode()
    assert 'id="task-idle"' not in browser.get(f"/tasks/{other.pk}/").content.decode()
    settings.WHALEGEN_METRICS_TOKEN = "scrape-secret-0123456789"
    samples = scrape(Client(), authorization="Bearer scrape-secret-0123456789")
    assert value(samples, "whalegen_tasks_idle", pool=pool.pool.name) == 1


def test_a_queue_takes_a_reclaim_policy_and_refuses_an_unknown_one(pool: Pool) -> None:
    from rest_framework.test import APIClient

    from tests.apps.factories import TenantFactory

    client = APIClient()
    client.force_authenticate(UserFactory(username="root", is_staff=True))
    tenant = TenantFactory()
    made = client.post(
        "/api/v1/queues/",
        {"tenant": tenant.slug, "pool": pool.pool.name, "name": "notebooks", "idle_reclaim": "preempt"},
        format="json",
    )
    assert made.status_code == 201 and made.json()["idle_reclaim"] == "preempt"
    refused = client.patch(
        f"/api/v1/queues/{made.json()['id']}/", {"idle_reclaim": "sometimes"}, format="json"
    )
    assert refused.status_code == 400 and "idle_reclaim" in refused.json()


def test_only_a_platform_admin_decides_a_reclaim_request_through_the_api(pool: Pool, online: Any) -> None:
    from rest_framework.test import APIClient

    from apps.tenants.models import Membership
    from tests.apps.factories import MembershipFactory

    member = MembershipFactory(tenant=online.tenant, role=Membership.Role.ADMIN).user
    outsider = UserFactory()
    as_member, as_outsider, as_root = APIClient(), APIClient(), APIClient()
    as_member.force_authenticate(member)
    as_outsider.force_authenticate(outsider)
    as_root.force_authenticate(UserFactory(username="root", is_staff=True))
    [listed] = as_member.get("/api/v1/reclaims/").json()["results"]
    assert (listed["task"], listed["state"], listed["tenant"]) == (online.pk, "pending", online.tenant.slug)
    assert as_outsider.get("/api/v1/reclaims/").json()["results"] == []
    assert as_member.post(f"/api/v1/reclaims/{listed['id']}/approve/", {}, format="json").status_code == 403
    rejected = as_root.post(f"/api/v1/reclaims/{listed['id']}/reject/", {}, format="json")
    assert rejected.status_code == 400  # a rejection needs its comment
    approved = as_root.post(f"/api/v1/reclaims/{listed['id']}/approve/", {"comment": "ok"}, format="json")
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    online.refresh_from_db()
    assert online.state == "pending"
