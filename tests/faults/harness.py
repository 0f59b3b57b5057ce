"""The fault suite's stack and checker: the plane run the way production runs it, then broken on purpose.

`Stack` starts, in a work directory of its own: a PostgreSQL cluster and a redis-server on the suite's
ports (so restarting them leaves the machine's services alone), the migrated and seeded database,
gunicorn, real Celery worker(s) and beat (cycles and health checks every second), and one
`whalegen agent --backend sim` per node. Tasks are submitted over the REST API and run a short recording
command: every execution leaves `<task>.<attempt>.<pid>.start` and, if it ran to its end,
`….end` in the records directory, so the host itself says when an attempt ran twice or a finished run
was thrown away.

`Stack.check(ids)` waits for the tasks to end and counts, over the database and the host:
double-booked units, over-quota charges, lost tasks (live work on a lost node, submissions in no
state), stuck tasks, overlapping executions of one attempt, and finished runs whose result was
discarded (the task ran again after one of its runs had finished). A scenario is a few lines:

    ids = stack.submit(8)
    stack.wait_running(ids, at_least=3)
    stack.kill_worker()
    stack.assert_clean(ids)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests

from agents.runner import find_launchers
from tests.e2e.conftest import AgentProcess
from tests.faults.conftest import ROOT, Worker
from tests.faults.services import PostgresServer, RedisServer

FINAL = {"succeeded", "failed", "cancelled"}
WEB_PORT = int(os.environ.get("WHALEGEN_FAULTS_WEB_PORT", "18600"))
HEARTBEAT_S = 2.0
LOST_HEARTBEATS = 10  # lost after 20 s of silence: the loaded shared 2-core machine stalls agents 8 s+
# The task: record the execution (who, which attempt, when), sleep, record its end.
RECORDING = (
    "import os, sys, time, json\n"
    "node, task, attempt = os.environ['WHALEGEN_RUN'].rsplit('/', 2)\n"
    "base = os.path.join(os.environ['RECORD_DIR'], f'{task}.{attempt}.{os.getpid()}')\n"
    "open(base + '.start', 'w').write(json.dumps({'node': node, 'at': time.time()}))\n"
    "time.sleep(float(sys.argv[1]))\n"
    "open(base + '.end', 'w').write(json.dumps({'node': node, 'at': time.time()}))\n"
)


@dataclass
class Counts:
    """What the checker found; every field must be empty after any fault."""

    double_booked: list[str] = field(default_factory=list)
    over_quota: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    done_twice: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)

    def clean(self) -> bool:
        return not any(getattr(self, name) for name in self.__dataclass_fields__)

    def summary(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in self.__dataclass_fields__}


class Stack:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.records = work / "records"
        self.records.mkdir(parents=True, exist_ok=True)
        self.records.chmod(0o777)
        self.pg = PostgresServer(work / "pg")
        self.redis = RedisServer(work / "redis")
        self.url = f"http://127.0.0.1:{WEB_PORT}"
        self.env = {
            "DATABASE_URL": self.pg.url("whalegen"),
            "REDIS_URL": self.redis.url,
            "SECRET_KEY": "faults-only-not-secret",
            "WHALEGEN_AGENT_HEARTBEAT_S": str(HEARTBEAT_S),
            "WHALEGEN_NODE_LOST_HEARTBEATS": str(LOST_HEARTBEATS),
            "WHALEGEN_CYCLE_INTERVAL_S": "1",
            "WHALEGEN_NODE_HEALTH_INTERVAL_S": "1",
            "WHALEGEN_ACCESS_LOG_LEVEL": "WARNING",
        }
        self.web: subprocess.Popen[bytes] | None = None
        self.beat: subprocess.Popen[bytes] | None = None
        self.workers: list[Worker] = []
        self.agents: dict[str, AgentProcess] = {}
        self.world: dict[str, Any] = {}
        self._worker_count = 0

    # ---- start and stop -------------------------------------------------------------------------------
    def start(self) -> None:
        self.pg.init()
        self.pg.start()
        createdb = [
            str(self.pg.bin / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.pg.port),
            "-U",
            "postgres",
        ]
        subprocess.run([*createdb, "whalegen"], check=True, capture_output=True)
        self.redis.start()
        # The worker and gunicorn take their time to import the plane: let them while migrations run.
        self.start_worker()
        self.web = self._spawn_web()
        self._django("manage.py", "migrate", "--noinput")
        self.world = json.loads(self._django("-m", "tests.faults.plane_scripts", "seed").stdout)
        self.wait(self._web_up, 60, "gunicorn to answer")
        self.start_beat()
        for name, node in self.world["nodes"].items():
            agent = AgentProcess(self.work / f"agent-{name}", server=self.url, token=node["token"],
                                 node_name=name, gpus=node["gpus"])  # fmt: skip
            self.agents[name] = agent
            agent.start()
        self.wait(
            lambda: self._nodes_heard() == len(self.agents), 90, "every agent to register and heartbeat"
        )
        self.workers[0].wait_ready(timeout_s=240)

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.cleanup()
        with contextlib.suppress(Exception):
            self._kill_recorded_runs()
        self._end(self.beat)
        for worker in self.workers:
            worker.stop()
        self._end(self.web)
        self.redis.stop()
        self.pg.stop("immediate")

    def _django(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **self.env)
        env.pop("DJANGO_SETTINGS_MODULE", None)
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **self.env)
        env.pop("DJANGO_SETTINGS_MODULE", None)
        with (self.work / f"{name}.log").open("ab") as log:
            return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=log)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes] | None, signum: int = signal.SIGTERM) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signum)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ---- the plane's processes ---------------------------------------------------------------------
    def start_web(self) -> None:
        self.web = self._spawn_web()
        self.wait(self._web_up, 60, "gunicorn to answer")

    def _spawn_web(self) -> subprocess.Popen[bytes]:
        return self._spawn("gunicorn", [
            "-m", "gunicorn", "whalegen.config.wsgi", "--bind", f"127.0.0.1:{WEB_PORT}",
            "--workers", "2", "--threads", "4", "--timeout", "60", "--graceful-timeout", "5",
        ])  # fmt: skip

    def stop_web(self) -> None:
        self._end(self.web)

    def _web_up(self) -> bool:
        try:
            return requests.get(f"{self.url}/api/v1/tasks/", timeout=2).status_code in (200, 401, 403)
        except requests.RequestException:
            return False

    def start_worker(self) -> Worker:
        self._worker_count += 1
        worker = Worker(self.work / "workers", name=f"faults-{self._worker_count}", env=self.env,
                        extra=("--concurrency", "2"))  # fmt: skip
        worker.start()
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: Worker | None = None) -> None:
        """kill -9: the worker dies mid-task without a word; its unacked messages come back."""
        (worker or self.live_workers()[0]).kill()

    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.alive()]

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", [
            "-m", "celery", "-A", "whalegen.config", "beat", "--loglevel", "INFO",
            "-s", str(self.work / "beat-schedule"), "--pidfile", str(self.work / "beat.pid"),
        ])  # fmt: skip

    # ---- work ----------------------------------------------------------------------------------------
    def submit(self, count: int, *, sleep_s: float = 3.0) -> list[int]:
        ids = []
        for n in range(count):
            body = {
                "queue": "work",
                "name": f"fault-{n}",
                "gpu_count": 1,
                "command": ["python3", "-c", RECORDING, str(sleep_s)],
                "env": {"RECORD_DIR": str(self.records)},
                "max_runtime_s": 300,
                "cpu_milli": 1000,
                "host_mem_mib": 1024,
            }
            answer = self.api("post", "/api/v1/tasks/", json=body)
            assert answer.status_code == 201, answer.text
            ids.append(int(answer.json()["id"]))
        return ids

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.world['token']}"}
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg.url("whalegen"), connect_timeout=5, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def states(self, ids: list[int]) -> dict[int, str]:
        try:
            rows = self.sql("SELECT id, state FROM workloads_task WHERE id = ANY(%s)", ids)
        except psycopg.OperationalError:
            return {}  # the database is restarting
        return {int(pk): state for pk, state in rows}

    def wait_running(self, ids: list[int], at_least: int = 1, timeout_s: float = 60) -> None:
        self.wait(lambda: sum(s == "running" for s in self.states(ids).values()) >= at_least, timeout_s,
                  f"{at_least} of the tasks to run")  # fmt: skip

    def wait_final(self, ids: list[int], timeout_s: float = 120) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self.states(ids)
            if len(states) == len(ids) and all(s in FINAL for s in states.values()):
                return True
            time.sleep(0.5)
        return False

    def node_state(self, name: str) -> str | None:
        rows = self.sql("SELECT state FROM inventory_node WHERE name = %s", name)
        return rows[0][0] if rows else None

    def _nodes_heard(self) -> int:
        try:
            return int(
                self.sql("SELECT count(*) FROM inventory_node WHERE last_heartbeat_at IS NOT NULL")[0][0]
            )
        except psycopg.OperationalError:
            return 0

    @staticmethod
    def wait(predicate: Any, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    # ---- agents --------------------------------------------------------------------------------------
    def restart_agent(self, name: str, *, signum: int = signal.SIGTERM, wipe_state: bool = False,
                      down_s: float = 0.0) -> None:  # fmt: skip
        agent = self.agents[name]
        if signum == signal.SIGKILL:
            agent.kill()
        else:
            agent.stop()
        if wipe_state:
            # What the agent keeps; the simulated host's driver state (sim/) stands for the hardware.
            for child in agent.state_dir.iterdir():
                if child.name != "sim":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        time.sleep(down_s)
        agent.start()

    def kill_host(self, name: str) -> None:
        """The host dies: its agent and every run it started are killed at once (SIGKILL, no word)."""
        self.agents[name].kill()
        for launcher in find_launchers():
            if launcher.marker[0] == name:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(launcher.pid, signal.SIGKILL)

    # ---- the checker ---------------------------------------------------------------------------------
    def check(self, ids: list[int], *, timeout_s: float = 120) -> Counts:
        self.wait_final(ids, timeout_s)
        seen = json.loads(
            self._django("-m", "tests.faults.plane_scripts", "check", str(self.world["pool_id"])).stdout
        )
        counts = Counts()
        for line in seen["violations"]:
            (counts.over_quota if "limit" in line or "charged" in line else counts.double_booked).append(line)
        counts.lost += [f"task {pk} is live on a lost node" for pk in seen["live_on_lost_nodes"]]
        tasks = seen["tasks"]
        for pk in ids:
            task = tasks.get(str(pk))
            if task is None:
                counts.lost.append(f"submission {pk} is in no state")
            elif task["state"] not in FINAL:
                counts.stuck.append(f"task {pk} still {task['state']} (attempts {task['attempts']})")
        runs = self._runs()
        now = time.time()
        for (task_id, attempt), executions in runs.items():
            # Sweep by start: an execution starting before the latest end so far overlaps that one.
            latest_end, latest_pid = float("-inf"), 0
            for began, ended, pid in sorted(executions):
                if began < latest_end:
                    counts.done_twice.append(f"task {task_id} attempt {attempt}: pids {latest_pid} and {pid}")
                if (ended if ended is not None else now) > latest_end:
                    latest_end, latest_pid = (ended if ended is not None else now), pid
        for (task_id, attempt), executions in runs.items():
            later = [s for (t, a), ex in runs.items() if t == task_id and a > attempt for s, _, _ in ex]
            for _start, end, pid in executions:
                if end is not None and any(s > end for s in later):
                    counts.discarded.append(
                        f"task {task_id} attempt {attempt} (pid {pid}) finished, then ran again"
                    )
        return counts

    def running_on(self, node: str) -> list[str]:
        """The executions recorded on `node` that have not ended (their `.start` file names)."""
        found = []
        for start in self.records.glob("*.start"):
            try:
                on = json.loads(start.read_text())["node"]
            except (OSError, ValueError):
                continue  # being written this instant: the next look reads it
            if on == node and not start.with_suffix(".end").exists():
                found.append(start.name)
        return found

    def _runs(self) -> dict[tuple[int, int], list[tuple[float, float | None, int]]]:
        runs: dict[tuple[int, int], list[tuple[float, float | None, int]]] = {}
        for start in self.records.glob("*.start"):
            task_id, attempt, pid = start.stem.split(".")
            end = start.with_suffix(".end")
            began = json.loads(start.read_text())["at"]
            ended = json.loads(end.read_text())["at"] if end.exists() else None
            runs.setdefault((int(task_id), int(attempt)), []).append((began, ended, int(pid)))
        return runs

    def assert_clean(self, ids: list[int], *, timeout_s: float = 120) -> None:
        counts = self.check(ids, timeout_s=timeout_s)
        assert counts.clean(), f"{counts.summary()}\n{json.dumps(counts.__dict__, indent=1)[:4000]}"

    def _kill_recorded_runs(self) -> None:
        for start in self.records.glob("*.start"):
            pid = int(start.stem.split(".")[2])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
