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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests

from agents.runner import RUN_PLANE, FoundLauncher, find_launchers
from tests.e2e.conftest import AgentProcess
from tests.faults.conftest import ROOT, Worker
from tests.faults.services import PostgresServer, RedisServer

FINAL = {"succeeded", "failed", "cancelled"}
WEB_PORT = int(os.environ.get("WHALEGEN_FAULTS_WEB_PORT", "18600"))
HEARTBEAT_S = 2.0
LOST_HEARTBEATS = 10  # lost after 20 s of silence: the loaded shared 2-core machine stalls agents 8 s+
# The task: record the execution (who, which attempt, when), sleep, record its end. A second argument is
# how long later attempts sleep (a requeued attempt that must still be running when a scenario looks).
RECORDING = (
    "import os, sys, time, json\n"
    "node, task, attempt = os.environ['WHALEGEN_RUN'].rsplit('/', 2)\n"
    "base = os.path.join(os.environ['RECORD_DIR'], f'{task}.{attempt}.{os.getpid()}')\n"
    "open(base + '.start', 'w').write(json.dumps({'node': node, 'at': time.time()}))\n"
    "time.sleep(float(sys.argv[2] if attempt != '0' and len(sys.argv) > 2 else sys.argv[1]))\n"
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


@dataclass
class FencedRun:
    """One run of a node whose agent died: how its launcher ended it, from its exit file."""

    task_id: int
    attempt: int
    fenced: bool  # the exit file says the launcher stopped it when the lease ran out
    stopped_at: float  # when the launcher wrote its exit file (the run had ended by then)


@dataclass
class FenceFigures:
    """The fence at work on one node whose agent was killed (wall clock, seconds since the epoch)."""

    runs: list[FencedRun]
    lease_until: float  # what the dead agent's lease file said
    last_heartbeat_at: float  # the plane's last heartbeat from the node
    lost_at: float  # the first requeue of the node's work (its tasks' `lost` events)

    def summary(self) -> dict[str, float | int]:
        stops = [run.stopped_at for run in self.runs]
        return {
            "runs": len(self.runs),
            "fenced": sum(run.fenced for run in self.runs),
            "heartbeat_to_lease_end_s": round(self.lease_until - self.last_heartbeat_at, 2),
            "heartbeat_to_fence_s": round(max(stops) - self.last_heartbeat_at, 2) if stops else -1,
            "heartbeat_to_requeue_s": round(self.lost_at - self.last_heartbeat_at, 2),
            "fence_before_requeue_s": round(self.lost_at - max(stops), 2) if stops else -1,
        }


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
        self._gone: dict[int, float] = {}  # pid of an execution cut short → when the watcher saw it gone
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_runs, name="run-watcher", daemon=True)

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
        self._watcher.start()

    def stop(self) -> None:
        self._stopping.set()
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
    def submit(self, count: int, *, sleep_s: float = 3.0, retry_sleep_s: float | None = None) -> list[int]:
        """`count` recording tasks sleeping `sleep_s` (later attempts: `retry_sleep_s`, default the same)."""
        ids = []
        for n in range(count):
            sleeps = [str(sleep_s)] + ([str(retry_sleep_s)] if retry_sleep_s is not None else [])
            body = {
                "queue": "work",
                "name": f"fault-{n}",
                "gpu_count": 1,
                "command": ["python3", "-c", RECORDING, *sleeps],
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
        for launcher in self.launchers(name):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(launcher.pid, signal.SIGKILL)

    def kill_agent_and_watch_the_fence(self, name: str, *, timeout_s: float = 90) -> FenceFigures:
        """kill -9 the agent of `name`, leaving its runs, and watch them until the plane has requeued
        their tasks: when each launcher wrote its exit file and whether it says `fenced`. Read before the
        agent comes back (it removes a finished run's directory once it has reported it)."""
        found = {launcher.pid: launcher for launcher in self.launchers(name)}
        assert found, f"no run on {name} to fence"
        lease_file = self.agents[name].state_dir / "lease"
        self.agents[name].kill()
        # No lease file: the agent keeps no fence (a plane before protocol 1.4 granted none).
        lease_until = float(lease_file.read_text()) if lease_file.exists() else float("inf")
        task_ids = sorted({int(launcher.marker[1]) for launcher in found.values()})
        runs: dict[int, FencedRun] = {}

        def requeued() -> float | None:
            for pid, launcher in found.items():
                exit_file = Path(launcher.exit_file)
                if pid not in runs and exit_file.exists():
                    record = json.loads(exit_file.read_text())
                    runs[pid] = FencedRun(int(launcher.marker[1]), launcher.marker[2],
                                          bool(record.get("fenced")), exit_file.stat().st_mtime)  # fmt: skip
            rows = self.sql(
                "SELECT min(created_at) FROM workloads_taskevent WHERE task_id = ANY(%s) "
                "AND to_state = 'lost'",
                task_ids,
            )
            at = rows[0][0] if rows else None
            return at.timestamp() if at is not None else None

        lost_at = self.wait(requeued, timeout_s, f"the plane to requeue {name}'s tasks {task_ids}")
        requeued()  # one last look at the exit files, for a run that ended at the same instant
        heartbeat = self.sql("SELECT last_heartbeat_at FROM inventory_node WHERE name = %s", name)[0][0]
        return FenceFigures(
            runs=[
                runs.get(pid) or FencedRun(int(la.marker[1]), la.marker[2], False, float("inf"))
                for pid, la in found.items()
            ],
            lease_until=lease_until,
            last_heartbeat_at=heartbeat.timestamp(),
            lost_at=lost_at,
        )

    def launchers(self, name: str) -> list[FoundLauncher]:
        """The live launchers of node `name` of this stack's plane (another suite's stack on this host
        may have a node of the same name: its runs are its own)."""
        return [
            launcher
            for launcher in find_launchers()
            if launcher.marker[0] == name and launcher.env.get(RUN_PLANE, "").rstrip("/") == self.url
        ]

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
        by_task: dict[int, list[tuple[float, float | None, int, int]]] = {}
        for (task_id, attempt), executions in runs.items():
            by_task.setdefault(task_id, []).extend((b, e, attempt, pid) for b, e, pid in executions)
        for task_id, executions in by_task.items():
            # A task runs once at a time, whichever attempt (an old attempt still going while the plane
            # runs the next elsewhere is the double execution the fence prevents). Sweep by start: an
            # execution starting before the latest end so far overlaps that one; one without an end
            # (cut short: stopped, fenced, killed) counts as going on until its process is gone.
            latest_end, latest = float("-inf"), (0, 0)
            for began, ended, attempt, pid in sorted(executions):
                if began < latest_end:
                    counts.done_twice.append(
                        f"task {task_id}: attempt {latest[0]} (pid {latest[1]}) and attempt {attempt} "
                        f"(pid {pid}) at once"
                    )
                until = ended if ended is not None else self.gone_at(pid, began, now)
                if until > latest_end:
                    latest_end, latest = until, (attempt, pid)
            # A finished execution's result is thrown away when the work ran to its end again after it,
            # or the task ended `failed` all the same (the recording command always exits 0; `cancelled`
            # is a user's word, not the plane's). A later execution cut short (the duplicate the plane
            # stopped once the earlier result stood) discards nothing.
            state = tasks.get(str(task_id), {}).get("state")
            for _began, ended, attempt, pid in executions:
                if ended is None:
                    continue
                again = [e for b, e, a, _ in executions if a > attempt and b > ended and e is not None]
                if again or state == "failed":
                    counts.discarded.append(
                        f"task {task_id} attempt {attempt} (pid {pid}) finished, then "
                        + ("ran to its end again" if again else f"the task ended {state}")
                    )
        return counts

    def gone_at(self, pid: int, began: float, now: float) -> float:
        """When an execution without an end stopped, as the run watcher saw it go; `now` while it lives.
        One it never saw alive (gone within a look) stopped about when it began."""
        if pid in self._gone:
            return self._gone[pid]
        return now if self._alive(pid) else began

    # ---- the run watcher: when each execution cut short stopped -------------------------------------
    def _watch_runs(self) -> None:
        """Every 0.2 s, note the time each recorded execution without an end is found gone (stopped by
        the agent, the fence or a kill): the checker needs when a run cut short stopped, which the run
        itself cannot record (SIGKILL)."""
        while not self._stopping.wait(0.2):
            now = time.time()
            for start in list(self.records.glob("*.start")):
                pid = int(start.stem.split(".")[2])
                if pid not in self._gone and not start.with_suffix(".end").exists() and not self._alive(pid):
                    self._gone[pid] = now

    @staticmethod
    def _alive(pid: int) -> bool:
        """Whether `pid` is still a recording execution (not gone, not a zombie, not a reused pid)."""
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, IndexError):
            return False
        return state != "Z" and b"RECORD_DIR=" in environ

    def history(self, ids: list[int]) -> list[tuple[Any, ...]]:
        """What the plane did with these tasks and heard of their runs (for a failure's message)."""
        return self.sql(
            "SELECT task_id, created_at, from_state, to_state, reason FROM workloads_taskevent "
            "WHERE task_id = ANY(%s) ORDER BY id",
            ids,
        ) + self.sql(
            "SELECT r.task_id, r.attempt, n.name, r.state, r.reason FROM fleet_taskrun r "
            "JOIN inventory_node n ON n.id = r.node_id WHERE r.task_id = ANY(%s) ORDER BY r.id",
            ids,
        )

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
