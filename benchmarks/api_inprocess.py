"""CPU per API request inside one process, two checkouts alternating: the figure a loaded host distorts
least (no server, no load generator, no scheduling between processes).

    python benchmarks/api_inprocess.py --token TOKEN [--code DIR ...] [--requests 300] [--rounds 3]
                                       [--profile single|bulk]

Each round runs, for each checkout in turn (a fresh process with that checkout first on the path),
`--requests` requests of every kind through Django's own WSGI handler (every middleware, DRF, the
service, PostgreSQL, the Celery publish) and prints process CPU ms per request; the database and
token are those benchmarks/api_load.py prepared (`DATABASE_URL`, `REDIS_URL` from the environment).
`--profile KIND` instead prints a cProfile (CPU clock) of that kind in this checkout. Figures only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TASK = {"queue": "bench", "gpu_milli": 1, "cpu_milli": 500, "command": ["python", "train.py"]}
KINDS = {
    "GET /api/v1/tenants/": ("GET", "/api/v1/tenants/", b""),
    "single POST": ("POST", "/api/v1/tasks/", json.dumps(TASK).encode()),
    "bulk of 100 (per task)": ("POST", "/api/v1/tasks/bulk/", json.dumps({"tasks": [TASK] * 100}).encode()),
}


def _measure(token: str, requests: int, profile: str | None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler

    handler = WSGIHandler()
    statuses: list[str] = []

    def call(method: str, path: str, body: bytes) -> None:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method, "PATH_INFO": path, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
            "HTTP_HOST": "127.0.0.1", "wsgi.url_scheme": "http", "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)), "HTTP_AUTHORIZATION": f"Bearer {token}",
            "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr,
        }  # fmt: skip
        b"".join(handler(environ, lambda status, headers, exc=None: statuses.append(status)))

    figures = {}
    for name, (method, path, body) in KINDS.items():
        if profile and not name.startswith(profile):
            continue
        count = max(requests // 50, 4) if name.startswith("bulk") else requests
        for _ in range(5):  # warm: the token remembered, statements and plans built
            call(method, path, body)
        profiler = cProfile.Profile(time.process_time) if profile else None
        started = time.process_time()
        if profiler:
            profiler.enable()
        for _ in range(count):
            call(method, path, body)
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
        per = 1000 * (time.process_time() - started) / count
        figures[name] = per / 100 if name.startswith("bulk") else per
        if not statuses[-1].startswith(("200", "201")):
            raise SystemExit(f"{name}: {statuses[-1]}")
    print(json.dumps(figures))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--token", required=True)
    parser.add_argument("--code", type=Path, action="append", help="checkouts to compare (default: this one)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", choices=["single", "bulk", "GET"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child or args.profile:
        _measure(args.token, args.requests, args.profile)
        return 0
    codes = [c.resolve() for c in (args.code or [ROOT])]
    results: dict[Path, list[dict[str, float]]] = {code: [] for code in codes}
    for round_ in range(args.rounds):
        for code in codes:
            print(f"[bench inprocess] round {round_ + 1}: {code}", file=sys.stderr, flush=True)
            argv = [
                sys.executable,
                __file__,
                "--child",
                "--token",
                args.token,
                "--requests",
                str(args.requests),
            ]
            done = subprocess.run(
                argv, cwd=code, env={**os.environ, "PYTHONPATH": str(code), "WHALEGEN_LOG_LEVEL": "WARNING"},
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            results[code].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"CPU ms per request (bulk: per task) in one process, median of {args.rounds} alternating rounds")
    print(f"{'checkout':40} " + " ".join(f"{name:>24}" for name in KINDS))
    for code, rounds in results.items():
        medians = [sorted(r[name] for r in rounds)[len(rounds) // 2] for name in KINDS]
        print(f"{code!s:40} " + " ".join(f"{m:24.2f}" for m in medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
