"""docker/alerts.yml stays true to the plane: it parses as Prometheus rule groups, every `whalegen_*`
series an expression names is one the `/metrics` collector exports, and every runbook it points at is a
section of docs/runbooks.md (or another docs page)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import yaml
from prometheus_client.core import CounterMetricFamily

from apps.metrics.collector import families
from apps.metrics.selectors import PlaneReadings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docker" / "alerts.yml"
SERIES = re.compile(r"\bwhalegen_[a-z_]+\b")


def exported_series() -> set[str]:
    """Every series name the collector writes, from a scrape of an empty plane (counters as `_total`)."""
    empty = PlaneReadings(
        now=datetime(2026, 12, 1, tzinfo=UTC), pools={}, gpus=[], units=[], tasks=[], pending=[], quotas=[],
        usage={}, latest_cycles=[], cycle_totals=[], nodes=[], open_claims=[], forecast_models=[],
        budget_used={},
    )  # fmt: skip
    names = set()
    for family in families(empty):
        names.add(f"{family.name}_total" if isinstance(family, CounterMetricFamily) else family.name)
    return names | {"whalegen_metrics_scrape_seconds"}  # added around the families by the scrape itself


def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_rule_is_a_complete_alert() -> None:
    found = rules()
    assert len(found) >= 10
    for rule in found:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule.get("alert")
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
    assert len({rule["alert"] for rule in found}) == len(found)


def test_every_series_the_rules_name_is_one_the_collector_exports() -> None:
    exported = exported_series()
    assert "whalegen_tasks_idle" in exported and "whalegen_cycle_conflicts_total" in exported
    named = {name for rule in rules() for name in SERIES.findall(rule["expr"])}
    assert named and named - exported == set()


def test_every_runbook_is_a_section_of_the_operations_guide() -> None:
    docs = ROOT / "docs"
    for rule in rules():
        target = rule["annotations"]["runbook"].split()[0]
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        if anchor:
            assert anchor in _anchors((docs.parent / path).read_text()), target
