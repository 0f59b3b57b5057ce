"""`GET /metrics` on real PostgreSQL: the figures an operator checks, who may read them, what a scrape costs.

The world (tests/conftest.py) has two pools: h100-train (gpu-001: GPU 0 MIG with a free 3g.40gb, GPU 1
whole) and l4-infer (l4-001: one L4). A cycle over h100-train places A's whole-GPU task on GPU 1 and
re-carves idle GPU 0 for B's (an open repartition claim, B waits `waiting_for_layout`); A's task then
runs, an extra task of A is cancelled, a task of A waits in l4-infer where no cycle has run, and l4-001
goes lost.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "scrape-secret-0123456789"
H100, L4 = "h100-train", "l4-infer"


def scrape(client: Client, **headers: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name → {sorted labels → value}, parsed with prometheus_client's own parser."""
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture
def busy_world(world: Any) -> Any:
    from apps.fleet.nodes import nodes_mark_lost
    from apps.inventory.models import Node
    from apps.scheduling.services import cycle_run
    from apps.workloads.services import TaskSubmission, task_cancel, task_submit, task_transition

    now = timezone.now()
    extra, _ = task_submit(
        tenant=world.tenant_a, request=TaskSubmission(queue="train"), submitted_by=world.alice
    )
    task_cancel(task=extra, by=world.alice, reason="superseded")
    report = cycle_run(pool_id=world.h100.pk, now=now)
    assert report.status == "done" and report.placed == 1
    world.task_a.refresh_from_db()
    task_transition(task=world.task_a, to_state="running", actor="agent:test", reason="started", now=now)
    task_submit(tenant=world.tenant_a, request=TaskSubmission(queue="infer"), submitted_by=world.alice)
    # gpu-001 heartbeated 5 s ago; l4-001 was registered an hour ago and never did, so it goes lost.
    Node.objects.filter(pk=world.node.pk).update(last_heartbeat_at=now - timedelta(seconds=5))
    Node.objects.filter(name="l4-001").update(created_at=now - timedelta(hours=1))
    assert len(nodes_mark_lost(now=now)) == 1
    return world


@pytest.fixture
def token(settings: Any) -> str:
    settings.WHALEGEN_METRICS_TOKEN = TOKEN
    return TOKEN


def test_allocated_milli_is_the_sum_of_the_units_tasks_hold(busy_world, token, client) -> None:
    from apps.inventory.models import ComputeUnit
    from apps.scheduling.holders import unit_holders

    samples = scrape(client, authorization=f"Bearer {token}")
    held = ComputeUnit.objects.filter(pk__in=unit_holders(pool_id=busy_world.h100.pk))
    want = held.aggregate(milli=Sum("gpu_milli"))["milli"]
    assert want == 1000  # A's task holds whole GPU 1
    assert value(samples, "whalegen_gpu_allocated_milli", pool=H100, cluster="eu-1") == want
    assert value(samples, "whalegen_gpu_allocated_gpus", pool=H100, cluster="eu-1") == 1.0
    assert value(samples, "whalegen_gpu_allocated_milli", pool=L4, cluster="eu-1") == 0
    assert value(samples, "whalegen_gpu_capacity_milli", pool=H100, cluster="eu-1") == 2000
    assert value(samples, "whalegen_gpu_capacity_gpus", pool=L4, cluster="eu-1") == 1
    assert value(samples, "whalegen_gpus", pool=H100, cluster="eu-1", health="healthy") == 2
    assert value(samples, "whalegen_compute_units_held", pool=H100, cluster="eu-1", kind="whole") == 1


def test_tasks_by_state_and_pending_by_reason_match_the_tasks(busy_world, token, client) -> None:
    from apps.workloads.models import Task

    samples = scrape(client, authorization=f"Bearer {token}")
    want = {"pending": 1, "running": 1, "cancelled": 1, "succeeded": 0, "assigned": 0}
    assert {s: value(samples, "whalegen_tasks", pool=H100, state=s) for s in want} == want
    assert value(samples, "whalegen_tasks", pool=L4, state="pending") == 1
    codes = dict(Task.objects.filter(state="pending").values_list("pool__name", "wait__code"))
    assert codes == {H100: "waiting_for_layout", L4: None}
    assert value(samples, "whalegen_tasks_pending", pool=H100, reason="waiting_for_layout") == 1
    assert value(samples, "whalegen_tasks_pending", pool=L4, reason="not_considered") == 1
    assert sum(samples["whalegen_tasks_pending"].values()) == Task.objects.filter(state="pending").count()
    assert 0 < value(samples, "whalegen_tasks_pending_oldest_age_seconds", pool=H100) < 600


