"""`whalegen accounting` against the real API (in-process, no server), and the budget gauges."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from tests.apps.accounting.conftest import NOW, VISION_DEC


@pytest.fixture(autouse=True)
def frozen_now(monkeypatch) -> None:
    monkeypatch.setattr(timezone, "now", lambda: NOW)


class _Answer:
    def __init__(self, response: Any) -> None:
        self.status_code = response.status_code
        self.content = response.content
        self.text = response.content.decode()

    def json(self) -> Any:
        return json.loads(self.content)


class InProcessSession:
    """What `requests.Session.request` would do, through Django's test client as `user`."""

    def __init__(self, user: Any) -> None:
        from rest_framework.test import APIClient

        self.client = APIClient()
        self.client.force_authenticate(user=user)
        self.headers: dict[str, str] = {}

    def request(self, method: str, url: str, *, params: Any = None, headers: Any = None, **_: Any) -> _Answer:
        path = url.split("://", 1)[1].split("/", 1)[1]
        accept = (headers or {}).get("Accept", self.headers.get("Accept", "application/json"))
        return _Answer(getattr(self.client, method.lower())(f"/{path}", params, HTTP_ACCEPT=accept))


def _run(user: Any, argv: list[str], monkeypatch: Any) -> int:
    import argparse

    from whalegen.commands import accounting
    from whalegen.commands._http import Client

    def from_args(cls: type[Client], args: argparse.Namespace) -> Client:
        client = Client("http://plane.test", "unused")
        client.session = InProcessSession(user)  # type: ignore[assignment]
        return client

    monkeypatch.setattr(Client, "from_args", classmethod(from_args))
    parser = argparse.ArgumentParser()
    accounting.add_arguments(parser)
    return accounting.run(parser.parse_args(argv))


def test_the_command_prints_a_table_with_a_total(month, monkeypatch, capsys) -> None:
    code = _run(
        month.root, ["--from", "2026-12-01", "--to", "2027-01-01", "--by", "tenant,pool"], monkeypatch
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[1].split() == ["TENANT", "POOL", "GPU-HOURS", "TASKS"]
    assert out[2].split() == ["audio", "a100-infer", "2.000", "1"]
    assert out[3].split() == ["vision", "h100-train", f"{VISION_DEC:.3f}", "4"]
    assert out[5].split() == ["total", f"{VISION_DEC + 2:.3f}", "5"]


def test_the_command_prints_csv_and_reports_refusals(month, monkeypatch, capsys) -> None:
    assert _run(month.alice, ["--by", "pool", "--csv"], monkeypatch) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"h100-train,{round(VISION_DEC, 4)},4,")
    assert _run(month.alice, ["--by", "colour"], monkeypatch) == 65  # refused as invalid (docs/ci.md)
    assert "group_by: cannot group by colour" in capsys.readouterr().err


def test_metrics_show_each_budget_and_its_use(month) -> None:
    from prometheus_client import generate_latest

    from apps.accounting.services import budget_set
    from apps.metrics.collector import registry_for

    budget_set(tenant=month.vision, pool=month.h100, gpu_hours=500, reason="plan", by=month.root)
    text = generate_latest(registry_for(now=NOW)).decode()
    assert 'whalegen_budget_limit_gpu_hours{pool="h100-train",tenant="vision"} 500.0' in text
    used = [line for line in text.splitlines() if line.startswith("whalegen_budget_used_gpu_hours{")]
    assert len(used) == 1 and float(used[0].rsplit(" ", 1)[1]) == pytest.approx(VISION_DEC)
