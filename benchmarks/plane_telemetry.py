"""The telemetry-fed forecasting plane on a real trace: GenAI pods' GPU memory and duty cycle loaded as
agent samples, then profiles refreshed and the memory-peak model trained through the services.

    DATABASE_URL=postgres://… SECRET_KEY=x python benchmarks/plane_telemetry.py [--traces DIR] [--json]

Builds a scratch tenant, pool and node in the configured database (one A100-80GB per pod, one task per
pod, profile key = the pod), loads `genai-2026/pod_gpu_memory_used_bytes_anon` as `TaskSample` rows
and `pod_gpu_duty_cycle_anon` as `GpuSample` rows on the trace's 57-second grid (relative time, ending
now), runs `profiles_refresh()` and `forecast_model_train(kind="memory_peak")`, prints the timings and
the validation table, and removes everything it made (models included) unless --keep. The trace's
values are scaled (see the traces README): figures are shapes and rates, not absolute GB.

Use a scratch database: the memory-peak model is plane-wide and trains on every task sample there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def _setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()


def _csv(path: Path) -> pd.DataFrame:
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".csv"))
        handle = tar.extractfile(member)
        assert handle is not None
        return pd.read_csv(handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--traces", default=os.environ.get("WHALEGEN_TRACES_DIR", str(ROOT.parent / "shared/traces"))
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    _setup_django()
    from django.utils import timezone

    from apps.fleet.models import GpuSample, TaskSample
    from apps.forecasting.models import ForecastModel
    from apps.forecasting.services import forecast_model_train, profiles_refresh
    from apps.inventory.models import Gpu
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.tenants.services import tenant_create
    from apps.workloads.models import Task, TaskProfile
    from apps.workloads.services import queue_create

    genai = Path(args.traces) / "genai-2026"
    mem = _csv(genai / "pod_gpu_memory_used_bytes_anon.tar.gz").dropna(subset=["container_ip"])
    util = _csv(genai / "pod_gpu_duty_cycle_anon.tar.gz").dropna(subset=["container_ip"])
    now = timezone.now().replace(microsecond=0)
    t_end = float(max(mem["timestamp_anon"].max(), util["timestamp_anon"].max()))
    pods = sorted(mem["container_ip"].unique())
    tag = f"genai-{int(time.time())}"
    out: dict[str, Any] = {"pods": len(pods), "memory_rows": len(mem), "duty_cycle_rows": len(util)}
    # 1. Scratch fleet: one GPU per pod (8 per node), one running task per pod.
    started = time.perf_counter()
    tenant = tenant_create(slug=tag, name=tag)
    pool = pool_create(name=tag, runtime="process")
    cluster = cluster_create(name=tag)
    queue = queue_create(tenant=tenant, pool=pool, name="serve")
    gpu_of: dict[str, Gpu] = {}
    for i, pod in enumerate(pods):
        if i % 8 == 0:
            node, _ = node_register(cluster=cluster, pool=pool, name=f"n{i // 8:03d}", cpu_milli=128_000,
                                    mem_mib=1_048_576)  # fmt: skip
        gpu_of[pod] = gpu_add(node=node, index=i % 8, model="A100-80GB")
    first = mem.groupby("container_ip")["timestamp_anon"].min()
    tasks = {
        pod: Task.objects.create(
            tenant=tenant,
            queue=queue,
            pool=pool,
            priority=0,
            profile_key=f"pod-{pod[:8]}",
            state=Task.State.RUNNING,
            started_at=now - timedelta(seconds=t_end - float(first[pod])),
        )
        for pod in pods
    }

    def at(ts: float) -> Any:
        return now - timedelta(seconds=t_end - float(ts))

    TaskSample.objects.bulk_create(
        (
            TaskSample(
                task=tasks[r.container_ip],
                gpu=gpu_of[r.container_ip],
                at=at(r.timestamp_anon),
                pid=1,
                used_mib=int(r.value / 2**20),
            )
            for r in mem.itertuples()
        ),
        batch_size=5_000,
    )
    GpuSample.objects.bulk_create(
        (
            GpuSample(gpu=gpu_of[r.container_ip], at=at(r.timestamp_anon), util_gpu_pct=round(r.value))
            for r in util.itertuples()
            if r.container_ip in gpu_of
        ),
        batch_size=5_000,
    )
    from django.db import connection

    with connection.cursor() as cursor:  # what autovacuum would do after such a load
        cursor.execute("ANALYZE fleet_tasksample; ANALYZE fleet_gpusample")
    out["load_s"] = round(time.perf_counter() - started, 1)
    try:
        # 2. Profiles, one key per pod.
        started = time.perf_counter()
        out["profiles"] = profiles_refresh(now=now)
        out["profiles_s"] = round(time.perf_counter() - started, 2)
        rows = list(TaskProfile.objects.filter(tenant=tenant).values("mem_growth", "gpu_util_p95"))
        out["memory_patterns"] = pd.Series([r["mem_growth"] for r in rows]).value_counts().to_dict()
        # 3. The memory-peak model through the plane.
        started = time.perf_counter()
        outcome = forecast_model_train(kind="memory_peak", now=now)
        out["memory_train_s"] = round(time.perf_counter() - started, 2)
        out["memory_promoted"] = outcome.promoted
        out["memory_reason"] = outcome.reason
        if outcome.model is not None:
            metrics = outcome.model.metrics
            out["memory"] = {
                name: {k: round(v, 4) for k, v in scores.items()}
                for name, scores in metrics["models"].items()
            }
            out["memory_margins"] = metrics["margins"]
            out["memory_n"] = {"train": metrics["n_train"], "test": metrics["n_test"]}
    finally:
        if not args.keep:
            ForecastModel.objects.filter(kind="memory_peak", trained_at=now).delete()
            TaskSample.objects.filter(task__tenant=tenant).delete()
            GpuSample.objects.filter(gpu__node__pool=pool).delete()
            TaskProfile.objects.filter(tenant=tenant).delete()
            Task.objects.filter(tenant=tenant).delete()
            queue.delete()
            Gpu.objects.filter(node__pool=pool).delete()
            pool.nodes.all().delete()
            pool.delete()
            cluster.delete()
            tenant.delete()
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(
        f"{out['pods']} pods, {out['memory_rows']} memory and {out['duty_cycle_rows']} duty-cycle "
        f"samples, loaded in {out['load_s']} s"
    )
    print(
        f"profiles_refresh: {out['profiles']} keys in {out['profiles_s']} s; "
        f"patterns {out['memory_patterns']}"
    )
    print(
        f"memory_peak: {out['memory_train_s']} s, promoted={out['memory_promoted']}: {out['memory_reason']}"
    )
    for name, scores in out.get("memory", {}).items():
        print(f"  {name:12s} under {scores['under_rate']:.4f}  saved {scores['saved_vs_request']:.4f}  "
              f"reserved/actual {scores['reserved_over_actual']:.3f}  n {int(scores['n'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
