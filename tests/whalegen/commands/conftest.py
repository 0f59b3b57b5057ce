"""A live `whalegen demo` on the embedded default: DATABASE_URL and REDIS_URL unset, an empty data
directory, a free port. Started once per module; stopped (by its own pid) at the end."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 180  # migrations on SQLite on a busy 2-core box


@dataclass
class Demo:
    url: str
    admin_password: str
    tokens: dict[str, str]  # tenant slug → token
    env: dict[str, str]  # the environment that reaches the demo's database
    output: list[str]


def embedded_env(data_dir: Path) -> dict[str, str]:
    configured = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SECRET_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in configured}
    env["WHALEGEN_DATA_DIR"] = str(data_dir)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    data_dir = tmp_path_factory.mktemp("demo-data")
    env = embedded_env(data_dir)
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "whalegen", "demo", "--port", str(port), "--serve-seconds", "600"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()  # type: ignore[union-attr]
    output: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not any(line.lstrip().startswith("try:") for line in output):
            if process.poll() is not None and lines.empty():
                pytest.fail("whalegen demo exited early:\n" + "".join(output))
            if time.monotonic() > deadline:
                pytest.fail("whalegen demo did not announce itself in time:\n" + "".join(output))
            try:
                output.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        text = "".join(output)
        url = re.search(r"serving at (http://\S+)", text).group(1)  # type: ignore[union-attr]
        password = re.search(r"login: admin / (\S+)", text).group(1)  # type: ignore[union-attr]
        tokens = dict(re.findall(r"^\s+(\w+)\s+\w+\s+(wg_\S+)$", text, re.MULTILINE))
        yield Demo(url=url, admin_password=password, tokens=tokens, env=env, output=output)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
