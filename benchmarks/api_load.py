"""Submission speed of the REST API: gunicorn + PostgreSQL + Redis, driven by locust.

    python benchmarks/api_load.py [--code DIR] [--workers 4] [--duration-s 20] [--users 8]
                                  [--database wg_api_bench] [--port 18500] [--redis-url URL]

Runs, against one gunicorn (sync workers) serving the code in DIR (default: this checkout; point it
at another checkout to measure "before" with the same command and the same floors):
- the floors, layer by layer (benchmarks/api_floor/, served next to the measured code): gunicorn
  answering a fixed body without Django; Django with every middleware of the project and a trivial
  view; the same plus DRF with the project's token authentication (no query);
- baseline: `GET /api/v1/tenants/` (token auth, the caller's access, one small list; no task work)
  with --users concurrent clients, the reference of the "vs baseline" column;
- single POST /api/v1/tasks/, 1 client (sequential) and --users concurrent clients;
- POST /api/v1/tasks/bulk/ with 100 tasks per request (--users clients) and one request of 1,000.
For each: requests/s, tasks/s, p50/p99 latency (locust), and CPU per task (utime+stime, the figure the
noisy machine distorts least) of the gunicorn workers, of the PostgreSQL backends serving the scratch
database, and of the load generator, and their sum ("box"): on a 2-core host that runs all three,
N requests/s need box ms/request <= 2000 / N. The database is a scratch one, created, migrated and
seeded here (one tenant with a quota large enough for every scenario). Figures only; nothing fails.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).resolve().parent / "api_locustfile.py"
# The WSGI entry and floor endpoints, put on the server's path after the measured checkout.
FLOOR = Path(__file__).resolve().parent / "api_floor"


def progress(message: str) -> None:
    print(f"[bench api] {message}", file=sys.stderr, flush=True)


def _prepare_database(env: dict[str, str], code: Path) -> str:
    """Create (if needed), migrate and seed the scratch database; return a member's API token."""
    import psycopg

    url = env["DATABASE_URL"]
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=code, env=env, check=True)
    seed = (
        "from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create\n"
        "from apps.tenants.models import Membership\n"
        "from apps.tenants.services import membership_set, tenant_create, token_create\n"
        "from apps.workloads.services import queue_create, quota_set\n"
        "from django.contrib.auth import get_user_model\n"
        "tenant = tenant_create(slug='bench', name='Bench')\n"
        "user = get_user_model().objects.create_user(username='ci')\n"
        "membership_set(user=user, tenant=tenant, role=Membership.Role.MEMBER)\n"
        "pool = pool_create(name='h100-bench', runtime='process')\n"
        "node, _ = node_register(cluster=cluster_create(name='c', region='r'), pool=pool, name='n1',"
        " cpu_milli=96000, mem_mib=1048576)\n"
        "[gpu_add(node=node, index=i, model='H100-80GB') for i in range(8)]\n"
        "quota_set(tenant=tenant, pool=pool, guaranteed_milli=2_000_000_000)\n"
        "queue_create(tenant=tenant, pool=pool, name='bench')\n"
        "print(token_create(user=user, tenant=tenant, name='bench')[1])\n"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", seed],
        cwd=code,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


@dataclass
class Figures:
    name: str
    requests: int
    failures: int
    rps: float
    p50_ms: float
    p99_ms: float
    batch: int
    cpu_s: float  # the gunicorn workers
    pg_cpu_s: float = 0.0  # the PostgreSQL backends of the scratch database
    client_cpu_s: float = 0.0  # the load generator

    @property
    def tasks_per_s(self) -> float:
        return self.rps * self.batch

    def _per_task_ms(self, seconds: float) -> float:
        done = max(self.requests - self.failures, 1) * self.batch
        return 1000 * seconds / done

    @property
    def cpu_ms_per_task(self) -> float:
        return self._per_task_ms(self.cpu_s)

    @property
    def pg_ms_per_task(self) -> float:
        return self._per_task_ms(self.pg_cpu_s)

    @property
    def client_ms_per_task(self) -> float:
        return self._per_task_ms(self.client_cpu_s)

    @property
    def box_ms_per_task(self) -> float:
        return self._per_task_ms(self.cpu_s + self.pg_cpu_s + self.client_cpu_s)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "N/A" when nothing was sent
        return float("nan")


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _server_cpu_s(master: psutil.Process) -> float:
    total = 0.0
    for process in [master, *master.children(recursive=True)]:
        try:
            total += _cpu_s(process)
        except psutil.NoSuchProcess:
            continue
    return total


class BackendMeter:
    """CPU of the PostgreSQL backends serving one database, sampled every 0.5 s from a thread: a
    backend that ends (Django reconnects after CONN_MAX_AGE) keeps what it used up to its last sample,
    one that starts counts from zero."""

    def __init__(self, database: str) -> None:
        self._needle = f" {database} "
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self, *, first: bool) -> None:
        for process in psutil.process_iter(["cmdline"]):
            try:
                title = " ".join(process.info["cmdline"] or []) + " "
                if not title.startswith("postgres:") or self._needle not in title:
                    continue
                used = _cpu_s(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self._first.setdefault(process.pid, used if first else 0.0)
            self._last[process.pid] = used

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample(first=False)

    def __enter__(self) -> BackendMeter:
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._sample(first=False)

    @property
    def cpu_s(self) -> float:
        return sum(self._last[pid] - self._first[pid] for pid in self._last)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _locust(
    name: str, *, host: str, token: str, scenario: str, batch: int, users: int, duration_s: float,
    master: psutil.Process, out: Path, database: str, path: str = "",
) -> Figures:  # fmt: skip
    env = {
        **os.environ,
        "WG_BENCH_TOKEN": token,
        "WG_BENCH_SCENARIO": scenario,
        "WG_BENCH_BATCH": str(batch),
        "WG_BENCH_PATH": path,
    }
    prefix = out / name
    argv = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
        "-u", str(users), "-r", str(users), "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING",
        "-t", f"{int(duration_s)}s",
    ]  # fmt: skip
    before, client_before = _server_cpu_s(master), _children_cpu_s()
    with BackendMeter(database) as backends:
        done = subprocess.run(
            argv, env=env, check=False, capture_output=True, text=True, timeout=duration_s + 600
        )
        cpu = _server_cpu_s(master) - before
    client = _children_cpu_s() - client_before
    with open(f"{prefix}_stats.csv") as handle:
        row = next(r for r in csv.DictReader(handle) if r["Name"] == "Aggregated")
    if int(row["Request Count"]) == 0 or int(row["Failure Count"]):
        progress(f"{name}: failures:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return Figures(
        name=name,
        requests=int(row["Request Count"]),
        failures=int(row["Failure Count"]),
        rps=float(row["Requests/s"]),
        p50_ms=_number(row["50%"]),
        p99_ms=_number(row["99%"]),
        batch=batch,
        cpu_s=cpu,
        pg_cpu_s=backends.cpu_s,
        client_cpu_s=client,
    )


