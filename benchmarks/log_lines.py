"""What a structured, redacted log line costs the process that writes it, against gunicorn's stock access
line (the baseline: what every web access line cost before issue #42 item 3).

    python benchmarks/log_lines.py [--lines N] [--repeat R]

Each case logs N records through a real `logging.Logger` and handler into memory (no disk, no terminal),
so the figure is logging's own work: the logger call, the filters, the formatter. Cases:
- `gunicorn stock access`: the Apache-style message, `%(message)s`, no filter (the baseline);
- `plane json access`: an access record with its fields (`whalegen.gunicornlog` writes these) through
  `RedactFilter` and `JsonFormatter`, as an agent's heartbeat makes it (its credential in a header, which
  no access line holds);
- `plane json access, token`: the same with `?token=wgn_…` in its path (the worst case: redacted);
- `plane plain access, token`: that record through `PlainFormatter`;
- `plane json app line`: an application line with a node and task id and no credential.
Prints the best of R runs as process-CPU microseconds per line and the ratio to the baseline, and what
the JSON access line costs per second at 2,000 agents heartbeating every 10 s (200 requests/s).
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from whalegen.logformat import JsonFormatter, PlainFormatter, RedactFilter  # noqa: E402

AGENTS = 2_000
HEARTBEAT_S = 10.0
PATH = "/api/v1/agent/heartbeat/"
TOKEN_PATH = "/api/v1/agent/desired-state/?generation=41&token=wgn_" + "k" * 40
APACHE = '127.0.0.1 - - [07/Dec/2026:16:53:21 +0000] "POST %s HTTP/1.1" 200 17 "-" "python-requests/2.32"'
ACCESS_FIELDS = {
    "request_id": "12390bcfbce948e2982ce366e5d15218",
    "node": "gpu-001",
    "method": "POST",
    "path": PATH,
    "status": 200,
    "duration_ms": 5.9,
    "bytes": 357,
    "remote_addr": "127.0.0.1",
}


def _logger(name: str, formatter: logging.Formatter, *, redact: bool) -> logging.Logger:
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(formatter)
    if redact:
        handler.addFilter(RedactFilter())
    log = logging.getLogger(f"bench.{name}")
    log.handlers = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log


def _cases() -> dict[str, Callable[[], None]]:
    stock = _logger("stock", logging.Formatter("%(message)s"), redact=False)
    json_log = _logger("json", JsonFormatter(), redact=True)
    plain_log = _logger("plain", PlainFormatter(), redact=True)
    task = {"node": "gpu-001", "task_id": "42", "attempt": 3}
    token = dict(ACCESS_FIELDS, path=TOKEN_PATH)
    return {
        "gunicorn stock access": lambda: stock.info(APACHE, PATH),
        "plane json access": lambda: json_log.info("%s %s %s", "POST", PATH, 200, extra=ACCESS_FIELDS),
        "plane json access, token": lambda: json_log.info("%s %s %s", "GET", TOKEN_PATH, 200, extra=token),
        "plane plain access, token": lambda: plain_log.info("%s %s %s", "GET", TOKEN_PATH, 200, extra=token),
        "plane json app line": lambda: json_log.info("task %s attempt %d %s", "42", 3, "running", extra=task),
    }


def _best_cpu_us(lines: int, repeat: int, write: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(lines):
            write()
        best = min(best, time.process_time() - started)
    return best / lines * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    figures = {name: _best_cpu_us(args.lines, args.repeat, write) for name, write in _cases().items()}
    baseline = figures["gunicorn stock access"]
    print(f"{args.lines} lines per run, best of {args.repeat}; process CPU per line")
    for name, us in figures.items():
        print(f"  {name:26s} {us:7.2f} us   x{us / baseline:5.2f} the baseline")
    rate = AGENTS / HEARTBEAT_S
    json_ms = figures["plane json access"] * rate / 1000
    stock_ms = baseline * rate / 1000
    print(f"at {AGENTS} agents / {HEARTBEAT_S:g} s heartbeats ({rate:g} access lines/s): json access lines "
          f"{json_ms:.1f} ms CPU per second (stock {stock_ms:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
