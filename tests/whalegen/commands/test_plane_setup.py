"""An operator's command run on the plane logs plain lines at a terminal and JSON otherwise: `whalegen
create join-token` printed `{"time": …, "message": "cli:root made join token …"}` beside its own sentence
in the operator's terminal. Real terminals and pipes: a pseudo-terminal from os.openpty, a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Set up as an operator's command does, then log as the plane's services do.
EMIT = """
from whalegen.commands._plane import plane_setup
plane_setup()
import logging
logging.getLogger("whalegen.fleet").info("cli:root made join token demo-1 for pool h100-train")
"""


def _run(stderr: int, env_extra: dict[str, str], tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != "WHALEGEN_LOG_FORMAT"}
    env.update({"SECRET_KEY": "test-only-not-secret", "WHALEGEN_DATA_DIR": str(tmp_path), **env_extra})
    done = subprocess.run([sys.executable, "-c", EMIT], cwd=ROOT, env=env, stderr=stderr, timeout=120)
    assert done.returncode == 0


def _read(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


@pytest.mark.parametrize(
    ("terminal", "env_extra", "want_json"),
    [(True, {}, False), (False, {}, True), (True, {"WHALEGEN_LOG_FORMAT": "json"}, True)],
    ids=["at a terminal: plain", "piped or in a container: JSON", "asked for JSON at a terminal"],
)
def test_an_operator_command_logs_plain_at_a_terminal(
    terminal: bool, env_extra: dict[str, str], want_json: bool, tmp_path: Path
) -> None:
    if terminal:
        reader, writer = os.openpty()
    else:
        reader, writer = os.pipe()
    try:
        _run(writer, env_extra, tmp_path)
    finally:
        os.close(writer)
    line = next(line for line in _read(reader).splitlines() if "made join token" in line)
    os.close(reader)
    assert line.lstrip().startswith("{") == want_json, line
