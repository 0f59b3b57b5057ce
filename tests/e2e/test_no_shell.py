"""A fleet from an empty database to a task that ran on a joined node, with `whalegen` commands, two
`manage.py` commands (migrate, createsuperuser) and `curl` only — never `manage.py shell` or a Python
line (issue #38). This is the operator's path of docs/operations.md, run as real processes:

1. a fresh PostgreSQL database (on DATABASE_URL's server, under a name of this run's own) and a
   redis-server of its own; `manage.py migrate --noinput`;
2. the production process set: gunicorn (docker/gunicorn.conf.py), one Celery worker, beat;
3. the first platform admin (`createsuperuser --noinput`, DJANGO_SUPERUSER_* in the environment) and
   the first tenant (`whalegen apply --local`: an API token is scoped to a tenant, so before one exists
   nobody holds a token to call the API with), then the admin's token (`whalegen token create --user`);
4. `curl /readyz` until the plane is ready; the fleet file through the API (`whalegen apply -f`, twice:
   the second answers unchanged);
5. a join token (`whalegen create join-token`), a simulated GPU host that joins
   (`whalegen agent join`) and runs (`whalegen agent`, server and credential from its state directory);
6. a team member's tokens: the first made by the operator (apply made the user without a password),
   the CI token self-service through the API (`whalegen token create`), listed with curl, the first
   revoked (`whalegen token revoke`) and refused from then on;
7. `whalegen submit task.yaml --wait` with the CI token: the task runs on the joined host's GPU and
   succeeds; a failing one exits with its exit code; `whalegen get nodes/gpus -o json` shows the node with
   the GPUs `whalegen agent inspect` reads on the host.

The database, the redis-server and the web port are this run's own, so it runs beside other runs of the
suite. WHALEGEN_E2E_KEEP=1 keeps the work directory (every process's log).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from agents.sim.tools import install_fake_tools
from tests.faults.services import RedisServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# What the operator types; `python -m whalegen` is the same entry point where no script was installed.
_SCRIPT = Path(sys.executable).with_name("whalegen")
WHALEGEN = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "whalegen"]
# Seconds each process may take to stop after SIGTERM before it is killed (the ops stack's graces).
GRACE_S = {"web": 15.0, "worker": 20.0, "beat": 10.0, "agent": 10.0}
# Variables of the caller's shell that would point a command somewhere else than this run's plane.
FOREIGN = ("DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "WHALEGEN_URL",
           "WHALEGEN_TOKEN", "WHALEGEN_DATA_DIR")  # fmt: skip

FIRST_TENANT = """\
kind: Tenant
metadata: {name: ml}
spec: {display_name: Machine learning}
"""

FLEET = """\
kind: Cluster
metadata: {name: lab}
spec: {region: test}
---
kind: Pool
metadata: {name: sim}
spec: {runtime: process, description: simulated GPU hosts}
---
kind: Tenant
metadata: {name: ml}
spec: {display_name: Machine learning}
---
kind: Member
metadata: {tenant: ml, user: alice}
spec: {role: member, email: alice@example.com}
---
kind: Queue
metadata: {tenant: ml, name: train}
spec: {pool: sim}
---
kind: Quota
metadata: {tenant: ml, pool: sim}
spec: {guaranteed_gpus: 2}
"""

# The GPU host: two L40S. One model: the scheduler offers nothing on a host that mixes models (its
# snapshot excludes the node, apps/scheduling/snapshot/read.py `_read_nodes_state`).
HOST = """\
nodes:
  - name: gpu-host-1
    gpus:
      - sku: l40s
        count: 2
