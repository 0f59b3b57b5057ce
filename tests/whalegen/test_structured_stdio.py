"""`whalegen.logformat.structured_stdio`: what a one-shot start-up step prints becomes log lines from the
first byte (docs/logs-and-metrics.md, "Logs"). Each case runs a small program in a process of its own, with
its stdout and stderr on pipes, as a supervisor or the compose stack runs `manage.py migrate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["time", "level", "component", "logger", "message"]

PROGRAM = """
import logging, sys, warnings
from whalegen.logformat import structured_stdio

with structured_stdio("step", prefix="step:"):
    print("step: Operations to perform:")
    sys.stdout.write("  Applying app.0001_initial...")
    sys.stdout.flush()
    sys.stdout.write(" OK\\n\\n")
    print("retrying with token=wgn_abcdefghijklmnopqrstuv", file=sys.stderr)
    warnings.warn("a library warns")
    sys.stdout.write("no newline at the end")
    if sys.argv[1] == "fail":
        raise RuntimeError("the database is not there")
"""


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "WHALEGEN_LOG_FORMAT"}
    environ.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, env=environ, timeout=60
    )


def _lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.stdout == ""  # every record goes to the log stream
    entries = [json.loads(line) for line in done.stderr.splitlines()]  # a line that is not JSON fails
    for entry in entries:
        assert list(entry)[:5] == COMMON, entry
    return entries


def test_every_line_a_start_up_step_prints_is_one_json_record() -> None:
    done = _run("ok")
    assert done.returncode == 0, done.stderr
    said = [(entry["level"], entry["logger"], entry["message"]) for entry in _lines(done)]
    assert said[:3] == [
        ("INFO", "step", "Operations to perform:"),  # without the program's prefix
        ("INFO", "step", "Applying app.0001_initial... OK"),  # printed in two pieces, one line
        ("WARNING", "step", "retrying with token=[redacted]"),  # stderr, redacted
    ]
    assert said[3][:2] == ("WARNING", "py.warnings") and "a library warns" in said[3][2]
    assert said[4:] == [("INFO", "step", "no newline at the end")]


def test_an_exception_leaving_the_step_is_one_record_with_its_traceback_and_exit_status_1() -> None:
    done = _run("fail")
    assert done.returncode == 1
    *before, last = _lines(done)
    assert before[-1]["message"] == "no newline at the end"  # what was printed before it, first
    assert last["level"] == "CRITICAL"
    assert last["message"] == "uncaught RuntimeError: the database is not there"
    assert last["exc"].startswith("Traceback") and "the database is not there" in last["exc"]


def test_plain_lines_leave_the_output_as_printed() -> None:
    done = _run("ok", WHALEGEN_LOG_FORMAT="plain")
    assert done.returncode == 0
    assert done.stdout.startswith("step: Operations to perform:\n  Applying app.0001_initial... OK\n")
    assert "token=wgn_" in done.stderr  # nothing is logged, so nothing is redacted: a person's choice
