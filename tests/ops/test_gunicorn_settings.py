"""The image's gunicorn settings (docker/gunicorn.conf.py) do what docs/fleet.md ("Heartbeat load") says
they are for, with a real gunicorn and the real agent client: a heartbeat reuses the agent's connection
after an idle pause longer than gunicorn's own keep-alive (2 s), and requests held open by long polls do
not stop a heartbeat from being answered."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from agents.client import PlaneClient
from whalegen import protocol as p

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def server() -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), WHALEGEN_WEB_BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY="1",
               WHALEGEN_WEB_THREADS="4")  # fmt: skip
    env.pop("WHALEGEN_WEB_KEEPALIVE_S", None)
    env.pop("WHALEGEN_AGENT_HEARTBEAT_S", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "docker/gunicorn.conf.py", "tests.ops.wsgi_remote_port"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/up/", timeout=1)
                break
            except requests.RequestException:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("gunicorn did not answer in 30 s") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def heartbeat() -> p.Heartbeat:
    return p.Heartbeat(node_id="1", agent_version="test", sent_at_s=time.time())


def test_a_heartbeat_reuses_the_agents_connection_after_a_pause_past_gunicorns_default(server: str) -> None:
    client = PlaneClient(server, "token")
    first = client.heartbeat(heartbeat()).generation
    time.sleep(3.0)  # past gunicorn's own keep-alive (2 s), well within the image's (30 s)
    assert client.heartbeat(heartbeat()).generation == first  # the same client port: the same connection
    client.close()


def test_long_polls_holding_threads_do_not_stop_a_heartbeat(server: str) -> None:
    """Three requests held for a second on a worker of four threads: the heartbeat sent after them is
    answered before them (a sync worker, one request at a time, answers it after all three)."""

    def held() -> float:
        assert requests.get(server + "/slow/", timeout=30).status_code == 200
        return time.monotonic()

    client = PlaneClient(server, "token")
    with ThreadPoolExecutor(max_workers=3) as pool:
        polls = [pool.submit(held) for _ in range(3)]
        time.sleep(0.3)
        client.heartbeat(heartbeat())
        answered_at = time.monotonic()
        assert answered_at < min(poll.result() for poll in polls)
    client.close()
