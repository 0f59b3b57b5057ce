"""Agent fleet: N real node agents against the plane started as shipped, for minutes.

    python benchmarks/agent_fleet.py [--agents 200] [--procs 2] [--duration-s 180] [--ramp-s S]
        [--baseline-agents 50] [--baseline-poll-wait-s 20] [--changes-per-s 1] [--json]

What runs (issue #42 item 2):
- **The plane as shipped**: its own PostgreSQL and Redis (`tests.faults.services`, ports
  `WHALEGEN_FAULTS_POSTGRES_PORT` / `WHALEGEN_FAULTS_REDIS_PORT`), gunicorn from `docker/gunicorn.conf.py`
  (port `--web-port`, default `$WHALEGEN_BENCH_WEB_PORT` or 18601), the Celery worker and beat with the
  compose file's commands, JSON logs and access lines as compose sets them, and every other setting at its
  default: none of the plane's intervals is changed here. `--baseline-poll-wait-s` runs the baseline plane
  with that `WHALEGEN_AGENT_POLL_WAIT_S` (20: the default before issue #42).
- **The agents**: `agents.agent.Agent` itself — its loop (1 s tick), its poller thread, its `PlaneClient`s,
  its state file and outbox in a directory of its own — at the intervals the plane hands it at
  registration, on the simulated NVML backend (`agents.sim`: one simulated host of 4 L40S per generator
  process, each agent seeing it under GPU UUIDs of its own, calls serialised: the simulator is one per
  process). `--procs` generator processes run `--agents` ÷ `--procs` agents each, one thread per agent
  plus its poller, so that no one interpreter's GIL holds the load back. The agents start spread over the
  ramp (`--ramp-s`, default one agent per 25th of a second, at least 10 s; each start is a registration,
  a fetch and a partition report); the window starts after the ramp and a warm-up of 30 s.
- **Beside them**: an API client (a platform admin's token) alternating `GET /api/v1/tasks/` and
  `GET /api/v1/pools/` every 0.5 s, and a writer changing `--changes-per-s` nodes' desired states a second
  (benchmarks/heartbeat_load.py's `Writer`: a GPU's partition mode flipped, the node marked), which
  the agents fetch and apply (partition reports through the API) as they would any change.

Prints, per run: heartbeat p50/p99/max and failures, desired-state fetch p50/p99 (and long polls, when
the plane asks for them), API call p50/p99 and failures, the plane's own time per request by path (gunicorn's
access lines: the agents' latency less this is queueing), the longest silence of any agent between two
heartbeats (the generator's own lag shows there first), nodes lost by the end of the window (a false loss:
every agent kept running), the plane's CPU seconds (web, db, Redis, worker + beat, from /proc) per agent
per minute, the generators' own CPU, and the whole machine's busy cores in the window (what is left is
other work on a shared machine), which say whether the load generator and the machine kept up. With a
baseline, the ratios of the two runs. Figures only: nothing here fails on timing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.heartbeat_load import Plane, Window, cpu_of, quantile  # noqa: E402

WARM_UP_S = 30.0
GPUS_PER_NODE = 4
SIM_SPEC = "nodes:\n  - name: fleet\n    gpus:\n" + "      - sku: l40s\n" * GPUS_PER_NODE


def progress(message: str) -> None:
    print(f"[agent-fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class ShippedPlane(Plane):
    """The plane's process set with the shipped commands and settings (compose, docs/operations.md)."""

    def __init__(self, work: Path, *, web_port: int, poll_wait_s: float | None) -> None:
        super().__init__(
            work, web_port=web_port, gunicorn_workers=0, threads=0, keep_alive_s=0.0, poll_wait_s=poll_wait_s
        )
        for name in (
            "WHALEGEN_ACCESS_LOG_LEVEL",
            "WHALEGEN_NODE_HEALTH_INTERVAL_S",
            "WHALEGEN_AGENT_HEARTBEAT_S",
        ):
            self.env.pop(name, None)
        self.env.update(WHALEGEN_LOG_FORMAT="json", WHALEGEN_WEB_BIND=f"127.0.0.1:{web_port}")

    def gunicorn(self, app: str) -> subprocess.Popen[bytes]:
        return self.spawn("gunicorn", "-m", "gunicorn", "-c", "docker/gunicorn.conf.py", app)

    def boot(self, nodes: int) -> tuple[dict[str, str], str]:
        """Start everything, seed `nodes` nodes; the agents' tokens by node name and an admin's API token."""
        progress(f"PostgreSQL (port {self.pg.port}), Redis (port {self.redis.port}), migrate, seed {nodes}")
        self.pg.init()
        self.pg.start()
        subprocess.run([str(self.pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg.port), "-U",
                        "postgres", "whalegen"], check=True)  # fmt: skip
        self.redis.start()
        self.run("manage.py", "migrate", "--noinput")
        tokens: dict[str, str] = json.loads(
            self.run("-m", "tests.faults.plane_scripts", "seed-fleet", str(nodes), str(GPUS_PER_NODE))
        )["tokens"]
        api_token = self.run("-c", _ADMIN_TOKEN).strip().splitlines()[-1]
        self.web = self.gunicorn("whalegen.config.wsgi")
        celery = ("-m", "celery", "-A", "whalegen.config")
        self.worker = self.spawn("worker", *celery, "worker", "--loglevel", "info", "--without-gossip",
                                 "--without-mingle", "--without-heartbeat")  # fmt: skip
        self.beat = self.spawn("beat", *celery, "beat", "--loglevel", "info", "--schedule",
                               str(self.work / "celerybeat-schedule"))  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._answers():
            if time.monotonic() > deadline:
                raise SystemExit("gunicorn did not answer in 120 s")
            time.sleep(0.5)
        return tokens, api_token


