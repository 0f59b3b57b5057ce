"""Fixtures of the fault suite: servers of its own to break (Redis, PostgreSQL) and real processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tests.faults.services import PostgresServer, RedisServer

if TYPE_CHECKING:
    from tests.faults.harness import Stack

ROOT = Path(__file__).resolve().parents[2]
StackT = TypeVar("StackT", bound="Stack")


@pytest.fixture
def fault_dir() -> Iterator[Path]:
    """A work directory every user can traverse (PostgreSQL runs as `postgres` when the suite is root,
    and pytest's own tmp_path is private to its user), outside /tmp: each run has a /tmp of its own
    (docs/isolation.md), and the runs write their records here."""
    path = Path(tempfile.mkdtemp(prefix="whalegen-faults-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    if not os.environ.get("WHALEGEN_FAULTS_KEEP"):  # set it to read the servers' and processes' logs
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def redis_server(fault_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(fault_dir / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def postgres_server(fault_dir: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(fault_dir / "pg")
    server.init()
    server.start()
    yield server
    server.stop("immediate")


class Worker:
    """A real `celery -A whalegen.config worker`, started the way docker/compose.yaml starts it (plus a
    node name and a log file)."""

    def __init__(self, work: Path, *, name: str, env: dict[str, str], extra: tuple[str, ...] = ()) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = work / f"{name}.log"
        self.env = dict(os.environ, PYTHONPATH=str(ROOT), **env)
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "whalegen.config", "worker", "--loglevel", "INFO",
                 "-n", f"{self.name}@%h", *self.extra],
                cwd=ROOT, env=self.env, stdout=log, stderr=log,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while " ready." not in self.log():
            if not self.alive():
                raise AssertionError(f"worker {self.name} exited:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"worker {self.name} not ready after {timeout_s} s:\n{self.log()[-3000:]}"
                )
            time.sleep(0.2)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def started_stack(make: Callable[[Path], StackT], prefix: str) -> Iterator[StackT]:
    """`make(work)` started in a new work directory and stopped afterwards; the directory is removed
    unless WHALEGEN_FAULTS_KEEP is set."""
    # Outside /tmp, as `fault_dir`: the runs record their executions here and each has a /tmp of its own.
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o755)
    made = make(path)
    try:
        made.start()
        yield made
    finally:
        made.stop()
        if not os.environ.get("WHALEGEN_FAULTS_KEEP"):
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    """One production-shaped stack for a module of scenarios (starting one costs ~30 s of migrations);
    each scenario leaves it whole again (processes restarted, nodes back)."""
    from tests.faults.harness import Stack

    with started_stack(Stack, prefix="whalegen-faults-stack-") as made:
        yield made
