"""Priority overrides: a member asks, a platform admin decides, the raise lapses; every step is audited.
The expiry job runs through Celery on the real Redis broker with a real worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from apps.approvals.models import PriorityOverride
from apps.approvals.services import override_approve, override_request, overrides_expire
from apps.workloads.models import Queue, Task
from apps.workloads.services import task_cancel


def _request(world, **kw):
    return override_request(
        tenant=world.tenant_a, task=world.task_a, wanted_priority=40, reason="paper deadline",
        requested_by=world.alice, **kw,
    )  # fmt: skip


def test_approval_raises_the_priority_and_expiry_restores_it(world, api) -> None:
    body = {"task": world.task_a.pk, "wanted_priority": 40, "reason": "paper deadline"}
    override = api(world.alice).post("/api/v1/overrides/", body, format="json").json()
    decided = api(world.root).post(
        f"/api/v1/overrides/{override['id']}/approve/", {"comment": "go"}, format="json"
    )
    assert decided.status_code == 200
    assert decided.json()["state"] == "approved" and decided.json()["decided_by"] == "root"
    assert Task.objects.get(pk=world.task_a.pk).priority == 40
    assert overrides_expire(now=timezone.now() + timedelta(days=2)) == 1
    assert Task.objects.get(pk=world.task_a.pk).priority == 5
    audit = api(world.alice).get(f"/api/v1/overrides/{override['id']}/").json()["audit"]
    assert [(a["action"], a["actor"]) for a in audit] == [
        ("requested", "user:alice"),
        ("approved", "user:root"),
        ("expired", "system:overrides_expire"),
    ]


def test_a_rejection_needs_a_comment_and_changes_nothing(world, api) -> None:
    override = _request(world)
    client = api(world.root)
    silent = client.post(f"/api/v1/overrides/{override.pk}/reject/", {}, format="json")
    assert silent.status_code == 400 and "comment" in silent.json()
    rejected = client.post(
        f"/api/v1/overrides/{override.pk}/reject/", {"comment": "use the batch queue"}, format="json"
    )
    assert rejected.json()["state"] == "rejected" and rejected.json()["comment"] == "use the batch queue"
    assert Task.objects.get(pk=world.task_a.pk).priority == 5
    again = client.post(f"/api/v1/overrides/{override.pk}/approve/", {}, format="json")
    assert again.status_code == 409 and "not pending" in again.json()["detail"]


def test_a_queue_override_raises_the_queue_default(world, api) -> None:
    body = {"queue": world.queue_a.pk, "wanted_priority": 30, "reason": "launch week"}
    response = api(world.alice).post("/api/v1/overrides/", body, format="json")
    api(world.root).post(f"/api/v1/overrides/{response.json()['id']}/approve/", {}, format="json")
    assert Queue.objects.get(pk=world.queue_a.pk).default_priority == 30


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"wanted_priority": 1, "reason": "x"}, "wanted_priority", "must be above the current priority 5"),
        ({"wanted_priority": 9, "reason": "  "}, "reason", "may not be blank"),
        ({"wanted_priority": 9, "reason": "x", "queue": 1}, "task", "exactly one target"),
    ],
    ids=["not a raise", "no reason", "two targets"],
)
def test_a_bad_override_request_is_refused_on_its_field(world, api, body, field, words) -> None:
    response = api(world.alice).post("/api/v1/overrides/", {"task": world.task_a.pk, **body}, format="json")
    assert response.status_code == 400 and words in " ".join(response.json()[field])


def test_an_undecided_request_lapses_and_cannot_be_approved_after(world) -> None:
    override = _request(world, ttl_hours=1)
    later = timezone.now() + timedelta(hours=2)
    assert overrides_expire(now=later) == 1
    assert overrides_expire(now=later) == 0  # idempotent
    assert PriorityOverride.objects.get(pk=override.pk).state == "expired"


@pytest.mark.django_db(transaction=True)
def test_the_beat_task_expires_overrides_through_redis_and_a_real_worker(world) -> None:
    from celery.contrib.testing.worker import start_worker

    from apps.approvals.tasks import overrides_expire as expire_task
    from whalegen.config.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis://"), "run with REDIS_URL set: this test needs Redis"
    assert not app.conf.task_always_eager
    approved = _request(world)
    override_approve(override=approved, by=world.root)
    PriorityOverride.objects.filter(pk=approved.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        result = expire_task.delay()
        assert result.get(timeout=30) == 1
    assert PriorityOverride.objects.get(pk=approved.pk).state == "expired"
    assert Task.objects.get(pk=world.task_a.pk).priority == 5


def test_stacked_overrides_expiring_in_either_order_give_back_the_original_priority(world) -> None:
    """Two approved raises on one task (5 → 40, then 40 → 60). The first expires while the second is in
    force (60 stands), then the second expires: the task must end at 5, the priority no raise gave it,
    not at 40 (what the second saw before it, a raise that has since lapsed)."""
    first = _request(world, ttl_hours=1)
    override_approve(override=first, by=world.root)
    second = override_request(
        tenant=world.tenant_a, task=Task.objects.get(pk=world.task_a.pk), wanted_priority=60,
        reason="still late", requested_by=world.alice, ttl_hours=3,
    )  # fmt: skip
    override_approve(override=second, by=world.root)
    assert Task.objects.get(pk=world.task_a.pk).priority == 60
    assert overrides_expire(now=timezone.now() + timedelta(hours=2)) == 1  # the first lapses
    assert Task.objects.get(pk=world.task_a.pk).priority == 60  # the newer raise stands
    assert overrides_expire(now=timezone.now() + timedelta(hours=4)) == 1  # then the second
    assert Task.objects.get(pk=world.task_a.pk).priority == 5


def test_an_override_whose_task_finished_meanwhile_cannot_be_approved(world, api) -> None:
    override = _request(world)
    task_cancel(task=Task.objects.get(pk=world.task_a.pk), by=world.alice)
    response = api(world.root).post(f"/api/v1/overrides/{override.pk}/approve/", {}, format="json")
    assert response.status_code == 409, response.json()
    assert "cancelled" in response.json()["detail"]
    assert PriorityOverride.objects.get(pk=override.pk).state == "pending"
    assert Task.objects.get(pk=world.task_a.pk).priority == 5
    # Rejecting it is still possible (it tidies the request away).
    rejected = api(world.root).post(
        f"/api/v1/overrides/{override.pk}/reject/", {"comment": "the task is gone"}, format="json"
    )
    assert rejected.status_code == 200
