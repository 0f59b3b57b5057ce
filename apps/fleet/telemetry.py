"""Telemetry rows: GPU samples and task-process samples, from one heartbeat taken the full way
(`samples_store`) or from many queued by the heartbeat shortcut (`samples_store_batch`, the liveness
flush). The same rows either way."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from apps.fleet.models import GpuSample, TaskSample
from apps.fleet.selectors import parse_run
from apps.inventory.models import Gpu, Node
from apps.scheduling.models import Assignment
from whalegen import protocol as p

_SAMPLES_SQL = (
    f"INSERT INTO {GpuSample._meta.db_table} (gpu_id, at, mem_used_mib, mem_total_mib, util_gpu_pct, "
    "util_mem_pct, power_w, temperature_c, sm_clock_mhz, ecc_uncorrected_aggregate) VALUES "
)
_SAMPLE_ROW = "(" + ", ".join(["%s"] * 10) + ")"


def samples_store(*, node: Node, message: p.Heartbeat, gpus: dict[str, Gpu], now: datetime) -> None:
    """Stamped with the plane's clock (agents' clocks may drift); within a heartbeat of the truth."""
    rows = [
        (gpus[s.gpu_uuid].pk, now, s.mem_used_mib, s.mem_total_mib, s.util_gpu_pct, s.util_mem_pct, s.power_w,
         s.temperature_c, s.sm_clock_mhz, s.ecc_uncorrected_aggregate)
        for s in message.telemetry
        if s.gpu_uuid in gpus
    ]  # fmt: skip
    if rows:  # one multi-row INSERT (the ORM's bulk_create cost more CPU to build than the insert took)
        with connection.cursor() as cursor:
            sql = _SAMPLES_SQL + ", ".join([_SAMPLE_ROW] * len(rows))
            cursor.execute(sql, [value for row in rows for value in row])
    runs = {s.pid: parse_run(s.task_id, s.attempt) for s in message.processes if s.task_id}
    task_ids = {run[0] for run in runs.values() if run is not None}
    if not task_ids:  # no task process sampled: nothing to check or store (not even a query to build)
        return
    # Only tasks this node was given: a process claiming another node's task is not recorded.
    mine = set(Assignment.objects.filter(node=node, task_id__in=task_ids).values_list("task_id", flat=True))
    TaskSample.objects.bulk_create(
        TaskSample(task_id=run[0], gpu=gpus[s.gpu_uuid], at=now, pid=s.pid, used_mib=s.used_mib)
        for s in message.processes
        if (run := runs.get(s.pid)) is not None and run[0] in mine and s.gpu_uuid in gpus
    )


def samples_store_batch(
    *,
    batch: list[tuple[int, datetime, tuple[p.TelemetrySample, ...], tuple[p.ProcessSample, ...]]],
    gpus: dict[int, dict[str, Gpu]],
) -> None:
    """Telemetry of many heartbeats at once (the liveness flush): (node id, when, GPU samples, process
    samples) each, `gpus` by node id then UUID. The same rows `samples_store` writes: GPU samples in
    multi-row INSERTs, task-process samples only for tasks the node was given."""
    rows = [
        (node_gpus[s.gpu_uuid].pk, at, s.mem_used_mib, s.mem_total_mib, s.util_gpu_pct, s.util_mem_pct,
         s.power_w, s.temperature_c, s.sm_clock_mhz, s.ecc_uncorrected_aggregate)
        for node_id, at, telemetry, _ in batch
        for s in telemetry
        if s.gpu_uuid in (node_gpus := gpus.get(node_id, {}))
    ]  # fmt: skip
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 1_000):  # bounded statements (10 parameters a row)
            chunk = rows[start : start + 1_000]
            sql = _SAMPLES_SQL + ", ".join([_SAMPLE_ROW] * len(chunk))
            cursor.execute(sql, [value for row in chunk for value in row])
    claimed = [(node_id, at, s) for node_id, at, _, processes in batch for s in processes if s.task_id]
    if not claimed:
        return
    wanted = {(node_id, run[0]) for node_id, _, s in claimed if (run := parse_run(s.task_id, s.attempt))}
    mine = set(
        Assignment.objects.filter(
            node_id__in={node_id for node_id, _ in wanted}, task_id__in={task_id for _, task_id in wanted}
        ).values_list("node_id", "task_id")
    )
    samples = []
    for node_id, at, s in claimed:
        run = parse_run(s.task_id, s.attempt)
        gpu = gpus.get(node_id, {}).get(s.gpu_uuid)
        if run is not None and (node_id, run[0]) in mine and gpu is not None:
            samples.append(TaskSample(task_id=run[0], gpu=gpu, at=at, pid=s.pid, used_mib=s.used_mib))
    TaskSample.objects.bulk_create(samples)