_ADMIN_TOKEN = """
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
import django
django.setup()
from django.contrib.auth import get_user_model
from apps.tenants.services import tenant_create, token_create
admin = get_user_model().objects.create_superuser("bench-admin", "bench@example.com", "bench-only")
_, plaintext = token_create(user=admin, tenant=tenant_create(slug="bench", name="Bench"), name="bench")
print(plaintext)
"""


# ---- the generator side: real agents, many per process ----------------------------------------------------
class Recorder:
    """Latencies of the agents' requests sent inside the window, by kind, and each node's heartbeat times."""

    def __init__(self, window: tuple[float, float]) -> None:
        self.window = window
        self.lock = threading.Lock()
        self.ok: dict[str, list[float]] = {"heartbeat": [], "fetch": [], "long_poll": [], "other": []}
        self.failed: dict[str, int] = dict.fromkeys(self.ok, 0)
        self.beats: dict[str, list[float]] = {}

    def record(self, kind: str, node: str, began: float, took: float, ok: bool) -> None:
        if not self.window[0] <= began < self.window[1]:
            return
        with self.lock:
            if ok:
                self.ok[kind].append(took)
            else:
                self.failed[kind] += 1
            if kind == "heartbeat":
                self.beats.setdefault(node, []).append(began)


def timed_client(client: Any, recorder: Recorder, node: str) -> Any:
    """The agent's own `PlaneClient`, its `_request` timed (wall clock; the epoch, as the window is)."""
    from agents.client import PlaneRejected, PlaneUnavailable
    from whalegen.protocol import DESIRED_STATE_PATH, HEARTBEAT_PATH

    send = client._request

    def _request(method: str, path: str, **kwargs: Any) -> Any:
        if path == HEARTBEAT_PATH:
            kind = "heartbeat"
        elif path == DESIRED_STATE_PATH:
            kind = "fetch" if float(kwargs.get("params", {}).get("wait_s", 0)) <= 0 else "long_poll"
        else:
            kind = "other"
        began, clock = time.time(), time.perf_counter()
        try:
            response = send(method, path, **kwargs)
        except (PlaneUnavailable, PlaneRejected):
            recorder.record(kind, node, began, time.perf_counter() - clock, False)
            raise
        recorder.record(kind, node, began, time.perf_counter() - clock, True)
        return response

    client._request = _request
    return client


