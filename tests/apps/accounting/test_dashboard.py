"""The dashboard's GPU-hours page: each tenant's month so far against last month, as the persona may see."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from tests.apps.accounting.conftest import NOW


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch) -> None:
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def _rows(html: str) -> list[list[str]]:
    body = html.split('<table id="accounting">', 1)[1].split("</table>", 1)[0].split("<tbody>", 1)[1]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_a_member_sees_her_tenant_this_month_against_last(month, client) -> None:
    from apps.accounting.services import budget_set

    budget_set(tenant=month.vision, pool=month.h100, gpu_hours=15, reason="plan", by=month.root)
    client.force_login(month.alice)
    response = client.get("/accounting/")
    assert response.status_code == 200
    assert _rows(response.content.decode()) == [
        ["vision", "h100-train", "18.6", "14.1", "–", "15.0", "spent: new work waits"]
    ]


def test_an_outsider_sees_an_empty_state_and_an_admin_every_tenant(month, client) -> None:
    client.force_login(month.eve)
    assert "No GPU-hours to show" in client.get("/accounting/").content.decode()
    client.force_login(month.root)
    rows = _rows(client.get("/accounting/").content.decode())
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("audio", "a100-infer", "2.0", "0.0"),
        ("vision", "h100-train", "18.6", "14.1"),
    ]
