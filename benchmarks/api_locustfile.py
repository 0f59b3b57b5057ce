"""Locust users for benchmarks/api_load.py (run by it; not on its own). Settings come from the
environment the driver sets: WG_BENCH_TOKEN, WG_BENCH_SCENARIO (get | single | bulk), WG_BENCH_BATCH,
WG_BENCH_PATH (what `get` reads)."""

from __future__ import annotations

import itertools
import json
import os

from locust import HttpUser, task

TOKEN = os.environ.get("WG_BENCH_TOKEN", "")
SCENARIO = os.environ.get("WG_BENCH_SCENARIO", "single")
BATCH = int(os.environ.get("WG_BENCH_BATCH", "100"))
PATH = os.environ.get("WG_BENCH_PATH", "/api/v1/tenants/")
# A fractional GPU, so a long run never meets the (large) quota; the shape a CI pipeline submits.
TASK = {"queue": "bench", "gpu_milli": 1, "cpu_milli": 500, "command": ["python", "train.py"]}
_serial = itertools.count()


class Submitter(HttpUser):
    # No think time: each user sends its next request when the last one is answered (closed loop).
    def on_start(self) -> None:
        self.client.headers.update({"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        self.single = json.dumps(TASK)
        self.bulk = json.dumps({"tasks": [TASK] * BATCH})

    @task
    def submit(self) -> None:
        if SCENARIO == "get":
            # The baselines: the floor endpoints, and `GET /api/v1/tenants/` (token auth, the caller's
            # access and one small list; every version of the plane has it).
            with self.client.get(PATH, name="get", catch_response=True) as response:
                if response.status_code != 200:
                    response.failure(f"HTTP {response.status_code}")
        elif SCENARIO == "single":
            with self.client.post(
                "/api/v1/tasks/", data=self.single, name="submit", catch_response=True
            ) as r:
                if r.status_code != 201:
                    r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
        else:
            with self.client.post(
                "/api/v1/tasks/bulk/", data=self.bulk, name=f"bulk{BATCH}", catch_response=True
            ) as r:
                if r.status_code != 201:
                    r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
