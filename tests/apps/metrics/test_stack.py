"""The compose stack's Prometheus scrapes the plane's /metrics with the plane's metrics token.

Docker is not available where these tests run, so the files are checked as data: both parse as YAML,
the scrape target is the web service's port and the endpoint's path, and the token Prometheus reads is
the secret filled from the same variable the plane reads.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from django.urls import resolve

DOCKER = Path(__file__).resolve().parents[3] / "docker"


def test_compose_runs_prometheus_scraping_the_web_service_with_the_metrics_token() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    prometheus = compose["services"]["prometheus"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert prometheus["secrets"] == ["metrics_token"]
    assert compose["secrets"]["metrics_token"] == {"environment": "WHALEGEN_METRICS_TOKEN"}
    # The plane reads the same variable (x-plane is merged into web, worker, beat, migrate).
    web = compose["services"]["web"]
    assert web["environment"]["WHALEGEN_METRICS_TOKEN"].startswith("${WHALEGEN_METRICS_TOKEN")
    assert web["ports"] == ["8000:8000"]

    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["web:8000"]}]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/metrics_token"}
    assert resolve(job["metrics_path"]).url_name == "metrics"
    assert "web" in web["environment"]["ALLOWED_HOSTS"].split(",")
