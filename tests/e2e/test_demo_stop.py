"""`whalegen demo` stops within seconds of SIGTERM or Ctrl-C, whatever its options (issue 42): with
`--serve-seconds 120 --agents 1` it was still running 40 s after SIGTERM. Its agent and the tasks the
agent ran are gone too: a demo leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
STOPS_WITHIN_S = 10.0


def _wait_for(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_the_demo_stops_within_seconds_of_a_signal(tmp_path: Path, signum: int) -> None:
    configured = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SECRET_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in configured}
    env.update(WHALEGEN_DATA_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    log_path = tmp_path / "demo.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "whalegen", "demo", "--port", "0", "--serve-seconds", "120",
             "--agents", "1", "--workload-interval-s", "1", "--seed", "3"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        _wait_for(lambda: "try:" in log_path.read_text(), 120, "the demo to serve")
        agent_log = _wait_for(lambda: next(tmp_path.glob("agents/*/agent.log"), None), 30, "its agent")
        # A task runs on the agent: the stop must take it down too.
        running = re.compile(r"task \d+ attempt \d+ running")
        _wait_for(lambda: running.search(agent_log.read_text()), 90, "a task to run on the agent")
        sent = time.monotonic()
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
        took_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert took_s < STOPS_WITHIN_S, f"stopped {took_s:.1f} s after the signal"
    assert code in (0, -signum, 128 + signum), log_path.read_text()[-2000:]
    # Nothing of the demo is left running: no agent, no task it started (their command lines name the
    # demo's data directory).
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert left == [], re.sub(r"\s+", " ", subprocess.run(["ps", "-fp", ",".join(left)], capture_output=True,
                                                          text=True).stdout)  # fmt: skip
