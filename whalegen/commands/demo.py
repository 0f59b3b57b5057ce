"""`whalegen demo`: the whole plane on its embedded default, with nothing to configure.

Migrates the database (an SQLite file under WHALEGEN_DATA_DIR unless DATABASE_URL is set), seeds a
believable fleet once from docs/examples/fleet.yaml, through `apply` (two clusters; pools of H100 and
H200 with MIG, A100 and L4; three tenants with quotas, queues and a few tasks), prints fresh tokens, an
admin login and a team members' login, and serves the dashboard, the API and the admin. Celery runs
in-process: beat entries fire from a thread, tasks run eagerly — among them the scheduling cycle per
pool and the node-health check.

Then it runs the loop: one simulated agent per seeded node (the real `whalegen agent` on the simulated
NVML, each with a node credential issued at start) and a workload generator drawing task shapes from
the openb trace ($WHALEGEN_TRACES_DIR, built-in shapes if absent), with a status line every 10 s.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ADMIN_USERNAME = "admin"
# (team slug, member username): one member per tenant, each gets a token on every start.
TEAMS = [("vision", "vera"), ("speech", "sam"), ("ranking", "rita")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (8000)")
    parser.add_argument("--no-serve", action="store_true", help="migrate, seed, print the logins, and exit")
    parser.add_argument(
        "--serve-seconds", type=float, default=None, help="stop serving after this many seconds (for tests)"
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=None,
        help="simulated agents to start, one per node (default: every node)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also log every HTTP request and Celery task (noisy)"
    )
    parser.add_argument(
        "--workload-interval-s", type=float, default=2.0, help="seconds between generated tasks; 0 = none (2)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed of the workload generator")


def _progress(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


# The demo's fleet is the example fleet file a new operator starts from (docs/apply.md): two clusters;
# pools of H100 and H200 with MIG, A100 and L4 with MPS; three teams with members, queues, quotas, a
# budget and GPU prices. Its nodes carry their GPUs because the demo's simulated hosts exist only once
# registered; a real host joins with the GPUs it has.
FLEET_FILE = Path("docs") / "examples" / "fleet.yaml"


def _seed_fleet() -> None:
    """Everything in the example fleet file, through the service `whalegen apply` calls (as the system, a
    platform admin), so the demo is seeded exactly as an operator's `whalegen apply -f` would."""
    import yaml
    from django.conf import settings

    from apps.declarative.services import objects_apply
    from apps.tenants.selectors import Access

    path = Path(settings.BASE_DIR) / FLEET_FILE
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    sources = [f"{FLEET_FILE}#{number}" for number in range(1, len(documents) + 1)]
    results = objects_apply(
        documents=documents, sources=sources, access=Access(platform_admin=True), user=None
    )
    refused = [f"{r.kind} {r.key}: {r.reason}" for r in results if r.outcome == "refused"]
    if refused:
        raise RuntimeError(f"{FLEET_FILE} did not apply: " + "; ".join(refused))


def _seed_tasks() -> None:
    """A few tasks per team, submitted as its member, so the dashboard has history from the first page."""
    from django.contrib.auth import get_user_model

    from apps.tenants.models import Tenant
    from apps.workloads.services import TaskSubmission, task_submit

    user_model = get_user_model()
    samples = {
        "vision": [
            TaskSubmission(queue="train", name="resnet-ablation", gpu_count=4, kind="training",
                           command=_work("resnet50 ablation: epoch", 6, 30), profile_key="resnet50"),
            TaskSubmission(queue="train", name="vit-eval", gpu_milli=430, isolation="mig", kind="batch",
                           command=_work("vit eval: shard", 4, 15), profile_key="vit-eval"),
        ],
        "speech": [
            TaskSubmission(queue="train", name="asr-finetune", gpu_count=2, gpu_mem_mib=120_000,
                           kind="training", command=_work("whisper fine-tune lr=3e-5: step", 8, 20),
                           profile_key="whisper-ft"),
        ],
        "ranking": [
            TaskSubmission(queue="serve", name="ranker-canary", gpu_milli=250, isolation="mps",
                           kind="inference", sla_class="online", preemptible=False,
                           command=_work("ranker canary: served batch", 20, 15), profile_key="ranker"),
        ],
    }  # fmt: skip
    for slug, member in TEAMS:
        tenant = Tenant.objects.get(slug=slug)
        user = user_model.objects.get(username=member)
        for request in samples[slug]:
            task_submit(tenant=tenant, request=request, submitted_by=user)


def _work(what: str, steps: int, step_s: int) -> list[str]:
    """A seeded task's command. The demo's hosts are this machine and the agents really run what a task
    names, so the samples run the simulator's stand-in CUDA program, which prints progress and declares
    1 GiB and 60 % of its GPU's SMs to the simulated NVML (a GPU nothing declares reads 0 %, and the
    idle check would flag the task: docs/idle-reclaim.md)."""
    app = [sys.executable, "-m", "agents.sim.fake_cuda_app", "--alloc-mib", "1024", "--sm-pct", "60"]
    return [*app, "--steps", str(steps), "--step-s", str(step_s), "--say", what]