class NodeView:
    """One agent's view of the process's simulated host: the simulator's answers with this node's GPU UUIDs
    (a fleet's GPUs are distinct), its calls serialised (the simulator serves one caller at a time)."""

    RENAMED = ("inventory", "telemetry", "processes", "instances", "events")

    def __init__(self, backend: Any, lock: threading.Lock, suffix: str) -> None:
        self._backend, self._lock, self._suffix = backend, lock, suffix

    def _rename(self, value: Any) -> Any:
        import dataclasses

        if isinstance(value, list):
            return [self._rename(v) for v in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {}
            for name in ("uuid", "gpu_uuid"):
                if isinstance(getattr(value, name, None), str):
                    changes[name] = f"{getattr(value, name)}-{self._suffix}"
            if isinstance(getattr(value, "instances", None), tuple):
                changes["instances"] = tuple(self._rename(list(value.instances)))
            return dataclasses.replace(value, **changes) if changes else value
        return value

    def open(self) -> None:
        with self._lock:
            if not getattr(self._backend, "_fleet_opened", False):
                self._backend.open()
                self._backend._fleet_opened = True

    def close(self) -> None:
        """The shared simulator stays open for the process's other agents."""

    def cdi_device(self, uuid: str) -> str:
        with self._lock:
            return str(self._backend.cdi_device(uuid.removesuffix(f"-{self._suffix}")))

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._backend, name)
        renamed = name in self.RENAMED

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                value = method(*args, **kwargs)
            return self._rename(value) if renamed else value

        # Kept on the view: the next call finds it without __getattr__ and a new closure (an idle agent
        # makes ~120 backend calls a heartbeat; this is the generator's own overhead, not the agent's).
        setattr(self, name, call)
        return call


def generate(args: argparse.Namespace) -> int:
    """A generator process: `--count` real agents from `--first` of the token file, started spread over
    `--ramp-s`, stopped at `--window-end`; writes what they measured inside the window to `--out`."""
    from agents.agent import Agent, AgentConfig
    from agents.sim.backend import from_spec_file
    from agents.sim.core import CallLog

    work = Path(args.work)
    tokens = sorted(json.loads(Path(args.tokens).read_text()).items())[args.first : args.first + args.count]
    work.mkdir(parents=True, exist_ok=True)
    (work / "host.yaml").write_text(SIM_SPEC)
    system, backend = from_spec_file(work / "host.yaml", "fleet", work / "sim")
    # The call log in memory only (cleared below): nobody reads it here, and its file would take a line
    # per NVML call of every agent (~13 an agent-second: 3 MB/s at 2,000 agents) and the CPU to write it.
    system.log = CallLog()
    lock = threading.Lock()
    recorder = Recorder((args.window_start, args.window_end))
    agents, threads = [], []
    for n, (name, token) in enumerate(tokens):
        config = AgentConfig(server=args.server, token=token, state_dir=work / name, node_name=name,
                             cgroup_root=f"whalegen-fleet-bench-{os.getpid()}")  # fmt: skip
        agent = Agent(config, NodeView(backend, lock, name))  # type: ignore[arg-type]
        agent.client = timed_client(agent.client, recorder, name)
        agent.poll_client = timed_client(agent.poll_client, recorder, name)
        agents.append(agent)
        threads.append(threading.Thread(target=agent.run, name=f"agent-{name}", daemon=True))
        time.sleep(max(0.0, args.started_at + args.ramp_s * n / max(1, len(tokens)) - time.time()))
        threads[-1].start()
    cpu_at_start = None
    while time.time() < args.window_end:
        if cpu_at_start is None and time.time() >= args.window_start:
            cpu_at_start = cpu_of(os.getpid())
        with lock:
            system.log.entries.clear()  # the simulator's call log: nobody reads it here
        time.sleep(0.5)
    cpu_used = (cpu_of(os.getpid()) or 0.0) - (cpu_at_start or 0.0)
    for agent in agents:
        agent.stop()
    for thread in threads:
        thread.join(15)
    registered = sum(agent.node_id is not None for agent in agents)
    applied = sum(agent.generation_applied > 0 for agent in agents)
    result = {"ok": recorder.ok, "failed": recorder.failed, "beats": recorder.beats, "cpu_s": cpu_used,
              "agents": len(agents), "registered": registered,
              "applied_a_desired_state": applied}  # fmt: skip
    Path(args.out).write_text(json.dumps(result))
    return 0


