"""Every dashboard page through Django's test client, as each persona sees it: alice (member of A),
bob (member of B), eve (signed in, in no tenant), root (platform admin), vic (viewer in A), anonymous.

Another tenant's object answers 404 (never 403), as in the API; forms answer 400 with their messages
and keep what was typed; actions change state exactly once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.approvals.models import OverrideAuditEntry, PriorityOverride
from apps.approvals.services import override_request
from apps.dashboard.templatetags.dashboard import gpus
from apps.workloads.models import Task, TaskEvent, TaskWait
from tests.apps.factories import held_milli

pytestmark = pytest.mark.django_db


def text(response: Any) -> str:
    return response.content.decode()


# -- anonymous ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/", "/tasks/", "/tasks/1/", "/overrides/", "/pools/", "/pools/1/"],
    ids=lambda p: f"anonymous is sent to the login page from {p}",
)
def test_anonymous_is_redirected_to_login(page: Any, path: str) -> None:
    response = page().get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_anonymous_posts_change_nothing(scene: Any, page: Any) -> None:
    waiting = scene.waiting
    response = page().post(f"/tasks/{waiting.pk}/cancel/")
    assert response.status_code == 302
    waiting.refresh_from_db()
    assert waiting.state == Task.State.PENDING


def test_login_with_a_password_lands_on_the_overview(world: Any, page: Any) -> None:
    world.alice.set_password("s3cret-pass")
    world.alice.save()
    client = page()
    wrong = client.post("/login/", {"username": "alice", "password": "nope"})
    assert wrong.status_code == 200
    assert "correct username and password" in text(wrong)
    right = client.post("/login/", {"username": "alice", "password": "s3cret-pass"})
    assert right.status_code == 302 and right["Location"] == "/"
    assert "Vision" in text(client.get("/"))
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


# -- overview -----------------------------------------------------------------------------------------


def test_member_sees_own_quotas_and_queues_only(scene: Any, page: Any) -> None:
    w = scene.world
    body = text(page(w.alice).get("/"))
    assert "Vision" in body and "Speech" not in body
    # A's H100 quota: 4 guaranteed + 2 borrowable; the cycle placed one whole GPU of A.
    assert 'data-pool="h100-train"' in body and 'data-pool="l4-infer"' in body
    assert 'aria-label="1 of 4 guaranteed GPUs in use, 0 borrowed"' in body
    # The queue row: one pending (the two-GPU task), one placed.
    assert f'/tasks/?queue={w.queue_a.pk}&amp;state=pending">1</a>' in body

    body_b = text(page(w.bob).get("/"))
    assert "Speech" in body_b and "Vision" not in body_b
    assert 'data-pool="l4-infer"' not in body_b


def test_borrowed_capacity_is_drawn_apart(scene: Any, page: Any) -> None:
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Quota

    # Above the guarantee: with none guaranteed, the placed whole GPU is all borrowed.
    Quota.objects.filter(pk=scene.world.quota_a.pk).update(guaranteed_milli=0)
    Assignment.objects.filter(task=scene.placed, released_at__isnull=True).update(borrowed=True)
    body = text(page(scene.world.alice).get("/"))
    row = body[body.index('data-pool="h100-train"') : body.index('data-pool="l4-infer"')]
    assert 'aria-label="1 of 0 guaranteed GPUs in use, 1 borrowed"' in row
    assert '<div class="within" style="width: 0.0%"></div><div class="borrowed" style="width: 33.33%">' in row


def test_reclaimable_is_what_was_admitted_as_borrowed_while_above_the_guarantee(
    scene: Any, page: Any
) -> None:
    from apps.scheduling.models import Assignment
    from apps.workloads.models import Quota

    Assignment.objects.filter(task=scene.placed, released_at__isnull=True).update(borrowed=True)
    body = text(page(scene.world.alice).get("/"))
    row = body[body.index('data-pool="h100-train"') : body.index('data-pool="l4-infer"')]
    # Admitted as borrowed but inside the guarantee now (1 of 4): the scheduler will not reclaim it.
    assert 'aria-label="1 of 4 guaranteed GPUs in use, 0 borrowed"' in row
    assert row.count('<td class="num">1</td>') == 0
    # Above a lowered guarantee it is reclaimable again.
    Quota.objects.filter(pk=scene.world.quota_a.pk).update(guaranteed_milli=500)
    body = text(page(scene.world.alice).get("/"))
    row = body[body.index('data-pool="h100-train"') : body.index('data-pool="l4-infer"')]
    assert 'aria-label="1 of 0.5 guaranteed GPUs in use, 0.5 borrowed"' in row
    assert row.count('<td class="num">1</td>') == 1  # the reclaimable column


def test_outsider_sees_an_empty_state(scene: Any, page: Any) -> None:
    body = text(page(scene.world.eve).get("/"))
    assert "You are not in any tenant yet" in body
    assert "Vision" not in body and "Speech" not in body


def test_platform_admin_sees_every_tenant(scene: Any, page: Any) -> None:
    body = text(page(scene.world.root).get("/"))
    assert "Vision" in body and "Speech" in body


# -- tasks --------------------------------------------------------------------------------------------


def test_task_list_shows_why_pending_and_only_own_tasks(scene: Any, page: Any) -> None:
    w = scene.world
    eta = timezone.now() + timedelta(minutes=30)
    TaskWait.objects.update_or_create(task_id=scene.waiting.pk, defaults={"start_at": eta})
    body = text(page(w.alice).get("/tasks/"))
    assert f'data-task="{scene.waiting.pk}"' in body and f'data-task="{scene.placed.pk}"' in body
    assert f'data-task="{w.task_b.pk}"' not in body
    assert scene.waiting.why_pending and scene.waiting.why_pending in body
    assert eta.strftime("%Y-%m-%d %H:%M") in body

    assert f'data-task="{scene.waiting.pk}"' not in text(page(w.bob).get("/tasks/"))
    assert "No tasks" in text(page(w.eve).get("/tasks/"))


def test_task_list_filters_by_state_and_queue(scene: Any, page: Any) -> None:
    w = scene.world
    client = page(w.alice)
    pending = text(client.get("/tasks/", {"state": "pending"}))
    assert f'data-task="{scene.waiting.pk}"' in pending and f'data-task="{scene.placed.pk}"' not in pending
    other_queue = text(client.get("/tasks/", {"queue": w.queue_a_l4.pk}))
    assert "data-task=" not in other_queue


@pytest.mark.parametrize(
    ("query", "message"),
    [({"state": "sleeping"}, "Select a valid choice"), ({"queue": "other"}, "unknown queue")],
    ids=["an unknown state is a 400", "another tenant's queue is a 400"],
)
def test_task_list_rejects_bad_filters(scene: Any, page: Any, query: dict, message: str) -> None:
    if query.get("queue") == "other":
        query = {"queue": scene.world.queue_b.pk}
    response = page(scene.world.alice).get("/tasks/", query)
    assert response.status_code == 400
    assert message in text(response)
    assert "data-task=" not in text(response)


def test_task_detail_shows_events_and_forecast(scene: Any, page: Any) -> None:
    from apps.forecasting.models import TaskForecast

    TaskForecast.objects.create(
        task=scene.waiting, duration_p50_s=3600, duration_p90_s=7500, source="baseline", baseline="median"
    )
    body = text(page(scene.world.alice).get(f"/tasks/{scene.waiting.pk}/"))
    assert 'id="why-pending"' in body and scene.waiting.why_pending in body
    assert "1 h" in body and "2 h 5 min" in body  # P50 and P90
    assert "user:alice" in body  # the submit event's actor
    assert 'id="cancel-task"' in body
    assert ">requeues</dt><dd>0</dd>" in body  # the CLI's word; "attempts 0" read as "never ran"


def test_task_detail_says_what_each_gpu_share_is_as_the_task_list_does(scene: Any, page: Any) -> None:
    # The page said "GPUs 2 × 1" and the list "2 × 1 GPU": a share reads "1 × 0.25 GPU" on both.
    task = scene.waiting
    body = text(page(scene.world.alice).get(f"/tasks/{task.pk}/"))
    share = f"{task.gpu_count} × {gpus(task.gpu_milli)} GPU"
    assert f'<dd id="task-gpus">{share}' in body
    assert share in text(page(scene.world.alice).get("/tasks/"))


def test_task_detail_shows_the_working_directory_only_when_there_is_one(scene: Any, page: Any) -> None:
    url = f"/tasks/{scene.waiting.pk}/"
    assert 'id="task-working-dir"' not in text(page(scene.world.alice).get(url))
    scene.waiting.working_dir = "/data/vision/exp-3"
    scene.waiting.save(update_fields=["working_dir"])
    body = text(page(scene.world.alice).get(url))
    assert '<code id="task-working-dir">/data/vision/exp-3</code>' in body


@pytest.mark.parametrize("persona", ["bob", "eve"], ids=["another tenant's member", "an outsider"])
def test_task_detail_of_another_tenant_is_404(scene: Any, page: Any, persona: str) -> None:
    user = getattr(scene.world, persona)
    assert page(user).get(f"/tasks/{scene.waiting.pk}/").status_code == 404
    assert page(user).post(f"/tasks/{scene.waiting.pk}/cancel/").status_code == 404
    scene.waiting.refresh_from_db()
    assert scene.waiting.state == Task.State.PENDING


def test_platform_admin_opens_any_task(scene: Any, page: Any) -> None:
    assert page(scene.world.root).get(f"/tasks/{scene.world.task_b.pk}/").status_code == 200


# -- cancel -------------------------------------------------------------------------------------------


def test_cancel_changes_state_exactly_once(scene: Any, page: Any) -> None:
    client = page(scene.world.alice)
    url = f"/tasks/{scene.waiting.pk}/cancel/"
    first = client.post(url, {"reason": "superseded"}, follow=True)
    assert first.status_code == 200
    assert f"Task {scene.waiting.pk} cancelled." in text(first)
    scene.waiting.refresh_from_db()
    assert scene.waiting.state == Task.State.CANCELLED

    second = client.post(url, {"reason": "again"})
    assert second.status_code == 409
    assert "a cancelled task cannot become cancelled" in text(second)
    events = TaskEvent.objects.filter(task=scene.waiting, to_state=Task.State.CANCELLED)
    assert [(e.actor, e.reason) for e in events] == [("user:alice", "superseded")]
    assert held_milli(scene.world.quota_a) == 1000  # the placed task's; the waiting one held nothing


def test_viewer_cannot_cancel(scene: Any, page: Any) -> None:
    client = page(scene.world.vic)
    assert 'id="cancel-task"' not in text(client.get(f"/tasks/{scene.waiting.pk}/"))
    response = client.post(f"/tasks/{scene.waiting.pk}/cancel/")
    assert response.status_code == 403
    assert "needs the member role; you have viewer" in text(response)
    scene.waiting.refresh_from_db()
    assert scene.waiting.state == Task.State.PENDING


def test_cancel_needs_post_and_csrf(scene: Any, page: Any) -> None:
    from django.test import Client

    url = f"/tasks/{scene.waiting.pk}/cancel/"
    assert page(scene.world.alice).get(url).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(scene.world.alice)
    assert strict.post(url).status_code == 403
    scene.waiting.refresh_from_db()
    assert scene.waiting.state == Task.State.PENDING


def test_cancel_reason_too_long_is_a_400(scene: Any, page: Any) -> None:
    response = page(scene.world.alice).post(f"/tasks/{scene.waiting.pk}/cancel/", {"reason": "x" * 501})
    assert response.status_code == 400
    assert "at most 500 characters" in text(response)


# -- priority overrides -------------------------------------------------------------------------------


def test_member_requests_an_override(scene: Any, page: Any) -> None:
    client = page(scene.world.alice)
    form = text(client.get("/overrides/", {"task": scene.waiting.pk}))
    assert f'value="{scene.waiting.pk}"' in form  # prefilled from the task page's link
    response = client.post(
        "/overrides/",
        {"task": scene.waiting.pk, "wanted_priority": 50, "reason": "demo at noon"},
        follow=True,
    )
    assert response.status_code == 200
    override = PriorityOverride.objects.get()
    assert (override.task_id, override.wanted_priority, override.state) == (scene.waiting.pk, 50, "pending")
    assert f"Override {override.pk} requested" in text(response)
    assert list(override.audit.values_list("action", "actor")) == [("requested", "user:alice")]


def _override_post(scene: Any, **changes: Any) -> dict:
    data = {"task": scene.waiting.pk, "wanted_priority": 50, "reason": "demo at noon", "ttl_hours": ""}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"wanted_priority": 1}, "must be above the current priority 5"),
        ({"reason": "   "}, "This field is required"),
        ({"ttl_hours": 0}, "an override lives at least one hour"),
        ({"task": None}, "name exactly one target"),
        ({"queue": "mine"}, "name exactly one target"),
        ({"task": "other"}, "unknown task"),
        ({"wanted_priority": "high"}, "Enter a whole number"),
    ],
    ids=[
        "a raise below the current priority",
        "no reason",
        "a lifetime under an hour",
        "no target",
        "two targets",
        "another tenant's task",
        "a priority that is no number",
    ],
)
def test_override_request_errors_are_shown_on_the_form(
    scene: Any, page: Any, changes: dict, message: str
) -> None:
    if changes.get("queue") == "mine":
        changes["queue"] = scene.world.queue_a.pk
    if changes.get("task") == "other":
        changes["task"] = scene.world.task_b.pk
    response = page(scene.world.alice).post("/overrides/", _override_post(scene, **changes))
    assert response.status_code == 400
    assert message in text(response)
    if changes.get("reason") is None:
        assert "demo at noon" in text(response)  # what was typed is still there
    assert not PriorityOverride.objects.exists()


def test_viewer_cannot_request_an_override(scene: Any, page: Any) -> None:
    response = page(scene.world.vic).post("/overrides/", _override_post(scene))
    assert response.status_code == 403
    assert "needs the member role" in text(response)
    assert not PriorityOverride.objects.exists()


def test_queue_override_lists_only_own_queues(scene: Any, page: Any) -> None:
    w = scene.world
    body = text(page(w.alice).get("/overrides/"))
    assert f'<option value="{w.queue_a.pk}">vision/train</option>' in body
    assert "speech/train" not in body
    response = page(w.alice).post(
        "/overrides/", {"queue": w.queue_a.pk, "wanted_priority": 9, "reason": "quarter close"}
    )
    assert response.status_code == 302
    assert PriorityOverride.objects.get().queue_id == w.queue_a.pk


@pytest.fixture
def overrides(scene: Any) -> tuple[Any, Any]:
    w = scene.world
    mine = override_request(
        tenant=w.tenant_a, task=scene.waiting, wanted_priority=50, reason="deadline", requested_by=w.alice
    )
    theirs = override_request(
        tenant=w.tenant_b, task=w.task_b, wanted_priority=20, reason="asr eval", requested_by=w.bob
    )
    return mine, theirs


def test_members_see_their_tenants_overrides_without_decide_buttons(
    overrides: tuple[Any, Any], scene: Any, page: Any
) -> None:
    mine, theirs = overrides
    body = text(page(scene.world.alice).get("/overrides/"))
    assert f'data-override="{mine.pk}"' in body and f'data-override="{theirs.pk}"' not in body
    assert "Approve" not in body
    assert "data-override" not in text(page(scene.world.eve).get("/overrides/"))


def test_admin_sees_every_pending_override_and_approves_once(
    overrides: tuple[Any, Any], scene: Any, page: Any
) -> None:
    mine, theirs = overrides
    client = page(scene.world.root)
    body = text(client.get("/overrides/"))
    assert f'id="approve-{mine.pk}"' in body and f'id="approve-{theirs.pk}"' in body

    response = client.post(f"/overrides/{mine.pk}/approve/", {"comment": "ok"}, follow=True)
    assert response.status_code == 200 and f"Override {mine.pk} approved." in text(response)
    scene.waiting.refresh_from_db()
    assert scene.waiting.priority == 50
    again = client.post(f"/overrides/{mine.pk}/approve/", {"comment": "ok"})
    assert again.status_code == 409 and "not pending" in text(again)
    assert list(OverrideAuditEntry.objects.filter(override=mine).values_list("action", "actor")) == [
        ("requested", "user:alice"),
        ("approved", "user:root"),
    ]


def test_reject_needs_a_comment(overrides: tuple[Any, Any], scene: Any, page: Any) -> None:
    _, theirs = overrides
    client = page(scene.world.root)
    missing = client.post(f"/overrides/{theirs.pk}/reject/", {"comment": ""})
    assert missing.status_code == 400
    assert "a rejection needs a comment" in text(missing)
    theirs.refresh_from_db()
    assert theirs.state == "pending"
    done = client.post(f"/overrides/{theirs.pk}/reject/", {"comment": "not this week"})
    assert done.status_code == 302
    theirs.refresh_from_db()
    assert (theirs.state, theirs.comment) == ("rejected", "not this week")


def test_members_cannot_decide(overrides: tuple[Any, Any], scene: Any, page: Any) -> None:
    mine, theirs = overrides
    own = page(scene.world.alice).post(f"/overrides/{mine.pk}/approve/")
    assert own.status_code == 403 and "deciding overrides is for platform admins" in text(own)
    assert page(scene.world.alice).post(f"/overrides/{theirs.pk}/approve/").status_code == 404
    assert page(scene.world.eve).post(f"/overrides/{mine.pk}/reject/", {"comment": "x"}).status_code == 404
    assert set(PriorityOverride.objects.values_list("state", flat=True)) == {"pending"}


# -- pools --------------------------------------------------------------------------------------------


def test_pools_follow_quotas(scene: Any, page: Any) -> None:
    w = scene.world
    alice = text(page(w.alice).get("/pools/"))
    assert "h100-train" in alice and "l4-infer" in alice
    bob = text(page(w.bob).get("/pools/"))
    assert "h100-train" in bob and "l4-infer" not in bob
    assert page(w.bob).get(f"/pools/{w.l4.pk}/").status_code == 404
    assert "hold no quota in any pool" in text(page(w.eve).get("/pools/"))
    assert page(w.eve).get(f"/pools/{w.h100.pk}/").status_code == 404


def test_pool_heat_map_and_latest_cycle(scene: Any, page: Any) -> None:
    w = scene.world
    body = text(page(w.alice).get(f"/pools/{w.h100.pk}/"))
    # Two GPUs on gpu-001: the whole one A's task holds, and the MIG one, idle, re-carved by the cycle
    # into a 7g.80gb for B's whole-GPU task (no present unit held it), free until the agent applies it.
    assert body.count('<g class="gpu ') == 2
    assert 'class="gpu heat-4 health-healthy" data-allocated="1000"' in body
    assert 'class="gpu heat-0 health-healthy" data-allocated="0"' in body
    assert "7g.80gb: free" in body and "3g.40gb" not in body
    assert f"task {scene.placed.pk}" in body
    # The cycle's own figures: one placed, one left pending for capacity (the two-GPU task), one waiting
    # for its new layout, fragmentation before/after.
    stats = scene.cycle.stats
    assert f'<dd id="cycle-placed">{scene.cycle.tasks_placed}</dd>' in body
    # Counted by reason in words, never the raw code (issue: codes leaked into the UI).
    assert '<td>no free GPU, CPU or memory that fits</td><td class="num">1</td>' in body
    assert '<td>a GPU is being re-carved for it</td><td class="num">1</td>' in body
    assert "no_capacity" not in body and "waiting_for_layout" not in body
    assert str(stats["fragmentation_before"]["frag_milli"]) in body
    assert str(stats["fragmentation_after"]["frag_milli"]) in body


def test_heat_map_hides_other_tenants_task_ids(scene: Any, page: Any) -> None:
    w = scene.world
    body = text(page(w.bob).get(f"/pools/{w.h100.pk}/"))
    assert 'data-allocated="1000"' in body
    assert f"task {scene.placed.pk}" not in body
    assert "whole GPU 1000‰: in use" in body


def test_heat_map_places_mig_instances_on_their_memory_slices(scene: Any) -> None:
    from apps.dashboard.history import heat_map_gpus
    from apps.dashboard.presenters import CELL_W, PAD, heat_map

    drawn = heat_map(heat_map_gpus(node_ids=[scene.world.node.pk]), visible_tenant_ids=None)
    (row,) = drawn.rows
    mig, whole = row.cells
    (instance,) = mig.segments
    strip_w = CELL_W - 2 * PAD
    # The idle GPU's 3g.40gb@0 was re-carved for B's whole-GPU task: a 7g.80gb at start 0 holds all 8
    # memory slices, the whole strip, free until the agent applies it and the task binds.
    assert (instance.x - mig.x - PAD, instance.width + 1, instance.held) == (0, strip_w, False)
    assert (whole.allocated_milli, whole.heat, whole.segments[0].task_id) == (1000, 4, scene.placed.pk)
    assert drawn.allocated_milli == 1000 and drawn.gpus == 2


@pytest.mark.parametrize("extra", [0, 30], ids=["a few tasks", "thirty more tasks"])
def test_page_queries_do_not_grow_with_tasks(
    scene: Any, page: Any, extra: int, django_assert_max_num_queries: Any
) -> None:
    from tests.apps.factories import TaskFactory

    TaskFactory.create_batch(extra, queue=scene.world.queue_a, why_pending="waits")
    client = page(scene.world.alice)
    client.get("/")  # the session is read once; count a warm request
    for path in ["/", "/tasks/", f"/pools/{scene.world.h100.pk}/", "/overrides/"]:
        with django_assert_max_num_queries(12):
            assert client.get(path).status_code == 200


def test_favicon_is_served_for_pages_without_an_inline_icon(client: Any) -> None:
    """Django's admin and the Swagger UI link no icon: the browser's /favicon.ico must not be a 404."""
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    assert b"<svg" in response.content
