"""Every long-running service of the deployable stack restarts by itself (issue #11 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.faults

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yaml"
ONE_SHOT = {"migrate"}  # runs to completion once; the services that need it wait for its success


def test_every_long_running_service_in_compose_has_a_restart_policy() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "agent"} <= services.keys()
    policies = {name: service.get("restart") for name, service in services.items()}
    assert {
        name for name, policy in policies.items() if policy not in ("always", "unless-stopped")
    } == ONE_SHOT
    assert policies["migrate"] == "no"