def seed() -> bool:
    """Seed once; later starts keep what is there. Returns True when it seeded now."""
    from django.db import transaction

    from apps.inventory.models import Cluster

    if Cluster.objects.filter(name="eu-west-1").exists():
        return False
    with transaction.atomic():
        _seed_fleet()
        _seed_tasks()
    return True


def logins() -> tuple[str, str, list[tuple[str, str, str]]]:
    """A fresh admin password, a fresh password shared by the team members (for the dashboard; the demo
    only) and one fresh token per team member (tokens are shown once, so each start makes new ones). The
    tokens an earlier start printed are revoked, as its passwords are replaced: a demo's old terminal
    output must not keep opening the plane for 90 days."""
    from django.contrib.auth import get_user_model

    from apps.tenants.models import ApiToken, Tenant
    from apps.tenants.services import token_create, token_revoke

    user_model = get_user_model()
    password = secrets.token_urlsafe(12)
    admin, _ = user_model.objects.get_or_create(
        username=ADMIN_USERNAME, defaults={"email": "admin@acme.example"}
    )
    admin.is_staff = admin.is_superuser = True
    admin.set_password(password)
    admin.save()
    member_password = secrets.token_urlsafe(9)
    tokens = []
    for slug, member in TEAMS:
        user = user_model.objects.get(username=member)
        user.set_password(member_password)
        user.save(update_fields=["password"])
        tenant = Tenant.objects.get(slug=slug)
        for old in ApiToken.objects.filter(user=user, tenant=tenant, name="demo", revoked_at__isnull=True):
            token_revoke(token=old)
        _, raw = token_create(user=user, tenant=tenant, name="demo")
        tokens.append((slug, member, raw))
    return password, member_password, tokens


def _queues_by_tenant() -> list[tuple[str, str]]:
    """Each team's queues with their pools, as the announcement lists them."""
    from apps.workloads.models import Queue

    listed: dict[str, list[str]] = {}
    for queue in Queue.objects.select_related("tenant", "pool").order_by("tenant__slug", "name"):
        listed.setdefault(queue.tenant.slug, []).append(f"{queue.name} (pool {queue.pool.name})")
    return [(slug, ", ".join(names)) for slug, names in listed.items()]


def _beat_thread(stop: threading.Event) -> threading.Thread:
    """The embedded stand-in for `celery beat`: fire each schedule entry at its interval, in-process."""
    from django.conf import settings
    from django.db import close_old_connections

    from whalegen.config.celery import app

    # Import every app's tasks.py now: autodiscovery is lazy, and an entry whose task module nobody
    # imported yet would be skipped for good (the scheduling cycle among them).
    app.loader.import_default_modules()
    entries = [(entry["task"], float(entry["schedule"])) for entry in settings.CELERY_BEAT_SCHEDULE.values()]
    due = {name: time.monotonic() + interval for name, interval in entries}

    def loop() -> None:
        while not stop.wait(1.0):
            for name, interval in entries:
                if time.monotonic() >= due[name] and name in app.tasks:
                    due[name] = time.monotonic() + interval
                    app.tasks[name].apply()
                    close_old_connections()

    thread = threading.Thread(target=loop, name="whalegen-beat", daemon=True)
    thread.start()
    return thread


def _status_thread(stop: threading.Event, interval_s: float = 10.0) -> threading.Thread:
    from django.db import close_old_connections

    from apps.fleet.demo import status_line

    def loop() -> None:
        while not stop.wait(interval_s):
            _progress(status_line())
            close_old_connections()

    thread = threading.Thread(target=loop, name="whalegen-status", daemon=True)
    thread.start()
    return thread


