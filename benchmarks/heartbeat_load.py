"""Heartbeat load: N simulated agents heartbeating every `interval` seconds against gunicorn + PostgreSQL.

    python benchmarks/heartbeat_load.py [--agents 2000] [--interval-s 10] [--duration-s 60] [--gpus 4]

Starts a PostgreSQL cluster of its own (port WHALEGEN_FAULTS_POSTGRES_PORT, default 55434), migrates and
seeds N nodes, starts gunicorn (port 18601) and one Celery worker + beat on a Redis of its own (port
56381) so that the plane's node-health check runs as in production. Each simulated agent is the real
agent HTTP client (`agents.client.PlaneClient`: its session, timeouts and error mapping) sending
`Register` once and then a `Heartbeat` with its GPUs' inventory and telemetry every interval, spread
evenly over the interval; a pool of sender threads keeps the schedule.

Prints, as text and JSON: the settings, heartbeats sent / failed, p50/p99/max latency, plane CPU
(gunicorn master+workers and every PostgreSQL backend, from /proc utime+stime) over the measured
window as a share of one core, the same figure over an idle window of the same plane measured first
in the same run (the baseline) and their ratio, CPU per heartbeat, and nodes falsely lost (every agent
kept beating; any node the health check marked lost is a false loss). The load generator's own CPU
is not counted. Nothing here fails on timing.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.client import PlaneClient, PlaneRejected, PlaneUnavailable  # noqa: E402
from tests.faults.services import PostgresServer, RedisServer  # noqa: E402
from whalegen.protocol import GpuInventory, Heartbeat, Register, TelemetrySample  # noqa: E402

WEB_PORT = 18601
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS_PER_S


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
    def __init__(self, work: Path, *, gunicorn_workers: int, threads: int) -> None:
        self.work = work
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
        self.pg.init()
        self.pg.start()
        subprocess.run([str(self.pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg.port), "-U",
                        "postgres", "whalegen"], check=True)  # fmt: skip
        self.redis.start()
        self.run("manage.py", "migrate", "--noinput")
        tokens: dict[str, str] = json.loads(
            self.run("-m", "tests.faults.plane_scripts", "seed-fleet", str(nodes), str(gpus))
        )["tokens"]
        self.web = self.spawn("gunicorn", "-m", "gunicorn", "whalegen.config.wsgi", "--bind",
                              f"127.0.0.1:{WEB_PORT}", "--workers", str(self.gunicorn_workers),
                              "--threads", str(self.threads), "--timeout", "60")  # fmt: skip
        self.spawn("worker", "-m", "celery", "-A", "whalegen.config", "worker", "--pool", "solo",
                   "--loglevel", "WARNING")  # fmt: skip
        schedule, pidfile = str(self.work / "beat-schedule"), str(self.work / "beat.pid")
        self.spawn("beat", "-m", "celery", "-A", "whalegen.config", "beat", "--loglevel", "WARNING",
                   "-s", schedule, "--pidfile", pidfile)  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._answers():
            if time.monotonic() > deadline:
                raise SystemExit("gunicorn did not answer in 120 s")
            time.sleep(0.5)
        return tokens

    def _answers(self) -> bool:
        import requests

        try:
            return requests.get(f"http://127.0.0.1:{WEB_PORT}/api/v1/tasks/", timeout=2).status_code < 500
        except requests.RequestException:
            return False

    def plane_pids(self) -> list[int]:
        postmaster = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        return [self.web.pid, *children(self.web.pid), postmaster, *children(postmaster)]

    def lost_nodes(self) -> int:
        import psycopg

        with psycopg.connect(self.pg.url("whalegen"), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM inventory_node WHERE state = 'lost'").fetchone()
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

    def __init__(self, name: str, token: str, gpus: int) -> None:
        self.name = name
        self.client = PlaneClient(f"http://127.0.0.1:{WEB_PORT}", token)
        self.inventory = tuple(
            GpuInventory(
                j, f"GPU-bench-{name}-{j}", "NVIDIA L40S", "L40S", 46_068, f"0000:{j:02x}:00.0", False
            )
            for j in range(gpus)
        )
        self.node_id: str | None = None

    def register(self) -> None:
        message = Register(node_name=self.name, hostname=self.name, agent_version="bench",
                           inventory=self.inventory)  # fmt: skip
        self.node_id = self.client.register(message).node_id

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


def drive(
    agents: list[SimAgent], interval_s: float, duration_s: float, senders: int
) -> tuple[list[float], int]:
    """Each agent beats every interval, phases spread evenly; returns latencies (s) and failures."""
    start = time.monotonic() + 1.0
    due = [(start + interval_s * n / len(agents), n) for n in range(len(agents))]
    heapq.heapify(due)
    lock = threading.Lock()
    latencies: list[float] = []
    failures = [0]
    end = start + duration_s

    def sender() -> None:
        while True:
            with lock:
                if not due:
                    return
                at, n = heapq.heappop(due)
                if at >= end:
                    return
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.perf_counter()
            try:
                agents[n].heartbeat()
                ok = True
            except (PlaneUnavailable, PlaneRejected):
                ok = False
            took = time.perf_counter() - began
            with lock:
                if ok:
                    latencies.append(took)
                else:
                    failures[0] += 1
                heapq.heappush(due, (at + interval_s, n))

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures[0]


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per simulated node")
    parser.add_argument("--senders", type=int, default=64, help="load-generator threads")
    parser.add_argument("--gunicorn-workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="whalegen-heartbeat-bench-"))
    work.chmod(0o755)
    plane = Plane(work, gunicorn_workers=args.gunicorn_workers, threads=args.threads)
    try:
        tokens = plane.start(args.agents, args.gpus, args.interval_s)
        agents = [SimAgent(name, token, args.gpus) for name, token in tokens.items()]
        with ThreadPoolExecutor(max_workers=args.senders) as pool:  # registration is not what is measured
            list(pool.map(SimAgent.register, agents))
        # Same-run baseline: the plane idle (worker and beat running, no heartbeats), for two intervals
        # (below the loss threshold of three, so no node is lost by the pause itself).
        idle_s = min(args.duration_s, 2 * args.interval_s)
        pids = plane.plane_pids()
        before = cpu_s(pids)
        time.sleep(idle_s)
        idle_cpu = cpu_s(plane.plane_pids()) - before
        lost_before = plane.lost_nodes()
        # Every node has beaten once (registration): restart the clock of the measured window.
        with ThreadPoolExecutor(max_workers=args.senders) as pool:
            list(pool.map(SimAgent.warm_up, agents))
        pids = plane.plane_pids()
        before, wall = cpu_s(pids), time.monotonic()
        latencies, failures = drive(agents, args.interval_s, args.duration_s, args.senders)
        wall = time.monotonic() - wall
        loaded_cpu = cpu_s(plane.plane_pids()) - before
        time.sleep(6)  # one more health check after the last beat
        lost = plane.lost_nodes()
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "settings": {**vars(args), "heartbeat_rate_per_s": args.agents / args.interval_s},
        "heartbeats_ok": len(latencies),
        "heartbeats_failed": failures,
        "latency_p50_ms": round(quantile(latencies, 0.50) * 1000, 1),
        "latency_p99_ms": round(quantile(latencies, 0.99) * 1000, 1),
        "latency_max_ms": round(max(latencies, default=float("nan")) * 1000, 1),
        "latency_mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
        "plane_cpu_cores_loaded": round(loaded_cpu / wall, 3),
        "plane_cpu_cores_idle_baseline": round(idle_cpu / idle_s, 3),
        "plane_cpu_ratio_loaded_vs_idle": round((loaded_cpu / wall) / (idle_cpu / idle_s), 1)
        if idle_cpu
        else None,
        "plane_cpu_ms_per_heartbeat": round(
            1000 * (loaded_cpu - idle_cpu * wall / idle_s) / max(1, len(latencies)), 2
        ),
        "nodes_lost_before_load": lost_before,
        "nodes_falsely_lost": lost,
        "wall_s": round(wall, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
