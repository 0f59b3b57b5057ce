"""`GET /api/v1/accounting/` for the three personas, as CSV, and refusing bad input; budgets' API."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.apps.accounting.conftest import NOW, VISION_DEC, VISION_NOV

DECEMBER = "/api/v1/accounting/?from=2026-12-01&to=2027-01-01&group_by=tenant"


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch) -> None:
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def test_members_see_their_tenants_admins_all_and_outsiders_nothing(month, api) -> None:
    want = {
        "alice": {"vision": VISION_DEC},  # a member: her tenant only
        "root": {"vision": VISION_DEC, "audio": 2.0},  # a platform admin: everyone
        "eve": {},  # an outsider: nothing
    }
    for persona, hours in want.items():
        response = api(getattr(month, persona)).get(DECEMBER)
        assert response.status_code == 200, response.content
        got = {row["tenant"]: row["gpu_hours"] for row in response.json()["rows"]}
        assert got == pytest.approx(hours, abs=1e-4), persona


def test_a_member_naming_another_tenant_is_told_it_is_unknown(month, api) -> None:
    response = api(month.bob).get(DECEMBER + "&tenant=vision")
    assert response.status_code == 400
    assert response.json()["tenant"] == ["unknown tenant 'vision'"]


def test_the_report_defaults_to_this_month_so_far(month, api) -> None:
    body = api(month.alice).get("/api/v1/accounting/").json()
    assert body["from"].startswith("2026-12-01T00:00:00") and body["total"]["gpu_hours"] == pytest.approx(
        VISION_DEC, abs=1e-4
    )


def test_csv_by_format_or_accept_header(month, api) -> None:
    client = api(month.root)
    url = "/api/v1/accounting/?from=2026-11-01&to=2026-12-01&group_by=tenant,pool"
    for response in (client.get(url + "&format=csv"), client.get(url, HTTP_ACCEPT="text/csv")):
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
        lines = response.content.decode().splitlines()
        assert lines[0] == "tenant,pool,gpu_hours,tasks,cost,unpriced_gpu_hours,currency"
        assert lines[1:] == [f"vision,h100-train,{round(VISION_NOV, 4)},3,,0.0,"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("from=yesterday", "from"),
        ("from=2026-12-02&to=2026-12-01", "to"),
        ("to=2026-11-15", "to"),
        ("group_by=tenant,colour", "group_by"),
        ("group_by=pool,pool", "group_by"),
        ("gpu_model=H900", "gpu_model"),
        ("pool=nowhere", "pool"),
        ("format=xml", "format"),
    ],
    ids=["a date it cannot read", "an empty range", "a range ending before this month's start",
         "an unknown group", "a group twice", "an unknown model", "an unknown pool", "an unknown format"],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field(db, api, query, field) -> None:
    from tests.apps.factories import UserFactory

    root = UserFactory(username="root", is_staff=True)
    for accept in ("application/json", "text/csv"):
        response = api(root).get(f"/api/v1/accounting/?{query}", HTTP_ACCEPT=accept)
        assert response.status_code == 400, response.content
        body = response.json()  # the project's error shape, JSON even when CSV was asked for
        assert body["detail"].startswith("invalid input") and field in body


def test_anonymous_callers_are_refused(api) -> None:
    assert api(None).get("/api/v1/accounting/").status_code == 401


def test_only_platform_admins_set_budgets_and_each_change_is_audited(month, api) -> None:
    body = {"tenant": "vision", "pool": "h100-train", "gpu_hours": 10, "reason": "December plan"}
    assert api(month.alice).post("/api/v1/budgets/", body, format="json").status_code == 403
    first = api(month.root).post("/api/v1/budgets/", body, format="json")
    assert first.status_code == 200, first.content
    raised = (
        api(month.root)
        .post("/api/v1/budgets/", {**body, "gpu_hours": 25, "reason": "paper deadline"}, format="json")
        .json()
    )
    assert raised["gpu_hours"] == 25 and raised["used_gpu_hours"] == pytest.approx(VISION_DEC, abs=1e-4)
    assert raised["spent"] is False
    assert [(c["actor"], c["old_gpu_hours"], c["new_gpu_hours"], c["reason"]) for c in raised["changes"]] == [
        ("user:root", None, 10.0, "December plan"),
        ("user:root", 10.0, 25.0, "paper deadline"),
    ]
    # Members read their tenants' budgets; others see none.
    assert [b["tenant"] for b in api(month.alice).get("/api/v1/budgets/").json()] == ["vision"]
    assert api(month.bob).get("/api/v1/budgets/").json() == []
    no_reason = api(month.root).post("/api/v1/budgets/", {**body, "reason": " "}, format="json")
    assert no_reason.status_code == 400
