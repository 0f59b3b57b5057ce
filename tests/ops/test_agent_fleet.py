"""Fifty real node agents on the plane started as shipped (issue #42 item 2): the production process set
(gunicorn from docker/gunicorn.conf.py, the compose file's Celery worker and beat, PostgreSQL, Redis) with
every setting at its default, and `agents.agent.Agent` itself — its loop, poller and HTTP client, on the
simulated NVML backend — at the pace the plane hands it, while an API client and a writer changing nodes'
desired states work beside them. The run is `benchmarks/agent_fleet.py`'s; this test holds it to what must
be true on any machine, not to its timings.

Fixed ports (`WHALEGEN_FAULTS_POSTGRES_PORT` / `WHALEGEN_FAULTS_REDIS_PORT`, web `WHALEGEN_OPS_FLEET_WEB_PORT`
18622): run it under the faults lock, as tests/faults and tests/ops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.agent_fleet import run_fleet

pytestmark = pytest.mark.e2e

AGENTS = 50
WEB_PORT = int(os.environ.get("WHALEGEN_OPS_FLEET_WEB_PORT", "18622"))


@pytest.fixture
def work() -> Iterator[Path]:
    # Traversable by the `postgres` user the cluster runs as when the suite runs as root.
    path = Path(tempfile.mkdtemp(prefix="whalegen-ops-fleet-"))
    path.chmod(0o755)
    yield path
    if not os.environ.get("WHALEGEN_OPS_KEEP"):
        shutil.rmtree(path, ignore_errors=True)


def test_fifty_real_agents_on_the_shipped_plane_lose_no_node_and_the_api_answers(work: Path) -> None:
    figures = run_fleet(
        work, agents=AGENTS, procs=1, duration_s=60.0, web_port=WEB_PORT, poll_wait_s=None, changes_per_s=1.0
    )
    # Every agent registered, fetched and applied its desired state, and heartbeated through the window.
    assert figures["registered"] == AGENTS
    assert figures["applied_a_desired_state"] == AGENTS
    assert figures["agents_silent_the_whole_window"] == 0
    assert figures["heartbeat"]["count"] >= AGENTS
    # No node lost while every agent kept running: a loss here would be the plane's, not the network's.
    assert figures["nodes_falsely_lost"] == 0
    # The shipped default holds no long poll: the agents fetched the writer's changes on the heartbeat's hint.
    assert figures["long_poll"]["count"] == 0
    assert figures["desired_state_changes"] > 0 and figures["fetch"]["count"] > 0
    assert figures["fetch"]["failed"] == 0
    # The API answered beside the agents, every call.
    assert figures["api"]["count"] > 0
    assert figures["api"]["failed"] == 0, figures["api"]["failures"]
