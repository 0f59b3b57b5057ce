"""Heartbeat load: N simulated agents heartbeating every `interval` seconds against gunicorn + PostgreSQL.

    python benchmarks/heartbeat_load.py [--agents 2000] [--interval-s 10] [--duration-s 60] [--gpus 4]
        [--web-port P] [--keep-alive-s 30]

Starts a PostgreSQL cluster of its own (port WHALEGEN_FAULTS_POSTGRES_PORT, default 15434), migrates and
seeds N nodes, starts gunicorn (port --web-port, default $WHALEGEN_BENCH_WEB_PORT or 18601) and one
Celery worker + beat on a Redis of its own (port WHALEGEN_FAULTS_REDIS_PORT, default 16381) so that the
plane's periodic tasks (node-health check, scheduling cycles) run as in production. Each simulated agent
is the real agent HTTP client (`agents.client.PlaneClient`: its session, timeouts and error mapping)
sending `Register` once and then a `Heartbeat` with its GPUs' inventory and telemetry every interval,
spread evenly over the interval; a pool of sender threads keeps the schedule.

Windows, in this order, each with a progress line on stderr: registration; one warm-up heartbeat per
agent; the load window (`--duration-s`); one more node-health check; the idle baseline (two intervals,
no heartbeats: every agent silent at once, which the plane takes for its own deafness and loses nobody
for); the floors (`--floor-s` each, default one interval, at the load's request rate, each a request
refused by design): the heartbeat front refusing an unknown token, Django's handler with its middleware
to the plain heartbeat view refusing the method, Django + DRF refusing an unknown token on the reports
endpoint, and gunicorn alone (`benchmarks/floor_wsgi.py` in place of the plane's application).

With `--poll`, a second load window as long as the first follows it: the same heartbeats, and each
agent also keeps its desired state as the real agent does (`SimAgent`: a long poll held on a second
client when the plane's `poll_wait_s` is above 0 — `--plane-poll-wait-s`, default the plane's 20 s —,
else a fetch after registering and after each heartbeat whose answer names a newer generation), while a
writer changes `--changes-per-s` nodes' desired states (one GPU's partition mode flipped, the node
marked as the plane's writers mark it). Its figures (`desired_state`): plane CPU with and without the
desired state in the same run, the difference per agent and per change, and how long a change took to
reach its agent. `--plane-root DIR` runs the plane from another checkout (a baseline: the same load on
another commit's code); `--no-floors` skips the floors.

Prints, as text and JSON: the settings, heartbeats ok / failed / due / not sent, p50/p99/max latency,
plane CPU from /proc utime+stime as a share of one core, by part (web: gunicorn master+workers; db:
every PostgreSQL backend; redis: the Redis server, broker and heartbeat liveness store; worker: Celery
worker + beat, whose node-health check flushes the liveness to PostgreSQL) and in all, for the load
window and the idle baseline of the same run, their ratio, CPU per heartbeat above the idle baseline
against the budget (half a core over the heartbeats due per second), each floor's CPU per request and
the heartbeat/floor ratios, and nodes lost: before the load (silent from registration to their warm-up
heartbeat past the threshold: the generator's pause, not the plane's fault), falsely lost (every agent
kept beating through the load window: any node lost by its end is a false loss), and lost in the idle
baseline (should be none). The load generator's own CPU is not counted: it shares the 2 cores, so wall-
clock latency is noisy; CPU seconds and same-run ratios are the figures that count. Nothing here fails
on timing.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.client import PlaneClient, PlaneRejected, PlaneUnavailable  # noqa: E402
from tests.faults.services import PostgresServer, RedisServer  # noqa: E402
from whalegen.protocol import (  # noqa: E402
    HEARTBEAT_PATH,
    REPORT_PATH,
    DesiredState,
    GpuInventory,
    Heartbeat,
    Register,
    TelemetrySample,
)

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_STARTED = time.monotonic()


def progress(message: str) -> None:
    """One line on stderr, with the seconds since the benchmark started (long work shows progress)."""
    print(f"[heartbeat-load {time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def cpu_of(pid: int) -> float | None:
    """CPU seconds (utime + stime) of a live process; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                found.append(int(entry))
    return found


