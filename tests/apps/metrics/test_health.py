"""`GET /healthz` and `GET /readyz` on real PostgreSQL and Redis: what each check reports, that a failing
or raising check is a 503 naming it (never a 500), and the request id every answer carries."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.metrics import selectors
from apps.metrics.models import PlaneTick
from apps.metrics.services import plane_tick
from apps.metrics.tasks import plane_tick_task


@pytest.fixture(autouse=True)
def fresh_migration_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test sees a process that has not yet seen its migrations applied.
    monkeypatch.setattr(selectors, "_migrations_applied", False)


def test_healthz_answers_ok_without_touching_the_database(client: Client) -> None:
    # No database fixture: pytest-django makes any query here raise, so a 200 proves none was made.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_503_naming_beat_until_a_plane_tick_ran(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "fail" and body["failing"] == ["beat"]
    assert body["checks"]["database"]["ok"] and body["checks"]["migrations"] == {
        "ok": True,
        "detail": "all applied",
    }
    assert body["checks"]["broker"] == {"ok": True, "detail": "redis answers PING"}
    assert "no plane-tick ran yet" in body["checks"]["beat"]["detail"]


@pytest.mark.django_db
def test_readyz_is_200_once_the_beat_task_stamped_the_tick(client: Client) -> None:
    plane_tick_task.apply()
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "ok" and response.json()["failing"] == []
    assert PlaneTick.objects.count() == 1
    plane_tick_task.apply()  # idempotent: one row, stamped again
    assert PlaneTick.objects.count() == 1


@pytest.mark.django_db
def test_a_tick_older_than_the_allowed_age_fails_beat(client: Client, settings: Any) -> None:
    settings.WHALEGEN_READY_BEAT_MAX_AGE_S = 60.0
    plane_tick(now=timezone.now() - timedelta(seconds=90))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["beat"]
    assert "> 60 s" in response.json()["checks"]["beat"]["detail"]
    plane_tick(now=timezone.now() - timedelta(seconds=30))
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_an_unreachable_broker_fails_the_broker_check(client: Client, settings: Any) -> None:
    plane_tick(now=timezone.now())
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.WHALEGEN_READY_BROKER_TIMEOUT_S = 0.5
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["broker"]
    assert "ConnectionError" in response.json()["checks"]["broker"]["detail"]


@pytest.mark.django_db
def test_the_embedded_in_memory_broker_passes_and_says_so(client: Client, settings: Any) -> None:
    plane_tick(now=timezone.now())
    settings.CELERY_BROKER_URL = "memory://localhost/"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    response = client.get("/readyz")
    assert response.status_code == 200
    assert "in-memory broker" in response.json()["checks"]["broker"]["detail"]


@pytest.mark.django_db
def test_a_check_that_raises_is_a_failing_check_and_never_a_500(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down() -> selectors.Check:
        raise OSError("connection refused")

    monkeypatch.setattr(selectors, "_check_database", down)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["database", "migrations", "beat"]
    assert body["checks"]["database"]["detail"] == "OSError: connection refused"
    assert body["checks"]["beat"]["detail"] == "not checked: the database is unreachable"


@pytest.mark.django_db(transaction=True)
def test_unapplied_migrations_fail_readiness_and_a_positive_answer_is_cached(client: Client) -> None:
    from django.core.management import call_command

    call_command("migrate", "metrics", "zero", verbosity=0)
    try:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "migrations" in response.json()["failing"]
        assert "metrics.0001_plane_tick" in response.json()["checks"]["migrations"]["detail"]
    finally:
        call_command("migrate", "metrics", verbosity=0)
    plane_tick(now=timezone.now())
    with CaptureQueriesContext(connection) as first:
        assert client.get("/readyz").status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get("/readyz").status_code == 200
    reads_migrations = [q for q in first.captured_queries if "django_migrations" in q["sql"]]
    assert reads_migrations, "the first call must read the migration table"
    assert not [q for q in second.captured_queries if "django_migrations" in q["sql"]]


def test_both_endpoints_are_unauthenticated_and_get_only(client: Client, db: None) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code in (200, 503)
    assert client.post("/healthz").status_code == 405
    assert client.post("/readyz").status_code == 405


def test_every_answer_carries_a_request_id_and_an_incoming_one_is_kept(client: Client) -> None:
    made = client.get("/healthz")["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    assert client.get("/healthz")["X-Request-ID"] != made
    assert client.get("/healthz", headers={"X-Request-ID": "lb-7f3a:42"})["X-Request-ID"] == "lb-7f3a:42"
    # Not an id (spaces, a line break smuggled in): replaced by one of ours.
    junk = client.get("/healthz", headers={"X-Request-ID": "x y\nforged: 1"})["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", junk)


def test_the_health_endpoints_are_not_in_the_api_document() -> None:
    from pathlib import Path

    document = (Path(__file__).resolve().parents[3] / "docs" / "openapi.yaml").read_text()
    assert "/metrics" not in document and "/healthz" not in document and "/readyz" not in document