def _one_big_request(
    *, host: str, token: str, master: psutil.Process, batch: int, repeats: int, database: str
) -> Figures:
    """A pipeline's one big submission, timed end to end (a closed-loop load tool adds nothing here)."""
    body = {
        "tasks": [{"queue": "bench", "gpu_milli": 1, "cpu_milli": 500, "command": ["python", "x.py"]}] * batch
    }
    headers = {"Authorization": f"Bearer {token}"}
    latencies, failures = [], 0
    before, client_before = _server_cpu_s(master), time.process_time()
    with BackendMeter(database) as backends:
        for _ in range(repeats):
            started = time.perf_counter()
            response = requests.post(host + "/api/v1/tasks/bulk/", json=body, headers=headers, timeout=120)
            latencies.append(time.perf_counter() - started)
            failures += response.status_code != 201
        cpu = _server_cpu_s(master) - before
    client = time.process_time() - client_before
    latencies.sort()
    return Figures(
        name=f"bulk of {batch}, 1 request at a time",
        requests=repeats,
        failures=failures,
        rps=repeats / sum(latencies),
        p50_ms=1000 * latencies[len(latencies) // 2],
        p99_ms=1000 * latencies[-1],
        batch=batch,
        cpu_s=cpu,
        pg_cpu_s=backends.cpu_s,
        client_cpu_s=client,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose server to measure")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers (4)")
    parser.add_argument("--users", type=int, default=8, help="concurrent clients (8)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="seconds per timed scenario (20)")
    parser.add_argument("--database", default="wg_api_bench", help="scratch database, dropped and re-created")
    parser.add_argument("--db-host", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/5"))
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument("--forecast-inline", action="store_true", help="forecast in the request (no broker)")
    args = parser.parse_args()
    code = args.code.resolve()
    env = {
        **os.environ,
        "DATABASE_URL": f"{args.db_host}/{args.database}",
        "REDIS_URL": args.redis_url,
        "SECRET_KEY": "bench-only",
        "WHALEGEN_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(code),
    }
    if args.forecast_inline:
        env["WHALEGEN_FORECAST_INLINE"] = "true"
    progress(f"preparing {args.database} for {code}")
    token = _prepare_database(env, code)
    host = f"http://127.0.0.1:{args.port}"
    server_env = {
        **env,
        "PYTHONPATH": f"{code}{os.pathsep}{FLOOR}",
        "DJANGO_SETTINGS_MODULE": "wg_floor_settings",
    }
    server = subprocess.Popen(
        [
            sys.executable, "-m", "gunicorn", "wg_floor_wsgi:application", "-w", str(args.workers),
            "-b", f"127.0.0.1:{args.port}", "--log-level", "warning", "--timeout", "120",
        ],
        cwd=code, env=server_env,
    )  # fmt: skip
    master = psutil.Process(server.pid)
    try:
        for _ in range(120):
            try:
                if requests.get(host + "/api/v1/tasks/", timeout=10).status_code in (200, 401, 403):
                    break
            except requests.RequestException:
                time.sleep(0.5)
        out = Path(tempfile.mkdtemp(prefix="whalegen-bench-api-"))
        common = {
            "host": host, "token": token, "master": master, "out": out, "duration_s": args.duration_s,
            "database": args.database,
        }  # fmt: skip
        progress("warming up")
        _locust("warmup", scenario="single", batch=1, users=args.users, **{**common, "duration_s": 5})
        runs = [
            ("floor: gunicorn, no Django", "get", 1, args.users, "/floor/bare/"),
            ("floor: Django + middleware", "get", 1, args.users, "/api/v1/floor/django/"),
            ("floor: + DRF + token auth", "get", 1, args.users, "/api/v1/floor/drf/"),
            ("baseline GET /api/v1/tenants/", "get", 1, args.users, "/api/v1/tenants/"),
            ("single POST, 1 client", "single", 1, 1, ""),
            (f"single POST, {args.users} clients", "single", 1, args.users, ""),
            (f"bulk of 100, {args.users} clients", "bulk", 100, args.users, ""),
        ]
        results = []
        for index, (name, scenario, batch, users, path) in enumerate(runs):
            progress(name)
            figures = _locust(f"run{index}", scenario=scenario, batch=batch, users=users, path=path, **common)
            figures.name = name
            results.append(figures)
        progress("bulk of 1000, one request at a time")
        results.append(
            _one_big_request(
                host=host, token=token, master=master, batch=1000, repeats=3, database=args.database
            )
        )
    finally:
        # Quick shutdown (SIGINT): on a loaded host a graceful one can outlast any sane wait.
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    baseline = next(r for r in results if r.name.startswith("baseline"))
    print(f"API load — code {code}, gunicorn {args.workers} sync workers, PostgreSQL {args.database}, "
          f"broker {args.redis_url}{' (forecasts inline)' if args.forecast_inline else ''}, "
          f"{args.duration_s:g} s per timed scenario, locust closed loop without think time")  # fmt: skip
    print("CPU ms per task: srv = gunicorn workers, pg = PostgreSQL backends, load = locust, box = sum")
    print(f"{'scenario':34} {'req':>6} {'fail':>5} {'req/s':>8} {'tasks/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'srv':>6} {'pg':>6} {'load':>6} {'box':>6} {'vs baseline':>12}")  # fmt: skip
    for r in results:
        ratio = r.rps / baseline.rps if baseline.rps else float("nan")
        print(f"{r.name:34} {r.requests:6d} {r.failures:5d} {r.rps:8.1f} {r.tasks_per_s:9.1f} "
              f"{r.p50_ms:7.0f} {r.p99_ms:7.0f} {r.cpu_ms_per_task:6.2f} {r.pg_ms_per_task:6.2f} "
              f"{r.client_ms_per_task:6.2f} {r.box_ms_per_task:6.2f} {ratio:11.2f}x")  # fmt: skip
    single = results[5]
    bulk = max(results[6].tasks_per_s, results[7].tasks_per_s)
    cores = os.cpu_count() or 1
    print(f"goals: >=300 single submissions/s with p99 <=100 ms under {args.users} clients: "
          f"{single.rps:.0f}/s, p99 {single.p99_ms:.0f} ms; "
          f">=5000 tasks/s in bulk: {bulk:.0f}/s")  # fmt: skip
    print(f"budget on this host's {cores} cores with everything on them: 300/s needs box <= "
          f"{1000 * cores / 300:.2f} ms/request (single POST: {single.box_ms_per_task:.2f}); "
          f"5000 tasks/s needs <= {1000 * cores / 5000:.2f} ms/task "
          f"(bulk of 100: {results[6].box_ms_per_task:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
