"""The fleet overview (a platform admin's home page), reason codes in words, and the styled error pages.

The scene (tests/apps/dashboard/conftest.py): pool h100-train has one node with two H100s (one whole,
held by A's task; one MIG, being re-carved for B's task), so it has idle capacity and two pending
tasks at once; pool l4-infer has one idle L4. Both pools are in cluster eu-1.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from apps.dashboard.words import REASON_LABELS, reason_label
from apps.inventory.models import Node
from apps.workloads.services import BACKING_OFF
from whalegen.placement.types import Outcome
from whalegen.scheduling.types import Code

pytestmark = pytest.mark.django_db


def text(response: Any) -> str:
    return response.content.decode()


def pool_row(body: str, pool: str) -> str:
    match = re.search(rf'<tr class="fleet-pool[^"]*" data-pool="{pool}">(.*?)</tr>', body, re.S)
    assert match, f"no fleet row for {pool}"
    return match.group(0)


def visible(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_platform_admin_home_shows_every_pool_with_capacity_allocation_and_why_tasks_wait(
    scene: Any, page: Any
) -> None:
    body = text(page(scene.world.root).get("/"))
    h100 = pool_row(body, "h100-train")
    # Idle capacity next to pending work: the row an operator looks at first is marked.
    assert 'class="fleet-pool attention"' in h100
    cells = visible(h100)
    assert "h100-train eu-1 2 " in cells  # pool, its cluster, GPUs
    assert "1 (50%)" in cells  # one of two GPUs allocated
    assert "1 no free GPU, CPU or memory that fits" in cells
    assert "1 a GPU is being re-carved for it" in cells
    assert "1 ready" in cells
    l4 = pool_row(body, "l4-infer")
    assert "attention" not in l4 and "0 (0%)" in visible(l4)
    assert "3 GPUs in 2 pools · 1 GPUs allocated (33%) · 2 tasks pending · 0 nodes not ready" in visible(body)


def test_lost_and_cordoned_nodes_are_counted_per_pool_and_cluster(scene: Any, page: Any) -> None:
    Node.objects.filter(pk=scene.world.node.pk).update(state=Node.State.LOST)
    body = text(page(scene.world.root).get("/"))
    assert "1 lost (no heartbeat)" in visible(pool_row(body, "h100-train"))
    assert "1 node not ready" in visible(body)
    clusters = visible(body.split('class="compact fleet-clusters"')[1].split("</table>")[0])
    assert "eu-1 h100-train 2 1 (50%) 1 lost (no heartbeat)" in clusters


@pytest.mark.parametrize("persona", ["alice", "bob", "eve"])
def test_members_and_outsiders_see_no_fleet(scene: Any, page: Any, persona: str) -> None:
    body = text(page(getattr(scene.world, persona)).get("/"))
    assert 'id="fleet"' not in body and "fleet-pool" not in body


def test_fleet_overview_costs_a_fixed_number_of_queries(
    scene: Any, page: Any, django_assert_max_num_queries: Any
) -> None:
    from tests.apps.factories import TaskFactory

    client = page(scene.world.root)
    client.get("/")
    with django_assert_max_num_queries(30) as few:
        client.get("/")
    TaskFactory.create_batch(20, queue=scene.world.queue_a, why_pending="waits")
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get("/").status_code == 200


def test_every_reason_code_has_words() -> None:
    # Every code of the scheduler's own, read off the class, so a new one needs words here too.
    ours = [value for name, value in vars(Code).items() if name.isupper()]
    codes = [o.value for o in Outcome] + ours
    codes.append(BACKING_OFF)
    missing = [c for c in codes if c not in REASON_LABELS]
    assert not missing, f"give these why-pending codes words in apps/dashboard/words.py: {missing}"
    assert all("_" not in REASON_LABELS[c] for c in codes)
    assert reason_label("some_new_code") == "some new code"
    assert reason_label("") == reason_label(None) == "waiting for the next cycle"


# -- error pages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["bob", "eve"])
def test_another_tenants_task_is_a_styled_404(scene: Any, page: Any, persona: str) -> None:
    response = page(getattr(scene.world, persona)).get(f"/tasks/{scene.waiting.pk}/")
    assert response.status_code == 404
    body = text(response)
    assert 'id="error-page"' in body and "Not found" in body and "dashboard.css" in body
    assert "Back to the overview" in body


def test_unknown_dashboard_url_is_styled_and_api_404_stays_json(scene: Any, page: Any) -> None:
    client = page(scene.world.alice)
    assert 'id="error-page"' in text(client.get("/no/such/page/"))
    api = client.get("/api/v1/tasks/abc/")
    assert api.status_code == 404 and api["Content-Type"].startswith("application/json")


def test_server_error_page_renders_without_a_request_context() -> None:
    from django.template import loader

    body = loader.get_template("500.html").render()
    assert "Something went wrong on our side" in body and "/readyz" in body


# -- what-if --------------------------------------------------------------------------------------------


def test_whatif_shows_both_policies_and_writes_nothing(scene: Any, page: Any, whatif_jobs: Any) -> None:
    from apps.scheduling.models import Cycle
    from apps.workloads.models import Task

    states = dict(Task.objects.values_list("pk", "state"))
    cycles = Cycle.objects.count()
    client = page(scene.world.root)
    path = f"/pools/{scene.world.h100.pk}/whatif/?policy=fgd"
    # Nothing decided yet for the newest cycle: the page answers at once, computing, as a live part.
    first = text(client.get(path))
    assert 'id="whatif-result" data-live data-state="computing"' in first and "Computing…" in first
    assert 'data-live-s="2"' in first  # it looks for the answer sooner than the usual 5 s
    assert "data-policy=" not in first  # no decision to show yet: nothing made up
    assert text(client.get(path)).count("Computing…") == 1  # asked again: still one decision started
    assert whatif_jobs.run() == 1
    response = client.get(path)
    assert response.status_code == 200
    body = text(response)
    assert 'id="whatif-result" data-state="ready"' in body  # no data-live: final, the refresh stops
    assert 'data-policy="whalegen"' in body and 'data-policy="fgd"' in body
    assert "the cycle's policy" in body
    # The two-GPU task cannot fit on one node with one whole GPU under any policy: it waits, in words.
    assert "big-run" in body and "no free GPU, CPU or memory that fits" in body
    assert "no_capacity" not in visible(body)
    assert f"after the scheduling cycle\n    of {scene.cycle.started_at:%H:%M:%S}" in body
    assert dict(Task.objects.values_list("pk", "state")) == states and Cycle.objects.count() == cycles


def test_whatif_after_a_new_cycle_shows_the_earlier_decision_while_computing(
    scene: Any, page: Any, whatif_jobs: Any
) -> None:
    from apps.scheduling.services import cycle_run
    from apps.workloads.services import TaskSubmission, task_submit

    w = scene.world
    client = page(w.root)
    path = f"/pools/{w.h100.pk}/whatif/?policy=fgd"
    client.get(path)
    whatif_jobs.run()
    task_submit(tenant=w.tenant_a, request=TaskSubmission(queue="train", name="late-run", gpu_count=2),
                submitted_by=w.alice)  # fmt: skip
    assert "late-run" not in text(client.get(path))  # the same cycle: its decision, not recomputed
    assert not whatif_jobs.started
    cycle_run(pool_id=w.h100.pk)
    body = text(client.get(path))
    # A new cycle: its decision is started; meanwhile the earlier one is shown, and said to be earlier.
    assert "Computing…" in body and "the last decision made, after an earlier cycle" in body
    assert "big-run" in body and "late-run" not in body
    assert len(whatif_jobs.started) == 1
    whatif_jobs.run()
    body = text(client.get(path))
    assert "Computing…" not in body and "late-run" in body


def test_a_failed_whatif_says_so_and_is_tried_again(
    scene: Any, page: Any, whatif_jobs: Any, monkeypatch: Any
) -> None:
    from apps.dashboard import whatif

    def broken(**_: Any) -> Any:
        raise RuntimeError("solver exploded")

    w = scene.world
    client = page(w.root)
    path = f"/pools/{w.h100.pk}/whatif/?policy=fgd"
    client.get(path)
    monkeypatch.setattr(whatif, "decide_now", broken)
    whatif_jobs.run()
    body = text(client.get(path))
    assert "The decision could not be made: RuntimeError: solver exploded" in body
    assert 'data-state="failed"' in body and "Computing…" not in body


def test_the_whatif_says_so_when_its_store_does_not_answer(scene: Any, page: Any, monkeypatch: Any) -> None:
    """Redis restarting (here: a port nothing listens on): the page answers, styled, and says why."""
    import redis

    from apps.dashboard import caching

    nobody = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, socket_timeout=0.5)
    w = scene.world
    with monkeypatch.context() as patched:  # undone before the fixtures clear the real store
        patched.setattr(caching, "_client", nobody)
        response = page(w.root).get(f"/pools/{w.h100.pk}/whatif/?policy=fgd")
    assert response.status_code == 200
    body = text(response)
    assert "The decision could not be made: the decisions&#x27; store (Redis) is not answering" in body


def test_whatif_names_only_the_members_own_tasks(scene: Any, page: Any, whatif_jobs: Any) -> None:
    w = scene.world
    path = f"/pools/{w.h100.pk}/whatif/?policy=fgd"
    page(w.root).get(path)
    whatif_jobs.run()
    body = text(page(w.bob).get(path))
    assert 'data-policy="fgd"' in body
    assert "big-run" not in body  # A's task, seen by a member of B
    assert "another tenant&#x27;s task" in body
    assert "big-run" in text(page(w.alice).get(path))  # the same stored decision, seen by its owner


def test_whatif_refuses_an_unknown_policy_and_hides_other_pools(scene: Any, page: Any) -> None:
    w = scene.world
    bad = page(w.root).get(f"/pools/{w.h100.pk}/whatif/?policy=nope")
    assert bad.status_code == 400 and "unknown policy &#x27;nope&#x27;" in text(bad)
    assert page(w.eve).get(f"/pools/{w.h100.pk}/whatif/").status_code == 404
    assert page(w.bob).get(f"/pools/{w.l4.pk}/whatif/").status_code == 404


def test_a_large_pools_heat_map_comes_a_page_of_nodes_at_a_time(
    scene: Any, page: Any, monkeypatch: Any
) -> None:
    from apps.dashboard import views
    from apps.inventory.services import gpu_add, node_register

    w = scene.world
    second, _ = node_register(
        cluster=w.node.cluster, pool=w.h100, name="gpu-002", cpu_milli=8000, mem_mib=65536
    )
    gpu_add(node=second, index=0, model="H100-80GB")
    monkeypatch.setattr(views, "HEATMAP_NODES_PER_PAGE", 1)
    client = page(w.alice)
    first = text(client.get(f"/pools/{w.h100.pk}/"))
    # The header counts the whole pool; the map draws one node per page here.
    assert "3 GPUs on 2 nodes · 1 GPUs allocated" in first
    assert "eu-1/gpu-001" in first and "eu-1/gpu-002" not in first
    assert "nodes 1–1 of 2" in first and "?page=2" in first
    later = text(client.get(f"/pools/{w.h100.pk}/?page=2"))
    assert "eu-1/gpu-002" in later and "eu-1/gpu-001" not in later
