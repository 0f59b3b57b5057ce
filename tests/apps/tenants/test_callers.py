"""The per-process memory of bearer tokens (apps.tenants.callers): a change made in this process is seen
at once, one made elsewhere (simulated here by writes that send no signal, as another process's do not
reach this one) within WHALEGEN_AUTH_CACHE_S, and expiry on the second."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.tenants.callers import callers
from apps.tenants.models import ApiToken, Membership
from apps.tenants.selectors import Access
from apps.tenants.services import token_create, token_revoke


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, settings: Any) -> FakeClock:
    settings.WHALEGEN_AUTH_CACHE_S = 5.0
    fake = FakeClock()
    monkeypatch.setattr(callers, "_clock", fake)
    callers.clear()
    return fake


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_token_revoked_in_this_process_stops_working_at_once(world, clock) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert client.get("/api/v1/tasks/").status_code == 200
    assert len(callers) == 1
    token_revoke(token=token)
    assert client.get("/api/v1/tasks/").status_code == 401


def test_a_token_revoked_elsewhere_stops_working_within_the_cache_time(world, clock) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert client.get("/api/v1/tasks/").status_code == 200
    # Another web process revokes it: this one gets no signal.
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    clock.now_s += 4.9
    assert client.get("/api/v1/tasks/").status_code == 200, "remembered for up to 5 s"
    clock.now_s += 0.1
    assert client.get("/api/v1/tasks/").status_code == 401


def test_a_membership_removed_elsewhere_narrows_access_within_the_cache_time(world, clock) -> None:
    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert [t["id"] for t in client.get("/api/v1/tasks/").json()["results"]] == [world.task_a.pk]
    Membership.objects.filter(user=world.alice).update(role=Membership.Role.VIEWER)  # no signal
    body = {"queue": world.queue_a.name, "command": ["true"], "gpu_milli": 10}
    assert client.post("/api/v1/tasks/", body, format="json").status_code == 201
    clock.now_s += 5
    refused = client.post("/api/v1/tasks/", body, format="json")
    assert refused.status_code == 403 and "viewer" in refused.json()["detail"]


def test_a_membership_changed_in_this_process_is_seen_at_once(world, clock) -> None:
    from apps.tenants.services import membership_set

    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    body = {"queue": world.queue_a.name, "command": ["true"], "gpu_milli": 10}
    assert client.post("/api/v1/tasks/", body, format="json").status_code == 201
    membership_set(user=world.alice, tenant=world.tenant_a, role=Membership.Role.VIEWER)
    assert client.post("/api/v1/tasks/", body, format="json").status_code == 403


def test_a_remembered_token_is_refused_the_moment_it_expires(world, clock) -> None:
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert client.get("/api/v1/tasks/").status_code == 200
    # Expire the remembered copy itself (the row too): no clock advance, no signal.
    past = timezone.now() - timedelta(seconds=1)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=past)
    next(iter(callers._entries.values())).token.expires_at = past
    assert client.get("/api/v1/tasks/").status_code == 401


def test_a_deactivated_user_is_refused_at_once_here(world, clock) -> None:
    _, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert client.get("/api/v1/tasks/").status_code == 200
    world.alice.is_active = False
    world.alice.save()
    assert client.get("/api/v1/tasks/").status_code == 401


def test_a_cache_time_of_zero_remembers_nothing(world, clock, settings) -> None:
    settings.WHALEGEN_AUTH_CACHE_S = 0
    token, raw = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    client = _bearer(raw)
    assert client.get("/api/v1/tasks/").status_code == 200
    assert len(callers) == 0
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    assert client.get("/api/v1/tasks/").status_code == 401


def test_an_unknown_token_is_not_remembered(world, clock) -> None:
    assert _bearer("wg_" + "x" * 43).get("/api/v1/tasks/").status_code == 401
    assert len(callers) == 0


def test_a_lookup_that_raced_a_write_is_not_remembered(world, clock) -> None:
    token, _ = token_create(user=world.alice, tenant=world.tenant_a, name="ci")
    before = callers.generation
    callers.clear()  # a write lands between this lookup's read and its put
    callers.put("h", token=token, access=Access(), ttl_s=5, generation=before)
    assert callers.get("h", now=timezone.now()) is None
    callers.put("h", token=token, access=Access(), ttl_s=5, generation=callers.generation)
    assert callers.get("h", now=timezone.now()) is not None