# ---- the driver side ----------------------------------------------------------------------------------
class ApiProbe:
    """A client of the API beside the agents: one call every `every_s`, timed inside the window."""

    PATHS = ("/api/v1/tasks/", "/api/v1/pools/")

    def __init__(self, url: str, token: str, window: tuple[float, float], every_s: float = 0.5) -> None:
        import requests

        self.url, self.window, self.every_s = url, window, every_s
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.latencies: list[float] = []
        self.failed: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import requests

        n = 0
        while time.time() < self.window[1]:
            began, clock = time.time(), time.perf_counter()
            path = self.PATHS[n % len(self.PATHS)]
            try:
                status = self.session.get(self.url + path, timeout=30).status_code
            except requests.RequestException as error:
                status, detail = 0, type(error).__name__
            took = time.perf_counter() - clock
            if began >= self.window[0]:
                if status == 200:
                    self.latencies.append(took)
                else:
                    self.failed.append(f"{path} {status or detail}")
            n += 1
            time.sleep(max(0.0, self.every_s - took))


def _writer(plane: Plane, per_s: float) -> Any:
    """heartbeat_load's writer over the seeded nodes (it wants objects with a node id and a lock)."""
    import psycopg

    from benchmarks.heartbeat_load import Writer

    with psycopg.connect(plane.pg.url("whalegen"), autocommit=True) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM inventory_node ORDER BY id")]
    nodes = [types.SimpleNamespace(node_id=str(i), lock=threading.Lock(), changed_at=None) for i in ids]
    return Writer(plane, nodes, per_s)  # type: ignore[arg-type]


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every process, ours and others'), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def served_ms(log: Path, window: tuple[float, float]) -> dict[str, dict[str, float | int]]:
    """The plane's own time per request, by path, inside the window: gunicorn's JSON access lines
    (`duration_ms`: from the thread taking the request to its answer, without the wait for a free thread
    or for the client's own process). The agents' latency less this is queueing, here or in the generator."""
    import datetime

    durations: dict[str, list[float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"gunicorn.access"' not in line:
            continue
        try:
            entry = json.loads(line)
            at = datetime.datetime.fromisoformat(entry["time"]).timestamp()
        except (ValueError, KeyError):
            continue
        if window[0] <= at < window[1]:
            durations.setdefault(entry["path"].split("?", 1)[0], []).append(entry["duration_ms"] / 1000)
    return {path: _stats(values) for path, values in sorted(durations.items())}


def _stats(values: list[float]) -> dict[str, float | int]:
    return {"count": len(values), "p50_ms": round(quantile(values, 0.5) * 1000, 1),
            "p99_ms": round(quantile(values, 0.99) * 1000, 1),
            "max_ms": round(max(values, default=float("nan")) * 1000, 1)}  # fmt: skip


def _merge(parts: list[dict[str, Any]], window: tuple[float, float]) -> dict[str, Any]:
    ok: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    silences = []
    for part in parts:
        for kind, values in part["ok"].items():
            ok.setdefault(kind, []).extend(values)
        for kind, count in part["failed"].items():
            failed[kind] = failed.get(kind, 0) + count
        for times in part["beats"].values():
            edges = [window[0], *sorted(times), window[1]]
            silences.append(max(b - a for a, b in itertools.pairwise(edges)))
    silent_all_window = sum(p["agents"] for p in parts) - sum(len(p["beats"]) for p in parts)
    return {
        "heartbeat": {**_stats(ok["heartbeat"]), "failed": failed["heartbeat"]},
        "fetch": {**_stats(ok["fetch"]), "failed": failed["fetch"]},
        "long_poll": {"count": len(ok["long_poll"]), "failed": failed["long_poll"]},
        "reports_and_registrations": {**_stats(ok["other"]), "failed": failed["other"]},
        "longest_silence_s": round(max(silences, default=float("nan")), 1),
        "agents_silent_the_whole_window": silent_all_window,
        "registered": sum(p["registered"] for p in parts),
        "applied_a_desired_state": sum(p["applied_a_desired_state"] for p in parts),
        "generator_cpu_s": round(sum(p["cpu_s"] for p in parts), 1),
    }


def run_fleet(
    work: Path, *, agents: int, procs: int, duration_s: float, web_port: int, poll_wait_s: float | None,
    changes_per_s: float, ramp_s: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run: the shipped plane, `agents` real agents in `procs` processes, the window, the figures."""
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    plane = ShippedPlane(work / "plane", web_port=web_port, poll_wait_s=poll_wait_s)
    plane.work.mkdir(parents=True, exist_ok=True)
    generators: list[subprocess.Popen[bytes]] = []
    try:
        tokens, api_token = plane.boot(agents)
        (work / "tokens.json").write_text(json.dumps(tokens))
        ramp_s = max(10.0, agents / 25) if ramp_s is None else ramp_s
        started = time.time() + 3.0
        window = (started + ramp_s + WARM_UP_S, started + ramp_s + WARM_UP_S + duration_s)
        per = -(-agents // procs)
        progress(f"{agents} agents in {procs} processes: ramp {ramp_s:.0f} s, warm-up {WARM_UP_S:.0f} s, "
                 f"window {duration_s:.0f} s")  # fmt: skip
        for i in range(procs):
            out = work / f"generator-{i}.json"
            command = [sys.executable, str(Path(__file__).resolve()), "generate", "--server", plane.url,
                       "--tokens", str(work / "tokens.json"), "--first", str(i * per), "--count", str(per),
                       "--work", str(work / f"gen-{i}"), "--out", str(out), "--started-at", str(started),
                       "--ramp-s", str(ramp_s), "--window-start", str(window[0]),
                       "--window-end", str(window[1])]  # fmt: skip
            with (work / f"generator-{i}.log").open("wb") as log:
                generators.append(subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log))
        probe = ApiProbe(plane.url, api_token, window)
        probe.thread.start()
        writer = _writer(plane, changes_per_s)
        time.sleep(max(0.0, window[0] - time.time()))
        cpu = Window(plane)
        cpu.start()
        generator_cpu = {g.pid: cpu_of(g.pid) or 0.0 for g in generators}
        busy_at_start = machine_busy_s()
        writer.start()
        progress("window open")
        time.sleep(max(0.0, window[1] - time.time()))
        cpu.stop()
        machine_cores = (machine_busy_s() - busy_at_start) / cpu.wall_s
        generator_cpu = {pid: (cpu_of(pid) or 0.0) - used for pid, used in generator_cpu.items()}
        writer.stop()
        lost = plane.lost_nodes()
        for i, g in enumerate(generators):
            if g.wait(timeout=120) != 0:
                raise SystemExit(
                    f"generator {i} failed:\n{(work / f'generator-{i}.log').read_text()[-3000:]}"
                )
        probe.thread.join(60)
        served = served_ms(plane.work / "gunicorn.log", window)
        figures = _merge(
            [json.loads((work / f"generator-{i}.json").read_text()) for i in range(procs)], window
        )
    finally:
        for g in generators:
            if g.poll() is None:
                g.kill()
        plane.stop()
    minutes = cpu.wall_s / 60
    return {
        "agents": agents, "generator_processes": procs, "window_s": round(cpu.wall_s, 1),
        "plane_poll_wait_s": "default" if poll_wait_s is None else poll_wait_s,
        **figures,
        "api": {**_stats(probe.latencies), "failed": len(probe.failed), "failures": probe.failed[:5]},
        "desired_state_changes": writer.changes,
        "served_by_the_plane": served,
        "nodes_falsely_lost": lost,
        "plane_cores": {part: round(cpu.cpu[part] / cpu.wall_s, 3) for part in cpu.cpu}
        | {"all": round(cpu.cores(), 3)},
        "plane_cpu_s_per_agent_per_minute": round(cpu.cores() * cpu.wall_s / agents / minutes, 4),
        "generator_cores": round(sum(generator_cpu.values()) / cpu.wall_s, 3),
        # Every process on the machine: what is left after the plane and the generators is others' work.
        "machine_busy_cores": round(machine_cores, 3),
        "machine_cores": os.cpu_count(),
        "machine_load_average": os.getloadavg(),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="(internal) one generator process")
    for name in ("server", "tokens", "work", "out"):
        gen.add_argument(f"--{name}", required=True)
    for name in ("first", "count"):
        gen.add_argument(f"--{name}", type=int, required=True)
    for name in ("started-at", "ramp-s", "window-start", "window-end"):
        gen.add_argument(f"--{name}", type=float, required=True)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--changes-per-s", type=float, default=1.0)
    parser.add_argument(
        "--ramp-s", type=float, dest="fleet_ramp_s", help="the starts spread over this (default agents / 25)"
    )
    parser.add_argument("--baseline-agents", type=int, help="a baseline run with this many agents")
    parser.add_argument("--baseline-poll-wait-s", type=float,
                        help="the baseline plane's WHALEGEN_AGENT_POLL_WAIT_S (20: the default before "
                             "#42)")  # fmt: skip
    parser.add_argument(
        "--web-port", type=int, default=int(os.environ.get("WHALEGEN_BENCH_WEB_PORT", "18601"))
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.command == "generate":
        return generate(args)
    runs = {"shipped": (args.agents, None)}
    if args.baseline_agents is not None or args.baseline_poll_wait_s is not None:
        runs["baseline"] = (args.baseline_agents or args.agents, args.baseline_poll_wait_s)
    results = {}
    with tempfile.TemporaryDirectory(prefix="whalegen-agent-fleet-") as tmp:
        Path(tmp).chmod(0o755)  # PostgreSQL's own user runs the database under it
        for label, (agents, poll_wait_s) in runs.items():
            progress(f"run {label}: {agents} agents, plane poll wait {poll_wait_s or 'default'}")
            results[label] = run_fleet(Path(tmp) / label, agents=agents, procs=args.procs,
                                       duration_s=args.duration_s, web_port=args.web_port,
                                       poll_wait_s=poll_wait_s, changes_per_s=args.changes_per_s,
                                       ramp_s=args.fleet_ramp_s)  # fmt: skip
    if "baseline" in results:
        a, b = results["shipped"], results["baseline"]
        results["shipped_over_baseline"] = {
            "heartbeat_p99": round(a["heartbeat"]["p99_ms"] / b["heartbeat"]["p99_ms"], 3),
            "api_p99": round(a["api"]["p99_ms"] / b["api"]["p99_ms"], 3),
            "plane_cpu_per_agent": round(
                a["plane_cpu_s_per_agent_per_minute"] / b["plane_cpu_s_per_agent_per_minute"], 3
            ),
        }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for label, figures in results.items():
            print(f"== {label}")
            for key, value in figures.items():
                print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