class Plane:
    def __init__(
        self,
        work: Path,
        *,
        web_port: int,
        gunicorn_workers: int,
        threads: int,
        keep_alive_s: float,
        root: Path = ROOT,
        poll_wait_s: float | None = None,
    ) -> None:
        self.work = work
        self.root = root  # the plane's code: this tree, or another checkout (`--plane-root`, a baseline)
        self.web_port = web_port
        self.url = f"http://127.0.0.1:{web_port}"
        self.pg = PostgresServer(work / "pg")
        self.redis = RedisServer(work / "redis")
        self.gunicorn_workers, self.threads = gunicorn_workers, threads
        self.keep_alive_s = keep_alive_s
        self.env = dict(
            os.environ,
            PYTHONPATH=str(root),
            DATABASE_URL=self.pg.url("whalegen"),
            REDIS_URL=self.redis.url,
            SECRET_KEY="bench-only-not-secret",
            WHALEGEN_ACCESS_LOG_LEVEL="WARNING",
            WHALEGEN_NODE_HEALTH_INTERVAL_S="5",
        )
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        if poll_wait_s is not None:
            self.env["WHALEGEN_AGENT_POLL_WAIT_S"] = f"{poll_wait_s:g}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=self.root, env=self.env, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"{args} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *args], cwd=self.root, env=self.env, stdout=log, stderr=log
            )
        self.procs.append(proc)
        return proc

    def start(self, nodes: int, gpus: int, heartbeat_s: float) -> dict[str, str]:
        self.env["WHALEGEN_AGENT_HEARTBEAT_S"] = str(heartbeat_s)
        progress(f"starting PostgreSQL (port {self.pg.port}) and Redis (port {self.redis.port})")
        self.pg.init()
        self.pg.start()
        subprocess.run([str(self.pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg.port), "-U",
                        "postgres", "whalegen"], check=True)  # fmt: skip
        self.redis.start()
        progress("migrating")
        self.run("manage.py", "migrate", "--noinput")
        progress(f"seeding {nodes} nodes of {gpus} GPUs")
        tokens: dict[str, str] = json.loads(
            self.run("-m", "tests.faults.plane_scripts", "seed-fleet", str(nodes), str(gpus))
        )["tokens"]
        progress(f"starting gunicorn (port {self.web_port}), Celery worker and beat")
        self.web = self.gunicorn("whalegen.config.wsgi")
        self.worker = self.spawn("worker", "-m", "celery", "-A", "whalegen.config", "worker", "--pool",
                                 "solo", "--loglevel", "WARNING")  # fmt: skip
        schedule, pidfile = str(self.work / "beat-schedule"), str(self.work / "beat.pid")
        self.beat = self.spawn("beat", "-m", "celery", "-A", "whalegen.config", "beat", "--loglevel",
                               "WARNING", "-s", schedule, "--pidfile", pidfile)  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._answers():
            if time.monotonic() > deadline:
                raise SystemExit("gunicorn did not answer in 120 s")
            time.sleep(0.5)
        return tokens

    def gunicorn(self, app: str) -> subprocess.Popen[bytes]:
        return self.spawn("gunicorn", "-m", "gunicorn", app, "--bind", f"127.0.0.1:{self.web_port}",
                          "--workers", str(self.gunicorn_workers), "--threads", str(self.threads),
                          "--timeout", "60", "--keep-alive", f"{self.keep_alive_s:g}",
                          # Every agent may hold a connection open between beats (keep-alive).
                          "--worker-connections", "4000")  # fmt: skip

    def serve_bare_floor(self) -> None:
        """Replace the plane's gunicorn by one serving `benchmarks/floor_wsgi.py` (same workers, threads
        and port): the bare-WSGI floor. Celery and PostgreSQL keep running."""
        self.web.terminate()
        self.web.wait(timeout=30)
        self.web = self.gunicorn("benchmarks.floor_wsgi")
        deadline = time.monotonic() + 60
        while not self._answers():
            if time.monotonic() > deadline:
                raise SystemExit("the bare gunicorn did not answer in 60 s")
            time.sleep(0.5)

    def _answers(self) -> bool:
        import requests

        try:
            return requests.get(f"{self.url}/api/v1/tasks/", timeout=2).status_code < 500
        except requests.RequestException:
            return False

    def plane_pids(self) -> dict[str, list[int]]:
        """The plane's processes by part: web (gunicorn master and workers), database (postmaster and
        every backend), redis (the broker, and the heartbeats' liveness store: apps.fleet.liveness),
        worker + beat (Celery, with any child it forks)."""
        postmaster = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        celery = [self.worker.pid, self.beat.pid]
        return {
            "web": [self.web.pid, *children(self.web.pid)],
            "db": [postmaster, *children(postmaster)],
            "worker": [*celery, *(child for pid in celery for child in children(pid))],
            "redis": [self.redis.proc.pid] if self.redis.proc is not None else [],
        }

    def shortcut_calls(self) -> int:
        """Heartbeats answered by the liveness script in Redis so far (its EVALSHA calls, including
        those that sent the heartbeat the full way)."""
        import redis

        stats = redis.Redis.from_url(self.redis.url).info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    def web_footprint(self) -> tuple[float, int]:
        """The web tier's resident memory (MiB, master and workers) and the TCP connections open to it
        (server side, established): what agents holding their connection between beats cost it."""
        rss_kib = 0
        for pid in [self.web.pid, *children(self.web.pid)]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss_kib += int(line.split()[1])
        port = f"{self.web_port:04X}"
        open_ = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError):
                for row in Path(table).read_text().splitlines()[1:]:
                    local, state = row.split()[1], row.split()[3]
                    open_ += int(local.endswith(f":{port}") and state == "01")
        return round(rss_kib / 1024, 1), open_

    def lost_nodes(self) -> int:
        import psycopg

        with psycopg.connect(self.pg.url("whalegen"), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM inventory_node WHERE state = 'lost'").fetchone()
        return int(row[0]) if row else 0

    def node_row_updates(self) -> int:
        """Updates of node rows so far (PostgreSQL's statistics): every heartbeat the plane processes
        updates its node's row once, whether or not the client waited for the answer; nothing else
        writes node rows in a steady run (a node marked lost is counted in `nodes_falsely_lost`)."""
        import psycopg

        with psycopg.connect(self.pg.url("whalegen"), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
            row = conn.execute(
                "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'inventory_node'"
            ).fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.redis.stop()
        self.pg.stop("immediate")


class SimAgent:
    """One node's heartbeat as the real agent sends it, through the real agent client; with `--poll`, also
    what the real agent does for its desired state (`agents.agent.Agent._poll_loop`): a long poll held on
    a second client when the plane's `poll_wait_s` is above 0, else a fetch after registering and after
    each heartbeat whose answer names a newer generation than the one held."""

    def __init__(self, url: str, name: str, token: str, gpus: int) -> None:
        self.name = name
        self.client = PlaneClient(url, token)
        self.poll_client = PlaneClient(url, token)
        self.inventory = tuple(
            GpuInventory(
                j, f"GPU-bench-{name}-{j}", "NVIDIA L40S", "L40S", 46_068, f"0000:{j:02x}:00.0", False
            )
            for j in range(gpus)
        )
        self.node_id: str | None = None
        self.poll_wait_s = 20.0  # the plane's, from `Registered`
        self.generation = 0  # the desired state's generation held
        self.hinted = False  # a heartbeat named a newer generation: fetch
        self.changed_at: float | None = None  # when the simulated writer last changed this node
        self.lock = threading.Lock()

    def register(self) -> None:
        """Register as the agent does at start-up: a plane slow to answer is asked again (not measured)."""
        message = Register(node_name=self.name, hostname=self.name, agent_version="bench",
                           inventory=self.inventory)  # fmt: skip
        for attempt in range(5):
            try:
                registered = self.client.register(message)
                self.node_id, self.poll_wait_s = registered.node_id, registered.poll_wait_s
                return
            except PlaneUnavailable:
                if attempt == 4:
                    raise
                time.sleep(2.0 * (attempt + 1))

    def warm_up(self) -> None:
        """One heartbeat before the measured window; an overloaded plane may time it out (not counted)."""
        with contextlib.suppress(PlaneUnavailable, PlaneRejected):
            self.heartbeat()

    def message(self) -> Heartbeat:
        """The heartbeat of an idle node of this many GPUs: inventory, telemetry, no runs."""
        assert self.node_id is not None
        now = time.time()
        telemetry = tuple(
            TelemetrySample(g.uuid, now, 1024, 46_068, 37, 12, 140.0, 350.0, 55, 1800, 9000, 0)
            for g in self.inventory
        )
        return Heartbeat(node_id=self.node_id, agent_version="bench", sent_at_s=now,
                         inventory=self.inventory, telemetry=telemetry, running=(),
                         generation_applied=self.generation)  # fmt: skip

    def heartbeat(self) -> None:
        ack = self.client.heartbeat(self.message())
        if ack.generation > self.generation:  # the agent's rule (`Agent._heartbeat`)
            self.hinted = True

    def floor_request(self, method: str, path: str, expect: int) -> bool:
        """A floor's request: the heartbeat this agent would send, as `method` to `path`, through the same
        client; True when the plane answered `expect` (the floors are refusals by design)."""
        try:
            self.client._request(method, path, body=self.message())
        except PlaneRejected as error:
            return error.status == expect
        except PlaneUnavailable:
            return False
        return False

    def beat(self) -> bool:
        try:
            self.heartbeat()
        except (PlaneUnavailable, PlaneRejected):
            return False
        return True

    # ---- the desired state (`--poll`) ----
    def _took(self, desired: DesiredState | None, stats: PollStats) -> None:
        if desired is None or desired.generation == self.generation:
            stats.count("unchanged")
            return
        self.generation = desired.generation
        stats.count("new")
        with self.lock:
            changed_at, self.changed_at = self.changed_at, None
        if changed_at is not None:
            stats.latency(time.monotonic() - changed_at)

    def fetch(self, stats: PollStats) -> None:
        """No long poll: what the agent's poller does when told to fetch."""
        self.hinted = False
        try:
            self._took(self.poll_client.desired_state(self.generation, 0.0), stats)
        except (PlaneUnavailable, PlaneRejected):
            stats.count("failed")
            self.hinted = True  # still owed, as the agent keeps it

    def long_poll(self, stop: threading.Event, stats: PollStats) -> None:
        """The agent's poller thread with a long poll: one request held at a time until `stop`."""
        while not stop.is_set():
            try:
                self._took(self.poll_client.desired_state(self.generation, self.poll_wait_s), stats)
            except (PlaneUnavailable, PlaneRejected):
                stats.count("failed")
                stop.wait(1.0)

    def beat_and_fetch(self, stats: PollStats) -> bool:
        """A heartbeat (timed as the load's), then the fetch its answer asked for, in hint mode."""
        ok = self.beat()
        if self.poll_wait_s <= 0 and self.hinted:
            began = time.perf_counter()
            self.fetch(stats)
            stats.fetch_s(time.perf_counter() - began)
        return ok


class PollStats:
    """What the agents' desired-state requests got: new states, unchanged answers (204 or the same
    generation), failures, the time from a simulated change to the agent holding it, fetch latencies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {"new": 0, "unchanged": 0, "failed": 0}
        self.latencies: list[float] = []
        self.fetches: list[float] = []
        self.initial: tuple[float, float] | None = None  # the fetches after registering: wall s, CPU s

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def latency(self, seconds: float) -> None:
        with self.lock:
            self.latencies.append(seconds)

    def fetch_s(self, seconds: float) -> None:
        with self.lock:
            self.fetches.append(seconds)


class Writer:
    """A stand-in for the plane's writers (a cycle assigning work, a task ending): `per_s` times a second
    one node's desired state really changes — one GPU's partition mode flips between whole and
    time-sliced, so its layout differs — and the node is marked as the plane's writers mark it
    (`apps.fleet.changes`: HINCRBY of the `mark` field of the node's hash in Redis after the commit). A
    plane without marks (the baseline) ignores the field and finds the change by re-checking."""

    def __init__(self, plane: Plane, agents: list[SimAgent], per_s: float, seed: int = 1) -> None:
        self.plane, self.agents, self.per_s = plane, agents, per_s
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.changes = 0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        import psycopg
        import redis

        marks = redis.Redis.from_url(self.plane.redis.url)
        flip = """UPDATE inventory_gpu SET partition_mode = CASE WHEN partition_mode = 'whole'
                  THEN 'timeslice' ELSE 'whole' END
                  WHERE id = (SELECT min(id) FROM inventory_gpu WHERE node_id = %s)"""
        with psycopg.connect(self.plane.pg.url("whalegen"), autocommit=True) as conn:
            while not self.done.wait(self.rng.expovariate(self.per_s) if self.per_s > 0 else 3600):
                agent = self.rng.choice(self.agents)
                conn.execute(flip, (int(agent.node_id or 0),))
                with agent.lock:
                    agent.changed_at = agent.changed_at or time.monotonic()
                marks.hincrby(f"wg:hb:whalegen:{agent.node_id}", "mark", 1)
                self.changes += 1


def drive(
    send: Callable[[int], bool], count: int, interval_s: float, duration_s: float, senders: int, label: str
) -> tuple[list[float], int, int]:
    """`send(n)` for n in 0..count-1 every interval, phases spread evenly, for `duration_s`; returns the
    latencies (s) of the sends that succeeded, the number that failed, and the number never sent because
    every sender was still waiting on the plane when they fell due (the window ends on time: a plane
    that cannot keep up is not given longer). A progress line every 10 s."""
    start = time.monotonic() + 1.0
    due = [(start + interval_s * n / count, n) for n in range(count)]
    heapq.heapify(due)
    lock = threading.Lock()
    latencies: list[float] = []
    failures = [0]
    skipped = [0]
    end = start + duration_s
    done = threading.Event()

    def sender() -> None:
        while True:
            with lock:
                if not due:
                    return
                at, n = heapq.heappop(due)
                if at >= end:
                    return
                if time.monotonic() >= end:
                    skipped[0] += 1 + sum(1 for when, _ in due if when < end)
                    due.clear()
                    return
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.perf_counter()
            ok = send(n)
            took = time.perf_counter() - began
            with lock:
                if ok:
                    latencies.append(took)
                else:
                    failures[0] += 1
                heapq.heappush(due, (at + interval_s, n))

    def monitor() -> None:
        while not done.wait(10.0):
            with lock:
                sent, failed, p99 = len(latencies), failures[0], quantile(latencies, 0.99)
            progress(f"{label}: {sent} ok, {failed} failed, p99 so far {p99 * 1000:.0f} ms")

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(senders)]
    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():  # a timed join, so that Ctrl-C stops the run (and the plane) at once
            thread.join(0.5)
    done.set()
    return latencies, failures[0], skipped[0]


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


PARTS = ("web", "db", "redis", "worker")


class Window:
    """CPU seconds of each plane part between `start()` and `stop()`, process by process, and the wall
    time between them. The processes are listed again every 0.5 s: a database backend or worker started
    meanwhile counts from zero, and one that exits meanwhile keeps what it had used at its last sample
    (a PostgreSQL backend ends with its client connection), so neither is lost nor counted twice."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.cpu: dict[str, float] = {}
        self.wall_s = 0.0

    def _sample(self) -> None:
        for part, pids in self.plane.plane_pids().items():
            for pid in pids:
                used = cpu_of(pid)
                if used is not None:
                    self._last.setdefault(part, {})[pid] = used
                    self._first.setdefault(part, {}).setdefault(pid, 0.0 if self._running else used)

    def start(self) -> None:
        self._first: dict[str, dict[int, float]] = {}
        self._last: dict[str, dict[int, float]] = {}
        self._running = False
        self._sample()  # what the processes alive now have used already is not counted
        self._running = True
        self._began = time.monotonic()
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._keep_sampling, daemon=True)
        self._sampler.start()

    def _keep_sampling(self) -> None:
        while not self._done.wait(0.5):
            self._sample()

    def stop(self) -> None:
        self._done.set()
        self._sampler.join()
        self._sample()
        self.wall_s = time.monotonic() - self._began
        self.cpu = {
            part: sum(used - self._first[part][pid] for pid, used in last.items())
            for part, last in self._last.items()
        }
        for part in PARTS:
            self.cpu.setdefault(part, 0.0)

    def cores(self, parts: tuple[str, ...] = ("web", "db", "redis", "worker")) -> float:
        return sum(self.cpu[part] for part in parts) / self.wall_s


# The floors: requests at the heartbeat rate that cost less than a heartbeat by design, each answered
# with a refusal, measured in the same run (web + database CPU above the idle baseline, per request).
# name: (method, path, token, expected status, what it is)
FLOORS = {
    "front_refused": ("POST", HEARTBEAT_PATH, "bad", 401,
                      "the heartbeat path's front (whalegen.config.wsgi) refusing an unknown token after its "
                      "one indexed lookup"),
    "django_plain_view": ("PUT", HEARTBEAT_PATH, "good", 405,
                          "Django's handler, its middleware and URL resolution to the plain heartbeat view, "
                          "which refuses the method (no query)"),
    "drf_refused": ("POST", REPORT_PATH, "bad", 401,
                    "Django + DRF refusing an unknown token after the token lookup (the agents' other "
                    "endpoints; the heartbeat's path before)"),
    "bare_wsgi": ("POST", HEARTBEAT_PATH, "bad", 401,
                  "gunicorn alone: benchmarks/floor_wsgi.py reads the body and answers 401 (no Django, no "
                  "database)"),
}  # fmt: skip


def poll_window(
    plane: Plane, agents: list[SimAgent], args: argparse.Namespace, window: Window, stats: PollStats
) -> tuple[tuple[list[float], int, int], int]:
    """The heartbeat load again for `--duration-s`, each agent also keeping its desired state: with a long
    poll (the plane's `poll_wait_s` above 0) a poller thread per agent on its own client, as the agent's
    `desired-state-poller`; without, a fetch at the start (the agent's fetch after registering) and one
    after each heartbeat whose answer names a newer generation. The writer changes `--changes-per-s`
    nodes a second. Returns the heartbeats' (latencies, failures, overdue) and the changes made."""
    long_poll = agents[0].poll_wait_s > 0
    mode = f"long poll ({agents[0].poll_wait_s:g} s)" if long_poll else "fetch on the heartbeat's answer"
    progress(f"desired-state window: {mode}, {args.changes_per_s:g} changes/s, {args.duration_s:g} s")
    stop = threading.Event()
    pollers: list[threading.Thread] = []
    writer = Writer(plane, agents, args.changes_per_s)
    if not long_poll:
        # The fetch each agent makes once after registering: a start-up cost, not the steady state the
        # window measures (it is measured on its own: `initial_fetch_*`).
        began, cpu = time.monotonic(), Window(plane)
        cpu.start()
        with ThreadPoolExecutor(max_workers=min(16, args.senders)) as pool:
            list(pool.map(lambda agent: agent.fetch(stats), agents))
        cpu.stop()
        stats.initial = (time.monotonic() - began, cpu.cores() * cpu.wall_s)
    window.start()
    if long_poll:  # the long polls held from the start: their first answers are in the window
        for agent in agents:
            thread = threading.Thread(target=agent.long_poll, args=(stop, stats), daemon=True)
            thread.start()
            pollers.append(thread)
    writer.start()
    counts = drive(
        lambda n: agents[n].beat_and_fetch(stats),
        len(agents),
        args.interval_s,
        args.duration_s,
        args.senders,
        "load + desired state",
    )
    writer.stop()
    window.stop()
    stop.set()
    for thread in pollers:  # each ends with its poll in flight (at most the plane's wait)
        thread.join(agents[0].poll_wait_s + 15)
    return counts, writer.changes


def poll_result(
    args: argparse.Namespace,
    *,
    loaded: Window,
    polled: Window,
    idle: Window,
    counts: tuple[list[float], int, int],
    stats: PollStats,
    changes: int,
) -> dict[str, object]:
    """The desired-state window against the heartbeat-only window of the same run: what keeping the
    desired state costs the plane on top of the heartbeats, in all and per agent and per change."""
    latencies, failures, _ = counts
    extra = polled.cores() - loaded.cores()
    long_poll = args.plane_poll_wait_s is None or args.plane_poll_wait_s > 0
    return {
        "mode": "long poll" if long_poll else "fetch on the heartbeat's answer",
        "plane_poll_wait_s": args.plane_poll_wait_s,
        "plane_root": str(args.plane_root),
        "changes": changes,
        "plane_cpu_cores_heartbeats_only": round(loaded.cores(), 3),
        "plane_cpu_cores_with_desired_state": round(polled.cores(), 3),
        "plane_cpu_cores_idle_baseline": round(idle.cores(), 3),
        "plane_cpu_cores_by_part_with_desired_state": {
            k: round(v / polled.wall_s, 3) for k, v in polled.cpu.items()
        },
        "desired_state_extra_cores": round(extra, 3),
        "desired_state_extra_cores_per_agent": round(extra / args.agents, 5),
        "desired_state_extra_cpu_ms_per_change": (
            round(1000 * extra * polled.wall_s / changes, 2) if changes else None
        ),
        "answers": dict(stats.counts),
        "change_to_agent_s_p50_p90_max": [
            round(quantile(stats.latencies, q), 2) for q in (0.5, 0.9)
        ] + [round(max(stats.latencies, default=float("nan")), 2)],
        "changes_seen_by_agents": len(stats.latencies),
        "fetch_ms_p50_p99": [round(quantile(stats.fetches, q) * 1000, 1) for q in (0.5, 0.99)],
        "initial_fetch_wall_s_and_plane_cpu_s": (
            [round(stats.initial[0], 1), round(stats.initial[1], 1)] if stats.initial else None
        ),
        "heartbeats_ok_failed": [len(latencies), failures],
        "heartbeat_latency_p50_p99_ms": [round(quantile(latencies, q) * 1000, 1) for q in (0.5, 0.99)],
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument(
        "--floor-s", type=float, default=None, help="each floor window (default: one interval)"
    )
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per simulated node")
    parser.add_argument("--senders", type=int, default=64, help="load-generator threads")
    parser.add_argument("--gunicorn-workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument(
        "--keep-alive-s",
        type=float,
        default=30.0,
        help="gunicorn's --keep-alive (default 30, the image's: above the interval, agents reuse their "
        "connection; 2 is gunicorn's own default, below it every beat opens a new one)",
    )
    parser.add_argument(
        "--web-port",
        type=int,
        default=int(os.environ.get("WHALEGEN_BENCH_WEB_PORT", "18601")),
        help="gunicorn's port (default $WHALEGEN_BENCH_WEB_PORT or 18601)",
    )
    parser.add_argument(
        "--poll",
        action="store_true",
        help="after the heartbeat-only window, a second one as long where each agent also keeps its "
        "desired state as the real agent does (long poll, or fetch on the heartbeat's answer), with a "
        "simulated writer",
    )
    parser.add_argument(
        "--plane-poll-wait-s",
        type=float,
        default=None,
        help="WHALEGEN_AGENT_POLL_WAIT_S of the plane (default: the plane's, 20 s: agents long-poll; 0: they "
        "fetch when a heartbeat's answer names a newer generation)",
    )
    parser.add_argument(
        "--changes-per-s", type=float, default=2.0, help="desired-state changes the writer makes a second"
    )
    parser.add_argument(
        "--plane-root",
        type=Path,
        default=ROOT,
        help="run the plane from this checkout (a baseline: another commit's code, the same load generator)",
    )
    parser.add_argument("--no-floors", action="store_true", help="skip the floor windows")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="whalegen-heartbeat-bench-"))
    work.chmod(0o755)
    plane = Plane(work, web_port=args.web_port, gunicorn_workers=args.gunicorn_workers, threads=args.threads,
                  keep_alive_s=args.keep_alive_s, root=args.plane_root.resolve(),
                  poll_wait_s=args.plane_poll_wait_s)  # fmt: skip
    # The idle baseline: two intervals after the load, every agent silent at once. Each node is silent
    # up to three intervals by its end — at the loss threshold — and the plane, hearing no node at all
    # for two intervals, takes itself for deaf (docs/fleet.md, "Node health" 2) and loses nobody.
    idle_s = min(args.duration_s, 2 * args.interval_s)
    floor_s = args.floor_s or args.interval_s
    idle, loaded = Window(plane), Window(plane)
    floors = {name: Window(plane) for name in FLOORS}
    floor_counts: dict[str, tuple[list[float], int, int]] = {}
    polled, poll_stats = Window(plane), PollStats()
    poll_counts: tuple[list[float], int, int] = ([], 0, 0)
    changes = 0
    try:
        tokens = plane.start(args.agents, args.gpus, args.interval_s)
        agents = [SimAgent(plane.url, name, token, args.gpus) for name, token in tokens.items()]
        progress(f"registering {len(agents)} agents")
        registering = time.monotonic()
        # Registration is not what is measured: fewer at once than the load's senders.
        with ThreadPoolExecutor(max_workers=min(16, args.senders)) as pool:
            for n, _ in enumerate(pool.map(SimAgent.register, agents), 1):
                if n % 500 == 0 or n == len(agents):
                    progress(f"registered {n}/{len(agents)}")
        registration_s = time.monotonic() - registering
        # Every node has beaten once (registration): one more heartbeat each, in registration order, so
        # that the load window starts with every node freshly heard.
        progress("warm-up: one heartbeat per agent (not measured)")
        warming = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.senders) as pool:
            list(pool.map(SimAgent.warm_up, agents))
        warm_up_s = time.monotonic() - warming
        # The first agents warmed up are silent for the whole warm-up when the window begins. Past the
        # loss threshold (3 intervals, WHALEGEN_NODE_LOST_HEARTBEATS' default; the plane stretches it
        # with the fleet's pace, so not always) the health check may lose them during the window: such
        # losses, the full-way heartbeats that bring the nodes back and the backlog they make are the
        # generator's pause, not the plane's doing.
        warm_up_long = warm_up_s > 3 * args.interval_s
        if warm_up_long:
            progress(f"warm-up took {warm_up_s:.0f} s, past the loss threshold: losses may be the warm-up's")
        # Lost before the load: silent from their registration to their warm-up heartbeat for longer
        # than the threshold (the generator's pace, not a heartbeat the plane failed to take).
        lost_before = plane.lost_nodes()
        # 1. The load: every agent beats every interval.
        progress(f"load window: {args.agents} agents every {args.interval_s:g} s for {args.duration_s:g} s")
        load_average_before = os.getloadavg()[0]
        updates_before = plane.node_row_updates()
        shortcut_before = plane.shortcut_calls()
        loaded.start()
        latencies, failures, skipped = drive(
            lambda n: agents[n].beat(), len(agents), args.interval_s, args.duration_s, args.senders, "load"
        )
        loaded.stop()
        load_average = os.getloadavg()[0]
        web_rss_mib, web_connections = plane.web_footprint()
        shortcut_calls = plane.shortcut_calls() - shortcut_before
        time.sleep(1.5)  # statistics of the last transactions reach pg_stat within a second
        processed = plane.node_row_updates() - updates_before
        progress("waiting 6 s for one more node-health check after the last heartbeat")
        time.sleep(6)
        lost = plane.lost_nodes()
        # 1b. The same load, and each agent keeping its desired state as the real agent does.
        if args.poll:
            poll_counts, changes = poll_window(plane, agents, args, polled, poll_stats)
            lost = plane.lost_nodes()
        # 2. Same-run baseline: the plane idle (worker and beat running, no heartbeats).
        progress(f"idle baseline: {idle_s:.0f} s without heartbeats")
        idle.start()
        time.sleep(idle_s)
        idle.stop()
        lost_in_idle = plane.lost_nodes() - lost
        # 3. The floors, at the load's request rate.
        strangers = [SimAgent(plane.url, a.name, "wgn_not-a-node-token", args.gpus) for a in agents]
        for stranger, agent in zip(strangers, agents, strict=True):
            stranger.node_id = agent.node_id
        for name, (method, path, token, expect, _what) in FLOORS.items():
            if args.no_floors:
                break
            if name == "bare_wsgi":
                progress("replacing the plane's gunicorn by the bare WSGI floor")
                plane.serve_bare_floor()
            senders_of = strangers if token == "bad" else agents
            progress(f"floor {name}: {method} {path} answered {expect}, for {floor_s:.0f} s")
            floors[name].start()
            floor_counts[name] = drive(
                lambda n, who=senders_of, m=method, at=path, e=expect: who[n].floor_request(m, at, e),
                len(senders_of),
                args.interval_s,
                floor_s,
                args.senders,
                name,
            )
            floors[name].stop()
    finally:
        progress("stopping the plane")
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    def per_request_ms(window: Window, requests: int, parts: tuple[str, ...]) -> float:
        idle_cores = idle.cores(parts)
        return round(1000 * (window.cores(parts) - idle_cores) * window.wall_s / max(1, requests), 2)

    # The request path: gunicorn, PostgreSQL, and Redis (which holds the heartbeats' liveness).
    serving = ("web", "db", "redis")
    due = int(args.agents * args.duration_s / args.interval_s)
    heartbeat_ms = per_request_ms(loaded, len(latencies), serving)
    floor_results: dict[str, dict[str, object]] = {}
    for name, (method, path, _token, expect, what) in FLOORS.items():
        if name not in floor_counts:  # --no-floors, or the run stopped before it
            continue
        answered, other, _overdue = floor_counts[name]
        floor_results[name] = {
            "what": what,
            "request": f"{method} {path} -> {expect}",
            "answered": len(answered),
            "other": other,
            "p99_ms": round(quantile(answered, 0.99) * 1000, 1),
            "cpu_ms_per_request_web_db": per_request_ms(floors[name], len(answered), serving),
        }
    result = {
        "settings": {
            **vars(args),
            "plane_root": str(args.plane_root),
            "heartbeat_rate_per_s": args.agents / args.interval_s,
        },
        "heartbeats_ok": len(latencies),
        "heartbeats_failed": failures,
        # Due in the window (every agent every interval) but never sent: the load generator shares the
        # cores and falls behind when the plane answers slowly (`skipped` counts only the agents whose
        # next heartbeat was already overdue when the window closed).
        "heartbeats_due": due,
        "heartbeats_not_sent": max(0, due - len(latencies) - failures),
        "agents_overdue_at_the_end": skipped,
        "latency_p50_ms": round(quantile(latencies, 0.50) * 1000, 1),
        "latency_p99_ms": round(quantile(latencies, 0.99) * 1000, 1),
        "latency_max_ms": round(max(latencies, default=float("nan")) * 1000, 1),
        "latency_mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
        # The whole plane: gunicorn, PostgreSQL, Redis, Celery worker + beat.
        "plane_cpu_cores_loaded": round(loaded.cores(), 3),
        "plane_cpu_cores_idle_baseline": round(idle.cores(), 3),
        "plane_cpu_ratio_loaded_vs_idle": round(loaded.cores() / idle.cores(), 1) if idle.cores() else None,
        "plane_cpu_cores_by_part_loaded": {k: round(v / loaded.wall_s, 3) for k, v in loaded.cpu.items()},
        "plane_cpu_cores_by_part_idle": {k: round(v / idle.wall_s, 3) for k, v in idle.cpu.items()},
        # Per heartbeat above the idle baseline: web + database + redis (the request path), and all parts
        # (the worker's share is the node-health check's flush of the beats held in Redis).
        "cpu_ms_per_heartbeat_web_db": heartbeat_ms,
        "cpu_ms_per_heartbeat_plane": per_request_ms(loaded, len(latencies), PARTS),
        "cpu_ms_per_heartbeat_by_part": {
            part: per_request_ms(loaded, len(latencies), (part,)) for part in PARTS
        },
        # Heartbeats the liveness script in Redis saw (those it answered and those it sent the full way).
        "heartbeats_seen_by_the_redis_shortcut": shortcut_calls,
        # What the plane processed in the window, answered in time or not (a client gives up after 10 s;
        # the plane still does the work): the CPU per heartbeat that does not depend on the client. Node
        # rows updated: one per heartbeat taken the full way, one per node per flush for those held in
        # Redis (two beats of one node between flushes count once: a lower bound then).
        "heartbeats_processed_by_plane": processed,
        "cpu_ms_per_processed_heartbeat_web_db": per_request_ms(loaded, processed, serving),
        # The budget: half of one core over the heartbeats due per second.
        "budget_cpu_ms_per_heartbeat": round(500 / (args.agents / args.interval_s), 2),
        "floors": floor_results,
        "heartbeat_vs_floor_cpu_ratio": {
            name: round(heartbeat_ms / floor["cpu_ms_per_request_web_db"], 2)  # type: ignore[operator]
            for name, floor in floor_results.items()
            if floor["cpu_ms_per_request_web_db"] > 0  # type: ignore[operator]
        },
        "registration_s": round(registration_s, 1),
        "warm_up_s": round(warm_up_s, 1),
        # The warm-up outlasted the loss threshold (above): losses in this run may be the warm-up's.
        "warm_up_past_the_loss_threshold": warm_up_long,
        # Silent from registration to their warm-up heartbeat past the threshold: the benchmark's pause.
        "nodes_lost_before_load_by_the_pause": lost_before,
        # Every agent kept beating through the load window: any node lost by its end is a false loss.
        "nodes_falsely_lost": lost,
        # The idle baseline silences every agent at once: the plane should take itself for deaf.
        "nodes_lost_in_idle_baseline": lost_in_idle,
        "wall_s": round(loaded.wall_s, 1),
        # The machine's 1-minute load average as the load window began and as it ended (other work on
        # the shared cores inflates every CPU figure).
        "load_average_before_and_after": [round(load_average_before, 1), round(load_average, 1)],
        # At the end of the load window: the web tier's memory and the connections held open to it.
        "web_rss_mib": web_rss_mib,
        "web_connections_open": web_connections,
    }
    if args.poll:
        result["desired_state"] = poll_result(
            args,
            loaded=loaded,
            polled=polled,
            idle=idle,
            counts=poll_counts,
            stats=poll_stats,
            changes=changes,
        )
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            if key == "floors":
                for name, floor in floor_results.items():
                    print(f"floor {name:27} {json.dumps(floor)}")
                continue
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
