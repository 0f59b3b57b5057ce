"""Heartbeat CPU in one web process: the full way against the Redis shortcut, same run, no HTTP.

    DATABASE_URL=postgres://…/scratch REDIS_URL=redis://…/N SECRET_KEY=x \\
        python benchmarks/heartbeat_inprocess.py [--nodes 50] [--rounds 5] [--gpus 4]

Calls `whalegen.config.wsgi.application` in-process the way a gunicorn worker calls it (a WSGI environ,
the real front and services) with the heartbeat of an idle node (inventory, telemetry, no runs) from
`--nodes` nodes (`b00000`…, created in the given scratch database when missing, with fresh credentials),
and reports web-process CPU (`time.process_time`) per heartbeat: the full way
(`WHALEGEN_HEARTBEAT_REDIS=false`), the first heartbeat of each node with the shortcut on (the full way
again, leaving the fingerprint), the shortcut, and the flush that moves the shortcut's beats to
PostgreSQL (the node-health check's share, per node). Building the request bodies is measured apart
and taken out. PostgreSQL's and Redis's own CPU is not in these figures (benchmarks/heartbeat_load.py
counts every process). Prints figures and the same-run ratio; fails on nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
os.environ.setdefault("WHALEGEN_ACCESS_LOG_LEVEL", "WARNING")


def fleet(count: int, gpus: int) -> list[tuple[str, Any]]:
    """(credential, node) of `count` bench nodes, created when missing; every credential fresh."""
    from apps.fleet.nodes import node_token_issue
    from apps.inventory.models import Cluster, Node, Pool
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create

    cluster = Cluster.objects.filter(name="bench-1").first() or cluster_create(name="bench-1", region="lab")
    pool = Pool.objects.filter(name="bench").first() or pool_create(name="bench", runtime="process")
    nodes = []
    for n in range(count):
        node = Node.objects.filter(name=f"b{n:05d}").first()
        if node is None:
            node, _ = node_register(
                cluster=cluster, pool=pool, name=f"b{n:05d}", cpu_milli=64_000, mem_mib=262_144
            )
            for index in range(gpus):
                gpu_add(node=node, index=index, model="L40S")
        nodes.append((node_token_issue(node=node), node))
    return nodes


def heartbeat_body(node: Any, gpus: int) -> bytes:
    from whalegen import protocol as p

    now = time.time()
    inventory = tuple(
        p.GpuInventory(
            j, f"GPU-bench-{node.name}-{j}", "NVIDIA L40S", "L40S", 46_068, f"0000:{j:02x}:00.0", False
        )
        for j in range(gpus)
    )
    telemetry = tuple(
        p.TelemetrySample(g.uuid, now, 1024, 46_068, 37, 12, 140.0, 350.0, 55, 1800, 9000, 0)
        for g in inventory
    )
    message = p.Heartbeat(node_id=str(node.pk), agent_version="bench", sent_at_s=now, inventory=inventory,
                          telemetry=telemetry, running=())  # fmt: skip
    return json.dumps(message.to_dict()).encode()


def call(application: Callable[..., Any], token: str, body: bytes) -> str:
    from whalegen import protocol as p

    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": p.HEARTBEAT_PATH, "SERVER_NAME": "bench", "SERVER_PORT": "80",
        "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
        "HTTP_AUTHORIZATION": f"Bearer {token}", "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
    }  # fmt: skip
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen["status"] = status

    b"".join(application(environ, start_response))
    return seen["status"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gpus", type=int, default=4)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        raise SystemExit("set DATABASE_URL (a scratch PostgreSQL database, migrated) and REDIS_URL")

    from django.conf import settings

    from whalegen.config.wsgi import application  # sets Django up first

    # isort: split
    from apps.fleet import liveness  # imports models: after Django is set up

    nodes = fleet(args.nodes, args.gpus)
    liveness.clear()

    def per_heartbeat_ms(rounds: int) -> float:
        count, began = 0, time.process_time()
        for _ in range(rounds):
            for token, node in nodes:
                status = call(application, token, heartbeat_body(node, args.gpus))
                assert status.startswith("200"), status
                count += 1
        return 1000 * (time.process_time() - began) / count

    began = time.process_time()
    for _ in range(args.rounds):
        for _token, node in nodes:
            heartbeat_body(node, args.gpus)
    body_ms = 1000 * (time.process_time() - began) / (args.rounds * len(nodes))

    settings.WHALEGEN_HEARTBEAT_REDIS = False
    per_heartbeat_ms(1)  # warm: connections, caches, imports
    full_ms = per_heartbeat_ms(args.rounds) - body_ms
    settings.WHALEGEN_HEARTBEAT_REDIS = True
    first_ms = per_heartbeat_ms(1) - body_ms
    shortcut_ms = per_heartbeat_ms(args.rounds) - body_ms
    began = time.process_time()
    flushed = liveness.flush()
    flush_ms = 1000 * (time.process_time() - began) / max(1, flushed.nodes)
    result = {
        "nodes": len(nodes),
        "rounds": args.rounds,
        "load_average": os.getloadavg()[0],
        "cpu_ms_per_heartbeat_full_way": round(full_ms, 3),
        "cpu_ms_per_heartbeat_first_with_shortcut_on": round(first_ms, 3),
        "cpu_ms_per_heartbeat_shortcut": round(shortcut_ms, 3),
        "full_vs_shortcut_ratio": round(full_ms / shortcut_ms, 1) if shortcut_ms > 0 else None,
        "flush_cpu_ms_per_node": round(flush_ms, 3),
        "flushed_nodes": flushed.nodes,
        "cpu_ms_building_a_body": round(body_ms, 3),
    }
    for key, value in result.items():
        print(f"{key:45} {value}")
    liveness.clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
