"""Who sees what: alice (member of A), bob (member of B), eve (in no tenant), root (platform admin)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.forecasting.models import ForecastModel
from apps.forecasting.services import task_forecast_attach, task_profiles_refresh
from apps.workloads.models import Task, TaskProfile


def _model(*, tenant=None, version=1, state="active"):
    now = timezone.now()
    return ForecastModel.objects.create(
        kind="duration", tenant=tenant, scope=ForecastModel.scope_of(None, tenant), version=version,
        state=state, blob=b'{"kind":"duration"}',
        metrics={"metric": "log_mae", "models": {"xgboost_p50": {"log_mae": 0.3}}},
        train_start=now - timedelta(days=9), train_end=now - timedelta(days=2),
        validation_start=now - timedelta(days=2), validation_end=now, trained_at=now, promoted_at=now,
        decision_reason="log_mae 0.3 beats every baseline and the active model",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("who", "versions", "sees_size"),
    [("alice", [1, 2], False), ("bob", [1, 3], False), ("eve", [], False), ("root", [1, 2, 3], True)],
    ids=["a member sees plane-wide and her tenant's", "b member likewise", "an outsider sees none",
         "a platform admin sees all with sizes"],
)  # fmt: skip
def test_the_model_registry_is_scoped_and_never_shows_bytes(world, api, who, versions, sees_size) -> None:
    _model(version=1)
    _model(tenant=world.tenant_a, version=2)
    _model(tenant=world.tenant_b, version=3)
    response = api(getattr(world, who)).get("/api/v1/forecast-models/")
    assert response.status_code == 200
    rows = response.json()["results"]
    assert sorted(r["version"] for r in rows) == versions
    for row in rows:
        assert "blob" not in row and row["decision_reason"].startswith("log_mae")
        assert ("blob_size_bytes" in row) is sees_size
        if sees_size:
            assert row["blob_size_bytes"] == len(b'{"kind":"duration"}')


def test_the_registry_needs_a_signed_in_caller(world, api) -> None:
    assert api().get("/api/v1/forecast-models/").status_code in {401, 403}
    assert api().get("/api/v1/profiles/").status_code in {401, 403}


@pytest.mark.parametrize(
    ("who", "status", "sees"),
    [("alice", 200, True), ("bob", 404, False), ("eve", 404, False), ("root", 200, True)],
    ids=[
        "the submitter's tenant sees it",
        "another tenant gets 404",
        "an outsider gets 404",
        "admin sees it",
    ],
)
def test_a_tasks_forecast_is_shown_only_to_who_may_see_the_task(world, api, who, status, sees) -> None:
    task_forecast_attach(task_id=world.task_a.pk)
    response = api(getattr(world, who)).get(f"/api/v1/tasks/{world.task_a.pk}/")
    assert response.status_code == status
    if sees:
        assert response.json()["forecast"]["source"] == "none"
    listed = api(getattr(world, who)).get("/api/v1/tasks/").json()["results"]
    assert any(t["id"] == world.task_a.pk and t["forecast"] for t in listed) is sees


@pytest.mark.parametrize(
    ("who", "keys"),
    [
        ("alice", ["vision:bert"]),
        ("bob", ["speech:asr"]),
        ("eve", []),
        ("root", ["speech:asr", "vision:bert"]),
    ],
    ids=["member of A", "member of B", "outsider", "platform admin"],
)
def test_profiles_are_scoped_to_the_callers_tenants(world, api, who, keys) -> None:
    TaskProfile.objects.create(tenant=world.tenant_a, profile_key="bert", gpu_mem_peak_mib=8_000)
    TaskProfile.objects.create(tenant=world.tenant_b, profile_key="asr")
    rows = api(getattr(world, who)).get("/api/v1/profiles/").json()["results"]
    assert sorted(f"{r['tenant']}:{r['profile_key']}" for r in rows) == keys


def test_a_profile_with_a_memory_peak_gets_right_sizing_for_its_tenants_gpus(world, api) -> None:
    TaskProfile.objects.create(tenant=world.tenant_a, profile_key="bert", gpu_mem_peak_mib=8_000)
    row = api(world.alice).get("/api/v1/profiles/").json()["results"][0]
    advice = {a["gpu_model"]: a for a in row["right_sizing"]}
    # Tenant A holds quotas in the H100 pool (MIG) and the L4 pool (no MIG: MPS). 8000 MiB + 15 %.
    assert advice["H100-80GB"]["unit"] == "mig" and advice["H100-80GB"]["mig_profile"] == "1g.10gb"
    assert advice["H100-80GB"]["need_mib"] == 9_200
    assert advice["L4"]["unit"] == "mps" and advice["L4"]["mps_mem_limit_mib"] == 9_216


def test_profiles_fold_finished_runs_of_the_key(world) -> None:
    now = timezone.now()
    for i, dur in enumerate([60, 120, 180, 240, 300, 900]):
        started = now - timedelta(hours=5 + i)
        Task.objects.create(
            tenant=world.tenant_a, queue=world.queue_a, pool=world.h100, priority=0, profile_key="bert",
            state=Task.State.FAILED if dur == 900 else Task.State.SUCCEEDED,
            started_at=started, finished_at=started + timedelta(seconds=dur),
        )  # fmt: skip
    profile = task_profiles_refresh(tenant=world.tenant_a, profile_key="bert", now=now)
    # The failed run stopped early or late for its own reasons: it is not a duration of the work.
    assert profile.sample_count == 5
    assert profile.duration_p50_s == pytest.approx(180.0)
    assert profile.duration_p90_s == pytest.approx(276.0)


def test_the_admin_shows_the_registry_read_only_without_the_bytes(world, client) -> None:
    model = _model()
    task_forecast_attach(task_id=world.task_a.pk)
    client.force_login(world.root)
    listing = client.get("/admin/forecasting/forecastmodel/")
    assert listing.status_code == 200 and b"duration" in listing.content
    page = client.get(f"/admin/forecasting/forecastmodel/{model.pk}/change/")
    assert page.status_code == 200
    assert b"beats every baseline" in page.content and b"blob" not in page.content.lower()
    assert client.get("/admin/forecasting/forecastmodel/add/").status_code == 403
    assert client.get("/admin/forecasting/taskforecast/").status_code == 200


@pytest.mark.parametrize(
    ("path", "queries"),
    [("/api/v1/forecast-models/", 4), ("/api/v1/profiles/", 5)],  # profiles: + the tenants' GPU models
    ids=["registry", "profiles"],
)
def test_forecasting_lists_cost_a_fixed_number_of_queries(
    world, api, django_assert_num_queries, path, queries
) -> None:
    client = api(world.alice)
    _model(version=1)
    TaskProfile.objects.create(tenant=world.tenant_a, profile_key="k0", gpu_mem_peak_mib=1_000)
    with django_assert_num_queries(queries):
        assert client.get(path).status_code == 200
    for i in range(2, 12):
        _model(version=i, state="retired")
        TaskProfile.objects.create(tenant=world.tenant_a, profile_key=f"k{i}", gpu_mem_peak_mib=1_000 * i)
    with django_assert_num_queries(queries):
        assert len(client.get(path).json()["results"]) >= 10
