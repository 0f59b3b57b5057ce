"""The production process set's test harness, shared by the tests in tests/ops that run it without
containers: a PostgreSQL and a Redis of the test's own, the plane's environment, and the processes
(gunicorn, Celery, `whalegen agent`) each started as a real process with its output in a file.

Each test says what differs: its ports (fixed, so the tests run under `flock /var/tmp/faults.lock`), its
environment on top of the common one and the names it removes, and whether a process's stdout and stderr
share one file (`<name>.log`) or go to two (`<name>.out`, `<name>.err`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from agents.sim.tools import install_fake_tools
from tests.faults.services import PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parents[2]
# Short intervals so a test sees cycles, health checks and plane ticks within seconds; an agent is lost
# only after 15 missed heartbeats, so a slow shared machine does not drop one mid-test.
PLANE_ENV = {
    "WHALEGEN_CYCLE_INTERVAL_S": "1",
    "WHALEGEN_NODE_HEALTH_INTERVAL_S": "1",
    "WHALEGEN_PLANE_TICK_INTERVAL_S": "1",
    "WHALEGEN_AGENT_HEARTBEAT_S": "2",
    "WHALEGEN_NODE_LOST_HEARTBEATS": "15",
}


def wait(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`predicate()`'s first truthy value, polled every 0.25 s; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass(frozen=True)
class Ports:
    """A test's own fixed ports, each overridable as `<prefix>_WEB_PORT`, `_POSTGRES_PORT`, `_REDIS_PORT`.
    Below Linux's ephemeral range, as the fault suite's (tests/faults/services.py says why)."""

    web: int
    postgres: int
    redis: int

    @classmethod
    def from_env(cls, prefix: str, *, web: int, postgres: int, redis: int) -> Ports:
        def port(name: str, default: int) -> int:
            return int(os.environ.get(f"{prefix}_{name}_PORT", str(default)))

        return cls(port("WEB", web), port("POSTGRES", postgres), port("REDIS", redis))


@dataclass
class OpsStack:
    work: Path
    ports: Ports
    secret_key: str
    env_set: dict[str, str] = field(default_factory=dict)
    env_unset: tuple[str, ...] = ("DJANGO_SETTINGS_MODULE",)
    separate_streams: bool = False
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    world: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.url = f"http://127.0.0.1:{self.ports.web}"
        self.pg = PostgresServer(self.work / "pg", port=self.ports.postgres)
        self.redis = RedisServer(self.work / "redis", port=self.ports.redis)
        self.bin_dir = install_fake_tools(self.work / "bin")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PATH": f"{self.bin_dir}:{os.environ['PATH']}",
            "DATABASE_URL": self.pg.url("whalegen"),
            "REDIS_URL": self.redis.url,
            "SECRET_KEY": self.secret_key,
            **PLANE_ENV,
            **self.env_set,
        }
        for name in self.env_unset:
            self.env.pop(name, None)

    def start_servers(self) -> None:
        """PostgreSQL with an empty `whalegen` database, and Redis."""
        self.pg.init()
        self.pg.start()
        subprocess.run(
            [str(self.pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.ports.postgres),
             "-U", "postgres", "whalegen"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.redis.start()

    def migrate_and_seed(self) -> None:
        """The schema, then tests/ops/plane_scripts.py's tenant, token and nodes (kept in `world`)."""
        self.run("manage.py", "migrate", "--noinput")
        self.world = json.loads(self.run("-m", "tests.ops.plane_scripts"))

    def spawn(self, name: str, *args: str, **env: str) -> None:
        """`python *args` as process `name`, with `env` on top of the stack's environment."""
        with contextlib.ExitStack() as files:
            out, *rest = [files.enter_context(path.open("ab")) for path in self._paths(name)]
            err = rest[0] if rest else out  # one file: stderr goes where stdout goes, in the order written
            self.procs[name] = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=dict(self.env, **env), stdout=out, stderr=err
            )

    def outputs(self, name: str) -> dict[str, str]:
        """What process `name` wrote so far, by file (`log`, or `out` and `err`)."""
        paths = self._paths(name)
        return {path.suffix[1:]: path.read_text(errors="replace") if path.exists() else "" for path in paths}

    def log(self, name: str) -> str:
        return "".join(self.outputs(name).values())

    def run(self, *args: str) -> str:
        """`python *args` to the end; fails with its output unless it exits 0. Returns its stdout."""
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=10, **kwargs)

    def answers(self, path: str) -> requests.Response | None:
        """The plane's answer to GET `path`, or None while nothing listens."""
        try:
            return self.get(path)
        except requests.RequestException:
            return None

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.world['token']}"}
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.redis.stop()
        self.pg.stop("immediate")

    def _paths(self, name: str) -> list[Path]:
        streams = ("out", "err") if self.separate_streams else ("log",)
        return [self.work / f"{name}.{stream}" for stream in streams]


@contextlib.contextmanager
def stack_in_temp_dir(prefix: str, make: Callable[[Path], OpsStack]) -> Iterator[OpsStack]:
    """`make(work)` in a new work directory, cleaned up afterwards; the directory is removed unless
    WHALEGEN_OPS_KEEP is set (set it to read the processes' output after a run)."""
    # Traversable by the `postgres` user the cluster runs as when the suite runs as root.
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    made = make(path)
    try:
        yield made
    finally:
        made.cleanup()
        if not os.environ.get("WHALEGEN_OPS_KEEP"):
            shutil.rmtree(path, ignore_errors=True)