def test_quotas_show_guarantee_limit_use_and_what_waits(busy_world, token, client) -> None:
    samples = scrape(client, authorization=f"Bearer {token}")
    a, b = {"tenant": "vision", "pool": H100}, {"tenant": "speech", "pool": H100}
    assert value(samples, "whalegen_quota_guaranteed_milli", **a) == 4000
    assert value(samples, "whalegen_quota_borrow_limit_milli", **a) == 2000
    assert value(samples, "whalegen_quota_in_use_milli", **a) == 1000  # the running task
    assert value(samples, "whalegen_quota_waiting_milli", **b) == 1000  # pending: asked, not held
    assert value(samples, "whalegen_quota_in_use_milli", **b) == 0
    assert value(samples, "whalegen_quota_borrowed_milli", **a) == 0
    assert value(samples, "whalegen_quota_waiting_milli", tenant="vision", pool=L4) == 1000
    assert value(samples, "whalegen_quota_in_use_milli", tenant="vision", pool=L4) == 0


def test_cycle_figures_come_from_the_cycle_records(busy_world, token, client) -> None:
    from apps.scheduling.models import Cycle

    cycle = Cycle.objects.get(pool=busy_world.h100)
    samples = scrape(client, authorization=f"Bearer {token}")
    after = cycle.stats["fragmentation_after"]
    assert value(samples, "whalegen_pool_idle_milli", pool=H100) == after["idle_milli"]
    assert value(samples, "whalegen_pool_fragmented_milli", pool=H100) == after["frag_milli"]
    assert value(samples, "whalegen_pool_fragmentation_percent", pool=H100) == after["amount_pct"]
    for phase in ("snapshot", "solve", "commit"):
        got = value(samples, "whalegen_cycle_last_phase_seconds", pool=H100, phase=phase)
        assert got == pytest.approx(getattr(cycle, f"{phase}_ms") / 1000)
    assert value(samples, "whalegen_cycles_total", pool=H100) == 1
    assert value(samples, "whalegen_cycle_tasks_considered_total", pool=H100) == 2
    assert value(samples, "whalegen_cycle_tasks_placed_total", pool=H100) == 1
    assert value(samples, "whalegen_cycle_conflicts_total", pool=H100) == 0
    assert 0 <= value(samples, "whalegen_cycle_last_age_seconds", pool=H100) < 600
    # No cycle has run over l4-infer: its cycle figures are absent, not zero.
    assert all(dict(labels)["pool"] != L4 for labels in samples["whalegen_pool_idle_milli"])


def test_cycle_counters_keep_counting_and_survive_pruned_cycle_records(busy_world, token, client) -> None:
    from apps.scheduling.models import Cycle
    from apps.scheduling.services import cycle_run

    cycle_run(pool_id=busy_world.h100.pk)  # nothing new fits: one more cycle, nothing placed
    Cycle.objects.filter(pool=busy_world.h100).delete()  # an operator prunes the history
    samples = scrape(client, authorization=f"Bearer {token}")
    assert value(samples, "whalegen_cycles_total", pool=H100) == 2
    assert value(samples, "whalegen_cycle_tasks_placed_total", pool=H100) == 1


def test_nodes_by_state_with_the_lost_one_and_heartbeat_age(busy_world, token, client) -> None:
    samples = scrape(client, authorization=f"Bearer {token}")
    assert value(samples, "whalegen_nodes", pool=H100, cluster="eu-1", state="ready") == 1
    assert value(samples, "whalegen_nodes", pool=L4, cluster="eu-1", state="lost") == 1
    assert value(samples, "whalegen_nodes", pool=L4, cluster="eu-1", state="ready") == 0
    assert 5 <= value(samples, "whalegen_node_heartbeat_age_max_seconds", pool=H100, state="ready") < 600
    assert 3600 <= value(samples, "whalegen_node_heartbeat_age_max_seconds", pool=L4, state="lost") < 4200
    assert value(samples, "whalegen_repartition_claims_open", pool=H100) == 1  # GPU 0 re-carved for B
    assert value(samples, "whalegen_repartition_claims_open", pool=L4) == 0
    assert value(samples, "whalegen_cluster_cordoned", cluster="eu-1") == 0


def test_active_forecast_models_show_version_and_validation_score(busy_world, token, client) -> None:
    from apps.forecasting.models import ForecastModel

    now = timezone.now()
    common = {"blob": b"{}", "train_start": now, "train_end": now, "validation_start": now}
    scores = {
        "metric": "log_mae",
        "models": {"xgboost_p50": {"log_mae": 0.42}, "global_median": {"log_mae": 0.9}},
    }
    for version, state in ((1, "retired"), (2, "active")):
        ForecastModel.objects.create(
            kind="duration", scope="", version=version, state=state, metrics=scores,
            validation_end=now, trained_at=now - timedelta(hours=2), decision_reason="test", **common,
        )  # fmt: skip
    idle = {"metric": "mae", "horizons": {"600": {"models": {"xgboost": {"mae": 1.5}}}}}
    ForecastModel.objects.create(
        kind="idle_gpus", pool=busy_world.l4, scope=f"pool:{busy_world.l4.pk}", version=1, state="active",
        metrics=idle, validation_end=now, trained_at=now, decision_reason="test", **common,
    )  # fmt: skip
    samples = scrape(client, authorization=f"Bearer {token}")
    assert value(samples, "whalegen_forecast_model_active_version", kind="duration", scope="plane") == 2
    got = value(
        samples, "whalegen_forecast_model_validation_score", kind="duration", scope="plane", metric="log_mae"
    )
    assert got == 0.42
    labels = {"kind": "idle_gpus", "scope": f"pool:{L4}", "metric": "mae_600s"}
    assert value(samples, "whalegen_forecast_model_validation_score", **labels) == 1.5
    assert (
        7200 <= value(samples, "whalegen_forecast_model_age_seconds", kind="duration", scope="plane") < 7800
    )


