"""Heartbeat load: N simulated agents heartbeating every `interval` seconds against gunicorn + PostgreSQL.

    python benchmarks/heartbeat_load.py [--agents 2000] [--interval-s 10] [--duration-s 60] [--gpus 4]
        [--web-port P]

Starts a PostgreSQL cluster of its own (port WHALEGEN_FAULTS_POSTGRES_PORT, default 55434), migrates and
seeds N nodes, starts gunicorn (port --web-port, default $WHALEGEN_BENCH_WEB_PORT or 18601) and one
Celery worker + beat on a Redis of its own (port WHALEGEN_FAULTS_REDIS_PORT, default 56381) so that the
plane's periodic tasks (node-health check, scheduling cycles) run as in production. Each simulated agent
is the real agent HTTP client (`agents.client.PlaneClient`: its session, timeouts and error mapping)
sending `Register` once and then a `Heartbeat` with its GPUs' inventory and telemetry every interval,
spread evenly over the interval; a pool of sender threads keeps the schedule.

Windows, in this order, each with a progress line on stderr: registration; an idle baseline (two
intervals, no heartbeats); one warm-up heartbeat per agent; the load window (`--duration-s`); one more
node-health check; the floor (two intervals of the same request rate on the heartbeat endpoint with a
token no node holds, refused after the token lookup: what gunicorn + Django + DRF + one indexed query
cost per request, the part of a heartbeat's cost the heartbeat code cannot remove).

Prints, as text and JSON: the settings, heartbeats ok / failed, p50/p99/max latency, plane CPU from
/proc utime+stime as a share of one core, by part (web: gunicorn master+workers; db: every PostgreSQL
backend; worker: Celery worker + beat) and in all, for the load window and the idle baseline of the
same run, their ratio, CPU per heartbeat above the idle baseline, the floor's CPU per request and the
heartbeat/floor ratio, and nodes falsely lost (every agent kept beating; any node the health check
marked lost is a false loss). The load generator's own CPU is not counted: it shares the 2 cores, so
wall-clock latency is noisy; CPU seconds and same-run ratios are the figures that count. Nothing here
fails on timing.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
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
from whalegen.protocol import GpuInventory, Heartbeat, Register, TelemetrySample  # noqa: E402

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
    def __init__(self, work: Path, *, web_port: int, gunicorn_workers: int, threads: int) -> None:
        self.work = work
        self.web_port = web_port
        self.url = f"http://127.0.0.1:{web_port}"
        self.pg = PostgresServer(work / "pg")
        self.redis = RedisServer(work / "redis")
        self.gunicorn_workers, self.threads = gunicorn_workers, threads
        self.env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            DATABASE_URL=self.pg.url("whalegen"),
            REDIS_URL=self.redis.url,
            SECRET_KEY="bench-only-not-secret",
            WHALEGEN_ACCESS_LOG_LEVEL="WARNING",
            WHALEGEN_NODE_HEALTH_INTERVAL_S="5",
        )
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=self.env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{args} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=self.env, stdout=log, stderr=log)
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
        self.web = self.spawn("gunicorn", "-m", "gunicorn", "whalegen.config.wsgi", "--bind",
                              f"127.0.0.1:{self.web_port}", "--workers", str(self.gunicorn_workers),
                              "--threads", str(self.threads), "--timeout", "60")  # fmt: skip
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

    def _answers(self) -> bool:
        import requests

        try:
            return requests.get(f"{self.url}/api/v1/tasks/", timeout=2).status_code < 500
        except requests.RequestException:
            return False

    def plane_pids(self) -> dict[str, list[int]]:
        """The plane's processes by part: web (gunicorn master and workers), database (postmaster and
        every backend), worker + beat (Celery, with any child it forks)."""
        postmaster = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        celery = [self.worker.pid, self.beat.pid]
        return {
            "web": [self.web.pid, *children(self.web.pid)],
            "db": [postmaster, *children(postmaster)],
            "worker": [*celery, *(child for pid in celery for child in children(pid))],
        }

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
    """One node's heartbeat as the real agent sends it, through the real agent client."""

    def __init__(self, url: str, name: str, token: str, gpus: int) -> None:
        self.name = name
        self.client = PlaneClient(url, token)
        self.inventory = tuple(
            GpuInventory(
                j, f"GPU-bench-{name}-{j}", "NVIDIA L40S", "L40S", 46_068, f"0000:{j:02x}:00.0", False
            )
            for j in range(gpus)
        )
        self.node_id: str | None = None

    def register(self) -> None:
        """Register as the agent does at start-up: a plane slow to answer is asked again (not measured)."""
        message = Register(node_name=self.name, hostname=self.name, agent_version="bench",
                           inventory=self.inventory)  # fmt: skip
        for attempt in range(5):
            try:
                self.node_id = self.client.register(message).node_id
                return
            except PlaneUnavailable:
                if attempt == 4:
                    raise
                time.sleep(2.0 * (attempt + 1))

    def warm_up(self) -> None:
        """One heartbeat before the measured window; an overloaded plane may time it out (not counted)."""
        with contextlib.suppress(PlaneUnavailable, PlaneRejected):
            self.heartbeat()

    def heartbeat(self) -> None:
        assert self.node_id is not None
        now = time.time()
        telemetry = tuple(
            TelemetrySample(g.uuid, now, 1024, 46_068, 37, 12, 140.0, 350.0, 55, 1800, 9000, 0)
            for g in self.inventory
        )
        message = Heartbeat(node_id=self.node_id, agent_version="bench", sent_at_s=now,
                            inventory=self.inventory, telemetry=telemetry, running=())  # fmt: skip
        self.client.heartbeat(message)

    def refused_heartbeat(self) -> bool:
        """The floor's request: the same heartbeat with a token no node holds, refused (401) after the
        token lookup. True when it was refused as expected."""
        try:
            self.heartbeat()
        except PlaneRejected as error:
            return error.status == 401
        except PlaneUnavailable:
            return False
        return False

    def beat(self) -> bool:
        try:
            self.heartbeat()
        except (PlaneUnavailable, PlaneRejected):
            return False
        return True


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
        for part in ("web", "db", "worker"):
            self.cpu.setdefault(part, 0.0)

    def cores(self, parts: tuple[str, ...] = ("web", "db", "worker")) -> float:
        return sum(self.cpu[part] for part in parts) / self.wall_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per simulated node")
    parser.add_argument("--senders", type=int, default=64, help="load-generator threads")
    parser.add_argument("--gunicorn-workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument(
        "--web-port",
        type=int,
        default=int(os.environ.get("WHALEGEN_BENCH_WEB_PORT", "18601")),
        help="gunicorn's port (default $WHALEGEN_BENCH_WEB_PORT or 18601)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="whalegen-heartbeat-bench-"))
    work.chmod(0o755)
    plane = Plane(work, web_port=args.web_port, gunicorn_workers=args.gunicorn_workers, threads=args.threads)
    # Idle and floor windows: two intervals each (below the loss threshold of three, so no node is lost by
    # the pause itself).
    short_s = min(args.duration_s, 2 * args.interval_s)
    idle, loaded, floor = Window(plane), Window(plane), Window(plane)
    try:
        tokens = plane.start(args.agents, args.gpus, args.interval_s)
        agents = [SimAgent(plane.url, name, token, args.gpus) for name, token in tokens.items()]
        progress(f"registering {len(agents)} agents")
        # Registration is not what is measured: fewer at once than the load's senders.
        with ThreadPoolExecutor(max_workers=min(16, args.senders)) as pool:
            for n, _ in enumerate(pool.map(SimAgent.register, agents), 1):
                if n % 500 == 0 or n == len(agents):
                    progress(f"registered {n}/{len(agents)}")
        # 1. Same-run baseline: the plane idle (worker and beat running, no heartbeats).
        progress(f"idle baseline: {short_s:.0f} s without heartbeats")
        idle.start()
        time.sleep(short_s)
        idle.stop()
        lost_before = plane.lost_nodes()
        # Every node has beaten once (registration): restart the clock of the measured window.
        progress("warm-up: one heartbeat per agent (not measured)")
        with ThreadPoolExecutor(max_workers=args.senders) as pool:
            list(pool.map(SimAgent.warm_up, agents))
        # 2. The load: every agent beats every interval.
        progress(f"load window: {args.agents} agents every {args.interval_s:g} s for {args.duration_s:g} s")
        updates_before = plane.node_row_updates()
        loaded.start()
        latencies, failures, skipped = drive(
            lambda n: agents[n].beat(), len(agents), args.interval_s, args.duration_s, args.senders, "load"
        )
        loaded.stop()
        time.sleep(1.5)  # statistics of the last transactions reach pg_stat within a second
        processed = plane.node_row_updates() - updates_before
        progress("waiting 6 s for one more node-health check after the last heartbeat")
        time.sleep(6)
        lost = plane.lost_nodes()
        # 3. The floor: the same request rate on the same endpoint with a token no node holds, refused
        # after the token lookup: what gunicorn + Django + DRF + one indexed query cost per request.
        strangers = [SimAgent(plane.url, a.name, "wgn_not-a-node-token", args.gpus) for a in agents]
        for stranger, agent in zip(strangers, agents, strict=True):
            stranger.node_id = agent.node_id
        progress(f"floor window: the same rate of refused heartbeats (bad token) for {short_s:.0f} s")
        floor.start()
        refused, floor_failures, floor_skipped = drive(
            lambda n: strangers[n].refused_heartbeat(),
            len(strangers),
            args.interval_s,
            short_s,
            args.senders,
            "floor",
        )
        floor.stop()
    finally:
        progress("stopping the plane")
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    def per_request_ms(window: Window, requests: int, parts: tuple[str, ...]) -> float:
        idle_cores = idle.cores(parts)
        return round(1000 * (window.cores(parts) - idle_cores) * window.wall_s / max(1, requests), 2)

    serving = ("web", "db")
    result = {
        "settings": {**vars(args), "heartbeat_rate_per_s": args.agents / args.interval_s},
        "heartbeats_ok": len(latencies),
        "heartbeats_failed": failures,
        # Due in the window (every agent every interval) but never sent: the load generator shares the
        # cores and falls behind when the plane answers slowly (`skipped` counts only the agents whose
        # next heartbeat was already overdue when the window closed).
        "heartbeats_due": int(args.agents * args.duration_s / args.interval_s),
        "heartbeats_not_sent": max(
            0, int(args.agents * args.duration_s / args.interval_s) - len(latencies) - failures
        ),
        "agents_overdue_at_the_end": skipped,
        "latency_p50_ms": round(quantile(latencies, 0.50) * 1000, 1),
        "latency_p99_ms": round(quantile(latencies, 0.99) * 1000, 1),
        "latency_max_ms": round(max(latencies, default=float("nan")) * 1000, 1),
        "latency_mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
        # The whole plane: gunicorn, PostgreSQL, Celery worker + beat.
        "plane_cpu_cores_loaded": round(loaded.cores(), 3),
        "plane_cpu_cores_idle_baseline": round(idle.cores(), 3),
        "plane_cpu_ratio_loaded_vs_idle": round(loaded.cores() / idle.cores(), 1) if idle.cores() else None,
        "plane_cpu_cores_by_part_loaded": {k: round(v / loaded.wall_s, 3) for k, v in loaded.cpu.items()},
        "plane_cpu_cores_by_part_idle": {k: round(v / idle.wall_s, 3) for k, v in idle.cpu.items()},
        # Per heartbeat above the idle baseline: web + database (the request path), and all parts.
        "cpu_ms_per_heartbeat_web_db": per_request_ms(loaded, len(latencies), serving),
        "cpu_ms_per_heartbeat_plane": per_request_ms(loaded, len(latencies), ("web", "db", "worker")),
        # What the plane processed in the window, answered in time or not (a client gives up after 10 s;
        # the plane still does the work): the CPU per heartbeat that does not depend on the client.
        "heartbeats_processed_by_plane": processed,
        "cpu_ms_per_processed_heartbeat_web_db": per_request_ms(loaded, processed, serving),
        "floor_requests_refused": len(refused),
        "floor_requests_other": floor_failures,
        "floor_agents_overdue_at_the_end": floor_skipped,
        "floor_latency_p99_ms": round(quantile(refused, 0.99) * 1000, 1),
        "floor_cpu_cores_web_db": round(floor.cores(serving), 3),
        "floor_cpu_ms_per_request_web_db": per_request_ms(floor, len(refused), serving),
        "heartbeat_vs_floor_cpu_ratio": round(
            per_request_ms(loaded, len(latencies), serving) / per_request_ms(floor, len(refused), serving), 2
        )
        if per_request_ms(floor, len(refused), serving) > 0
        else None,
        "nodes_lost_before_load": lost_before,
        "nodes_falsely_lost": lost,
        "wall_s": round(loaded.wall_s, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