"""


def _task(name: str, script: str) -> str:
    return (
        f"queue: train\nname: {name}\ngpu_count: 1\ncpu_milli: 500\nhost_mem_mib: 512\nmax_runtime_s: 60\n"
        f"command: [sh, -c, {json.dumps(script)}]\n"
    )


def _free_port() -> int:
    """A free port below Linux's ephemeral range (tests/faults/services.py says why), drawn at random so
    that runs side by side do not reach for the same one."""
    for _ in range(200):
        port = random.randint(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port between 20000 and 32000")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


@dataclass
class Plane:
    work: Path
    redis: RedisServer
    url: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "".join(f"\n--- {name}.log (tail)\n{self.log(name)[-1500:]}" for name in self.procs)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with (self.work / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, cwd=ROOT, env=env or self.env, stdout=log, stderr=log, start_new_session=True
            )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:{self.logs()}")

    def run(
        self, argv: list[str], *, env: dict[str, str] | None = None, expect: int = 0, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, cwd=ROOT, env=env or self.env, capture_output=True, text=True, timeout=timeout_s
        )
        assert done.returncode == expect, (
            f"{' '.join(argv)} exited {done.returncode}, not {expect}:\n"
            f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-3000:]}{self.logs()}"
        )
        return done

    def whalegen(
        self, *args: str, token: str | None = None, env: dict[str, str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """`whalegen ARGS`; with `token`, as a client of this plane (WHALEGEN_URL, WHALEGEN_TOKEN)."""
        if token:
            env = dict(env or self.env, WHALEGEN_URL=self.url, WHALEGEN_TOKEN=token)
        return self.run([*WHALEGEN, *args], env=env, **kwargs)

    def curl(self, path: str, *, token: str | None = None) -> tuple[int, str]:
        """`curl` as an operator types it: the status and the body (status 0: nothing answered)."""
        auth = ["-H", f"Authorization: Bearer {token}"] if token else []
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}", *auth, f"{self.url}{path}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        body, _, status = done.stdout.rpartition("\n")
        return int(status or 0), body

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            value = predicate()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{self.logs()}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=GRACE_S.get(name, 10.0))
            except subprocess.TimeoutExpired:
                # Its own session (start_new_session): the group holds its gunicorn or Celery children.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _database(admin_url: str, sql: str) -> None:
    """One statement on the server's maintenance database (CREATE/DROP DATABASE run outside a
    transaction). psycopg is the plane's own driver; nothing of the plane is imported."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(make_conninfo(admin_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture
