"""Synthetic agent telemetry with a real signal for the memory-peak model: one task starts every hour
and runs four hours, sampled every two minutes. A third hold their memory flat, a third grow linearly
from 30 % to their peak (a bound from the peak so far is too low for them), a third oscillate ±20 %
around their level. Tasks still inside their four hours at `now` are running."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np

from apps.fleet.models import TaskSample
from apps.inventory.models import Gpu
from apps.workloads.models import Queue, Task

STEP_S = 120
LIFE_S = 4 * 3_600


def memory_curve(k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    level = rng.uniform(4_000, 30_000)
    i = np.arange(n)
    if k % 3 == 0:
        v = np.full(n, level) + rng.normal(0, level * 0.01, n)
    elif k % 3 == 1:
        v = level * (0.3 + 0.7 * i / n) + rng.normal(0, level * 0.01, n)
    else:
        v = level * (1 + 0.2 * np.sin(i * STEP_S / 900.0 + k)) + rng.normal(0, level * 0.02, n)
    return np.round(v)


def make_telemetry(queue: Queue, gpu: Gpu, *, now: datetime, n_tasks: int = 48, seed: int = 3) -> list[Task]:
    rng = np.random.default_rng(seed)
    tasks, samples = [], []
    n = LIFE_S // STEP_S
    for k in range(n_tasks):
        start = now - timedelta(hours=n_tasks - k)
        running = start + timedelta(seconds=LIFE_S) > now
        task = Task.objects.create(
            tenant=queue.tenant, queue=queue, pool=queue.pool, priority=0, profile_key=f"job{k % 3}",
            state=Task.State.RUNNING if running else Task.State.SUCCEEDED, started_at=start,
            finished_at=None if running else start + timedelta(seconds=LIFE_S),
        )  # fmt: skip
        curve = memory_curve(k, n, rng)
        for i in range(n):
            at = start + timedelta(seconds=i * STEP_S)
            if at > now:
                break
            samples.append(TaskSample(task=task, gpu=gpu, at=at, pid=100 + k, used_mib=int(curve[i])))
        tasks.append(task)
    TaskSample.objects.bulk_create(samples, batch_size=2_000)
    return tasks
