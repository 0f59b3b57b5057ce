"""Synthetic finished runs with a real signal: the profile key sets a base duration and more GPUs make
a run proportionally shorter, with ±10 % log-normal noise. The key's history alone mixes GPU counts,
so a model that also reads the request beats both the key history and the plane's median."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np

from apps.workloads.models import Queue, Task

BASE_S = {"resnet": 600.0, "bert": 3_600.0, "llama": 14_400.0, "tiny": 60.0}


def true_duration_s(profile_key: str, gpu_count: int) -> float:
    return BASE_S[profile_key] / gpu_count


def make_runs(
    queue: Queue,
    n: int,
    *,
    now: datetime,
    days: float = 10.0,
    seed: int = 0,
    keys: tuple[str, ...] = tuple(BASE_S),
) -> list[Task]:
    """`n` succeeded tasks of `queue`, started evenly over the `days` before `now`, all finished by now.
    Stored in one bulk insert (no submission, no quota charge: these are history, not live work)."""
    rng = np.random.default_rng(seed)
    tasks = []
    span_s = days * 86_400.0
    for i in range(n):
        key = keys[int(rng.integers(len(keys)))]
        gpus = int(rng.choice([1, 2, 4]))
        dur_s = true_duration_s(key, gpus) * float(np.exp(rng.normal(0.0, 0.1)))
        started = now - timedelta(seconds=span_s * (1.0 - i / n) + 20 * 3_600)
        tasks.append(
            Task(
                tenant=queue.tenant,
                queue=queue,
                pool=queue.pool,
                name=f"run{i}",
                priority=0,
                state=Task.State.SUCCEEDED,
                gpu_count=gpus,
                profile_key=key,
                started_at=started,
                finished_at=started + timedelta(seconds=dur_s),
            )
        )
    return Task.objects.bulk_create(tasks)