def plane() -> Iterator[Plane]:
    configured = os.environ.get("DATABASE_URL", "")
    assert configured.startswith(("postgres://", "postgresql://")), (
        "set DATABASE_URL to a PostgreSQL server: this test makes a fresh database of its own there"
    )
    assert shutil.which("curl"), "this test runs curl as the operator does: install it"
    name = f"whalegen_noshell_{os.getpid()}_{secrets.token_hex(3)}"
    # Traversable by the tenants' uids: the agent's run directories live under its state directory.
    work = Path(tempfile.mkdtemp(prefix="whalegen-noshell-"))
    work.chmod(0o755)
    redis = RedisServer(work / "redis", port=_free_port())
    bin_dir = install_fake_tools(work / "bin")  # the simulated host's nvidia-smi and MPS control
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN and not k.startswith("WHALEGEN_AGENT_")}
    env.update(
        PYTHONPATH=str(ROOT),
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        DATABASE_URL=_with_database(configured, name),
        REDIS_URL=redis.url,
        SECRET_KEY="noshell-test-only-not-secret",
        # Beat's entries every second, so the plane is ready and cycles run within a second or two.
        WHALEGEN_CYCLE_INTERVAL_S="1",
        WHALEGEN_NODE_HEALTH_INTERVAL_S="1",
        WHALEGEN_PLANE_TICK_INTERVAL_S="1",
        WHALEGEN_AGENT_HEARTBEAT_S="2",
        WHALEGEN_NODE_LOST_HEARTBEATS="15",
        WHALEGEN_ACCESS_LOG_LEVEL="WARNING",
    )
    made = Plane(work=work, redis=redis, url="", env=env)
    _database(configured, f'CREATE DATABASE "{name}"')
    try:
        redis.start()
        yield made
    finally:
        made.stop()
        redis.stop()
        with contextlib.suppress(Exception):
            _database(configured, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not os.environ.get("WHALEGEN_E2E_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def test_an_empty_database_reaches_a_task_run_on_a_joined_node_with_commands_and_curl_alone(
    plane: Plane,
) -> None:
    work = plane.work
    admin_env = dict(plane.env, DJANGO_SUPERUSER_USERNAME="root", DJANGO_SUPERUSER_EMAIL="root@example.com")
    # What a GPU host has: none of the plane's settings, only what it is given on the command line.
    host_env = {k: v for k, v in plane.env.items() if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
    for path, text in {"first.yaml": FIRST_TENANT, "fleet.yaml": FLEET, "host.yaml": HOST,
                       "hello.yaml": _task("hello", "echo hello from $CUDA_VISIBLE_DEVICES"),
                       "fails.yaml": _task("fails", "echo giving up; exit 3")}.items():  # fmt: skip
        (work / path).write_text(text)

    # 1. The empty database migrated; the process set of docs/operations.md on it.
    plane.run([sys.executable, "manage.py", "migrate", "--noinput"])
    port = _free_port()
    plane.url = f"http://127.0.0.1:{port}"
    web_env = dict(
        plane.env, WHALEGEN_WEB_BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY="2", WHALEGEN_WEB_THREADS="4"
    )
    celery = [sys.executable, "-m", "celery", "-A", "whalegen.config"]
    plane.spawn("web", [sys.executable, "-m", "gunicorn", "-c", "docker/gunicorn.conf.py",
                        "whalegen.config.wsgi"], env=web_env)  # fmt: skip
    plane.spawn("worker", [*celery, "worker", "--concurrency", "2", "-n", f"noshell-{os.getpid()}@%h",
                           "--without-gossip", "--without-mingle", "--without-heartbeat"])  # fmt: skip
    plane.spawn("beat", [*celery, "beat", "--schedule", str(work / "beat-schedule"),
                         "--pidfile", str(work / "beat.pid")])  # fmt: skip

    # 2. The first platform admin and tenant, then the admin's token: on the plane's database, by command.
    plane.run([sys.executable, "manage.py", "createsuperuser", "--noinput"], env=admin_env)
    first = plane.whalegen("apply", "--local", "-f", str(work / "first.yaml"))
    assert first.stdout.splitlines() == ["tenant/ml created"], first.stdout
    made = plane.whalegen("token", "create", "--user", "root", "--tenant", "ml", "--name", "bootstrap")
    admin = made.stdout.strip()
    assert admin.startswith("wg_") and "for root in ml, role admin" in made.stderr, made

    # 3. Ready once beat has ticked (curl, as docs/operations.md checks it); the fleet through the API.
    status, body = plane.wait(
        lambda: (answer := plane.curl("/readyz"))[0] == 200 and answer, 60, "curl /readyz to answer 200"
    )
    assert json.loads(body)["failing"] == [], body
    applied = plane.whalegen("apply", "-f", str(work / "fleet.yaml"), token=admin)
    assert applied.stdout.splitlines() == [
        "cluster/lab created",
        "pool/sim created",
        "tenant/ml unchanged",
        "member/ml/alice created",
        "  note: user 'alice' created without a password (an admin sets one)",
        "queue/ml/train created",
        "quota/ml/sim created",
    ], applied.stdout
    again = plane.whalegen("apply", "-f", str(work / "fleet.yaml"), token=admin)
    assert [line.rsplit(" ", 1)[1] for line in again.stdout.splitlines()] == ["unchanged"] * 6, again.stdout

    # 4. A GPU host joins with a join token and runs its agent; its GPUs are what it reads itself.
    join_token = plane.whalegen("create", "join-token", "--pool", "sim", "--ttl", "10m").stdout.strip()
    assert join_token.startswith("wgj_"), join_token
    host = ["--backend", "sim", "--sim-spec", str(work / "host.yaml"), "--state-dir", str(work / "agent")]
    inspected = json.loads(plane.whalegen("agent", "inspect", *host, env=host_env).stdout)
    host_gpus = {g["inventory"]["uuid"]: g["inventory"]["model"] for g in inspected["gpus"]}
    assert sorted(host_gpus.values()) == ["L40S", "L40S"], inspected
    joined = plane.whalegen("agent", "join", "--server", plane.url, "--join-token", join_token,
                            "--pool", "sim", "--name", "gpu-host-1", *host, env=host_env)  # fmt: skip
    assert "joined as node lab/gpu-host-1" in joined.stderr + joined.stdout, joined
    plane.spawn("agent", [*WHALEGEN, "agent", *host, "--heartbeat-s", "1", "--poll-wait-s", "1",
                          "--tick-s", "0.2", "--reconcile-s", "2"], env=host_env)  # fmt: skip

    # 5. Alice's tokens: her first from the operator (apply made her without a password), her CI token
    # of her own through the API; she lists hers with curl (never root's) and revokes the first.
    laptop = plane.whalegen("token", "create", "--user", "alice", "--tenant", "ml", "--name", "laptop")
    laptop_token = laptop.stdout.strip()
    ci = plane.whalegen("token", "create", "--name", "ci", "--ttl-days", "7", token=laptop_token)
    ci_token = ci.stdout.strip()
    assert ci_token.startswith("wg_") and "(ci) for alice in ml, role member" in ci.stderr, ci
    status, body = plane.curl("/api/v1/tokens/", token=ci_token)
    assert status == 200, body
    listed = {t["name"]: t for t in json.loads(body)["results"]}
    assert sorted(listed) == ["ci", "laptop"], body
    assert {t["user"] for t in listed.values()} == {"alice"} and "secret" not in listed["ci"], body
    plane.whalegen("token", "revoke", str(listed["laptop"]["id"]), token=ci_token)
    assert plane.curl("/api/v1/tokens/", token=laptop_token)[0] == 401

    # 6. A task from a file, waited for: it runs on the joined host's GPU and succeeds; a failing one
    # exits with its own exit code.
    submitted = plane.whalegen("submit", str(work / "hello.yaml"), "--wait", "--timeout", "60",
                               "--interval", "0.5", token=ci_token, timeout_s=90)  # fmt: skip
    ran_on = re.search(r"^hello from (\S+)$", submitted.stdout, re.MULTILINE)
    assert ran_on and ran_on.group(1) in host_gpus, submitted.stdout + plane.log("agent")[-2000:]
    assert re.search(r"^task \d+: succeeded exit code 0$", submitted.stdout, re.MULTILINE), submitted.stdout
    failed = plane.whalegen("submit", str(work / "fails.yaml"), "--wait", "--timeout", "60",
                            "--interval", "0.5", token=ci_token, timeout_s=90, expect=3)  # fmt: skip
    assert "giving up" in failed.stdout and re.search(r"failed exit code 3", failed.stdout), failed.stdout

    # 7. The node as the plane holds it: joined into lab/sim, ready, with the host's GPUs and UUIDs.
    nodes = json.loads(plane.whalegen("get", "nodes", "-o", "json", token=admin).stdout)["items"]
    assert [(n["metadata"]["cluster"], n["metadata"]["name"], n["spec"]["pool"], n["status"]["state"])
            for n in nodes] == [("lab", "gpu-host-1", "sim", "ready")], nodes  # fmt: skip
    assert nodes[0]["spec"]["gpus"] == [{"model": "L40S", "count": 2}], nodes
    gpus = json.loads(plane.whalegen("get", "gpus", "-o", "json", token=admin).stdout)["items"]
    assert {g["uuid"]: g["model"] for g in gpus} == host_gpus, gpus