def _port_problem(host: str, port: int) -> str | None:
    """Why the demo cannot listen on host:port, asked before migrating and seeding so that a port taken by
    another demo (or anything else) is one clear line, not a traceback after a minute of set-up."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # The server sets SO_REUSEADDR too: a port left in TIME_WAIT by an earlier demo is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return f"cannot listen on {host}:{port}: {error.strerror} (another demo running? pass --port N)"
    return None


def _serve(host: str, port: int, serve_seconds: float | None, on_ready: Any) -> None:
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    httpd = ThreadedWSGIServer((host, port), WSGIRequestHandler, ipv6=":" in host)
    httpd.set_app(StaticFilesHandler(get_wsgi_application()))
    stop = threading.Event()
    on_done = on_ready(httpd.server_address[1])
    _beat_thread(stop)
    _status_thread(stop)
    timer = None
    if serve_seconds is not None:
        # A daemon timer, cancelled on the way out: a plain one kept the process alive after SIGTERM
        # until `--serve-seconds` ran out (seen: 40 s and more after the signal with --serve-seconds 120).
        timer = threading.Timer(serve_seconds, httpd.shutdown)
        timer.daemon = True
        timer.start()
    # SIGTERM (a service manager, a test) ends the demo like Ctrl-C, so the agents are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if timer is not None:
            timer.cancel()
        stop.set()
        on_done()
        httpd.server_close()


def _sqlite_wal() -> None:
    """Let the agents' reads go on while a cycle writes: SQLite's write-ahead log (kept in the file)."""
    from django.db import connection

    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")


def _start_loop(args: argparse.Namespace, url: str) -> Any:
    """Start the simulated agents and the workload generator; return what stops them."""
    from pathlib import Path

    from django.conf import settings

    from apps.fleet.demo import SimulatedAgents, WorkloadGenerator

    agents = SimulatedAgents(Path(settings.DATA_DIR) / "agents", url, limit=args.agents)
    started = agents.start() if args.agents != 0 else 0
    _progress(f"started {started} simulated agents (logs under {agents.work_dir})")
    generator = None
    if args.workload_interval_s > 0:
        generator = WorkloadGenerator(
            Path(settings.WHALEGEN_TRACES_DIR), interval_s=args.workload_interval_s, seed=args.seed
        )
        generator.start()
        _progress(f"workload generator: a task every {args.workload_interval_s:g} s from {generator.source}")

    def stop() -> None:
        if generator is not None:
            generator.stop()
        agents.stop()

    return stop


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    # A person watches this terminal: plain lines (JSON is the default for every other process; the
    # simulated agents this starts inherit it too, writing their files under the work directory).
    os.environ.setdefault("WHALEGEN_LOG_FORMAT", "plain")
    if not args.verbose:
        # Ten agents poll and report every second: their request lines and each cycle's Celery trace
        # would bury the status line a newcomer is watching. Through settings, so that every
        # django.setup() (building the WSGI app runs it again) keeps it.
        os.environ.setdefault("WHALEGEN_ACCESS_LOG_LEVEL", "WARNING")
    # A newcomer should see an idle GPU flagged within minutes, not after the production half hour.
    os.environ.setdefault("WHALEGEN_IDLE_AFTER_S", "120")
    os.environ.setdefault("WHALEGEN_IDLE_CHECK_INTERVAL_S", "20")
    # Ten agents: each may hold a long poll (a change reaches its agent within a second, not with its next
    # heartbeat); the plane's default (0) is sized for fleets of thousands (docs/fleet.md, "Change marks").
    os.environ.setdefault("WHALEGEN_AGENT_POLL_WAIT_S", "20")
    if args.host not in {"127.0.0.1", "localhost", "::1"} and "ALLOWED_HOSTS" not in os.environ:
        # Reached by another name or address than loopback: accept whatever Host the browser sends.
        os.environ["ALLOWED_HOSTS"] = "*"
    problem = None if args.no_serve else _port_problem(args.host, args.port)
    if problem is not None:
        print(f"demo: {problem}", file=sys.stderr)
        return 2
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    database = settings.DATABASES["default"]
    _progress(f"database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}")
    _progress("migrating")
    call_command("migrate", interactive=False, verbosity=0)
    _sqlite_wal()
    _progress(
        "seeding the fleet, tenants, quotas and queues" if seed() else "already seeded; keeping the data"
    )
    password, member_password, tokens = logins()
    queues = _queues_by_tenant()

    from apps.fleet.demo import isolation_line

    def announce(port: int) -> Any:
        shown_host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{shown_host}:{port}"
        lines = [
            f"WhaleGen demo serving at {url}",
            f"  dashboard: {url}/   login: {ADMIN_USERNAME} / {password} (platform admin), or a team member "
            f"({', '.join(member for _, member in TEAMS)}) / {member_password}",
            f"  API:     {url}/api/v1/   (Swagger UI: {url}/api/docs/)",
            f"  runtime: {isolation_line()}",
            f"  admin:   {url}/admin/    login: {ADMIN_USERNAME} / {password}",
            "  tokens (shown once; each scoped to one tenant):",
        ]
        lines += [f"    {slug:<8} {member:<5} {raw}" for slug, member, raw in tokens]
        lines.append("  queues (submit with a tenant's token to one of its queues):")
        lines += [f"    {slug:<8} {names}" for slug, names in queues]
        lines += [
            "  try:",
            f"    curl -H 'Authorization: Bearer {tokens[0][2]}' {url}/api/v1/tasks/",
            f"    WHALEGEN_URL={url} WHALEGEN_TOKEN={tokens[0][2]} whalegen tasks ls",
        ]
        print("\n".join(lines), flush=True)
        return _start_loop(args, url)

    if args.no_serve:
        args.agents, args.workload_interval_s = 0, 0.0
        announce(args.port)()
        return 0
    _serve(args.host, args.port, args.serve_seconds, announce)
    return 0
