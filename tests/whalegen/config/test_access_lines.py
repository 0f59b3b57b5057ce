"""The development server's request lines (`django.server`, what `whalegen demo` serves with) go through the
plane's console handler like every other line. Django's own logging config gives that logger a handler of
its own with `propagate: False`; the settings' LOGGING replaced the handler but kept `propagate: False`, so
the lines fell to Python's last-resort handler: a 4xx printed as a bare `"POST /api/v1/tokens/ HTTP/1.1"
400 148` with no time, level or request fields, and with `--verbose` (INFO) every 2xx line was dropped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EMIT = """
import django, logging
django.setup()
server = logging.getLogger("django.server")
server.info('"GET /api/v1/tasks/ HTTP/1.1" 200 512')
server.warning('"POST /api/v1/tokens/ HTTP/1.1" 400 148')
"""


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_the_dev_servers_request_lines_are_formatted_like_every_line(fmt: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "whalegen.config.settings",
        "SECRET_KEY": "test-only-not-secret",
        "WHALEGEN_DATA_DIR": str(tmp_path),
        "WHALEGEN_LOG_FORMAT": fmt,
        "WHALEGEN_ACCESS_LOG_LEVEL": "INFO",  # `whalegen demo --verbose`
    }
    done = subprocess.run(
        [sys.executable, "-c", EMIT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "HTTP/1.1" in line]
    assert len(lines) == 2, done.stderr  # the 200 too, not only what the last-resort handler lets through
    stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    for line, level in zip(lines, ["INFO", "WARNING"], strict=True):
        if fmt == "plain":
            assert re.match(rf"{stamp} {level} django\.server \"", line), line
        else:
            assert line.startswith("{") and f'"level": "{level}"' in line, line
            assert '"logger": "django.server"' in line, line