@pytest.mark.parametrize(
    ("header", "want"),
    [
        pytest.param(None, 401, id="no token is refused"),
        pytest.param("Bearer wrong-token", 401, id="a wrong token is refused"),
        pytest.param(f"Basic {TOKEN}", 401, id="the token under another scheme is refused"),
        pytest.param(f"Bearer {TOKEN}", 200, id="the metrics token is let in"),
    ],
)
def test_with_a_metrics_token_only_that_token_gets_in(world, token, client, header, want) -> None:
    headers = {"authorization": header} if header else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == want
    if want == 401:
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert "WHALEGEN_METRICS_TOKEN" in response.content.decode()


def test_with_a_metrics_token_even_a_platform_admin_session_is_refused(world, token, client) -> None:
    client.force_login(world.root)
    assert client.get("/metrics").status_code == 401


@pytest.mark.parametrize(
    ("persona", "want"),
    [
        pytest.param(None, 401, id="anonymous is asked to authenticate"),
        pytest.param("alice", 403, id="a tenant member is refused"),
        pytest.param("ada", 403, id="a tenant admin is refused"),
        pytest.param("root", 200, id="a platform admin reads"),
    ],
)
def test_without_a_metrics_token_platform_admin_sessions_read(world, settings, client, persona, want) -> None:
    settings.WHALEGEN_METRICS_TOKEN = None
    if persona:
        client.force_login(getattr(world, persona))
    response = client.get("/metrics")
    assert response.status_code == want
    if want == 200:
        assert b"whalegen_tasks{" in response.content


@pytest.mark.parametrize(
    ("persona", "want"),
    [
        pytest.param("alice", 403, id="a member's API token is refused"),
        pytest.param("root", 200, id="a platform admin's API token reads"),
    ],
)
def test_without_a_metrics_token_platform_admin_api_tokens_read(
    world, settings, client, persona, want
) -> None:
    from apps.tenants.services import token_create

    settings.WHALEGEN_METRICS_TOKEN = None
    _, raw = token_create(user=getattr(world, persona), tenant=world.tenant_a, name="prometheus")
    assert client.get("/metrics", headers={"authorization": f"Bearer {raw}"}).status_code == want
    assert client.get("/metrics", headers={"authorization": "Bearer wg_unknown"}).status_code == 401


def test_other_methods_are_refused(world, token, client) -> None:
    assert client.post("/metrics", headers={"authorization": f"Bearer {token}"}).status_code == 405


def test_a_scrape_costs_a_fixed_number_of_queries(
    busy_world, token, client, django_assert_num_queries
) -> None:
    from apps.inventory.models import Gpu
    from apps.inventory.services import cluster_create, gpu_add, node_register
    from apps.scheduling.services import cycle_run
    from apps.workloads.services import TaskSubmission, task_submit

    headers = {"authorization": f"Bearer {token}"}
    with django_assert_num_queries(13):
        small = client.get("/metrics", headers=headers)
    # More of everything: clusters, nodes, GPUs of every partition mode, tasks, cycles.
    cluster = cluster_create(name="us-1")
    for index in range(4):
        node, _ = node_register(
            cluster=cluster, pool=busy_world.l4, name=f"l4-{index + 10}", cpu_milli=32_000, mem_mib=262_144
        )
        gpu_add(node=node, index=0, model="L4", partition_mode=Gpu.PartitionMode.MPS, mps_shares=4)
        gpu_add(node=node, index=1, model="L4")
    for _ in range(4):  # what A's l4-infer quota (2000) admits beside its pending 1000
        task_submit(
            tenant=busy_world.tenant_a,
            request=TaskSubmission(queue="infer", gpu_milli=250),
            submitted_by=None,
        )
    cycle_run(pool_id=busy_world.l4.pk)
    cycle_run(pool_id=busy_world.h100.pk)
    with django_assert_num_queries(13):
        large = client.get("/metrics", headers=headers)
    assert small.status_code == large.status_code == 200
    assert len(large.content) > len(small.content)
