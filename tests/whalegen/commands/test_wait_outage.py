"""`--wait` across a plane that goes away: a dropped connection, a restart's 5xx or a 429 mid-wait is not
the task's failure. The wait says so once, keeps asking until its timeout, and ends with the task's own
outcome when the plane answers again; only a plane still away at the timeout ends it, with 69."""

from __future__ import annotations

import time
from typing import Any

import pytest

from whalegen.commands._errors import EXIT_TIMEOUT, EXIT_UNREACHABLE
from whalegen.commands._http import ApiError, Unreachable
from whalegen.commands.submit import wait_for


class Plane:
    """Answers `GET /tasks/1/` from a script: an exception to raise, or the task's state."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls = 0

    def call(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", "/tasks/1/")
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(step, Exception):
            raise step
        return {"id": 1, "state": step, "why_pending": "", "exit_code": 0 if step == "succeeded" else None}


DOWN = Unreachable("cannot reach the plane at http://plane:8000: connection refused")


@pytest.mark.parametrize(
    "away", [DOWN, ApiError(502, {"detail": "bad gateway"}), ApiError(429, {"detail": "slow down"})]
)
def test_a_plane_that_goes_away_mid_wait_does_not_fail_the_job(away: Exception, capsys) -> None:
    plane = Plane(["running", away, away, away, "running", "succeeded"])
    assert wait_for(plane, [1], timeout_s=30, interval_s=0.01, quiet=True) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["task 1: running", "task 1: succeeded exit code 0"]
    assert err.count("still waiting (the task goes on) and retrying") == 1  # said once per outage
    assert "the plane answers again after" in err


def test_a_plane_still_away_at_the_timeout_ends_the_wait_with_69(capsys) -> None:
    plane = Plane(["running", DOWN])
    assert wait_for(plane, [1], timeout_s=0.2, interval_s=0.01, quiet=True) == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "gave up after 0.2 s; still not finished: 1 running" in err
    assert err.rstrip().endswith("connection refused")


def test_a_refusal_mid_wait_is_not_retried() -> None:
    plane = Plane(["running", ApiError(404, {"detail": "no task 1"})])
    with pytest.raises(ApiError):
        wait_for(plane, [1], timeout_s=5, interval_s=0.01, quiet=True)


class RunningPlane:
    """A task that runs on and prints nothing: the output long poll waits the `wait_s` it is asked for."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def call(self, method: str, path: str, params: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        if path == "/tasks/1/":
            return {"id": 1, "state": "running", "why_pending": "", "exit_code": None, "attempts": 0}
        assert path == "/tasks/1/logs/"
        wait_s = float((params or {}).get("wait_s", 0))
        self.waits.append(wait_s)
        time.sleep(wait_s)
        return {"attempt": 0, "lines": [], "next_offset": 0, "complete": False}


@pytest.mark.parametrize("quiet", [False, True], ids=["following the output", "state changes only"])
def test_the_wait_gives_up_at_its_timeout_not_a_poll_interval_later(quiet: bool, capsys) -> None:
    # `whalegen submit task.yaml --wait --timeout 1` said "gave up after 1 s" after 6 s: the output's long
    # poll and the sleep between polls each took the whole interval past the deadline.
    plane = RunningPlane()
    started = time.monotonic()
    assert wait_for(plane, [1], timeout_s=0.3, interval_s=2.0, quiet=quiet) == EXIT_TIMEOUT
    assert time.monotonic() - started < 2.0  # not one interval: the deadline bounds each wait
    assert all(wait_s <= 0.3 for wait_s in plane.waits), plane.waits
    assert "gave up after 0.3 s; still not finished: 1 running" in capsys.readouterr().err
