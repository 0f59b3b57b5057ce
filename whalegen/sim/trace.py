"""Loaders for the Alibaba openb trace format (traces/README.md §1) into placement snapshot types."""

from __future__ import annotations

import csv
from pathlib import Path

from whalegen.gpus import UnknownGpuModel, get_model
from whalegen.placement.types import WHOLE_GPU_MILLI, GpuState, NodeState, PartitionMode, TaskRequest

NODE_FILE = "openb_node_list_gpu_node.csv"


def pod_file(workload: str) -> str:
    return f"openb_pod_list_{workload}.csv"


def _canonical(model: str) -> str:
    try:
        return get_model(model).name
    except UnknownGpuModel:
        return model.strip()  # an unknown model still constrains placement by its name


def load_nodes(path: Path) -> tuple[NodeState, ...]:
    """One NodeState per row, fully idle; every GPU shared (the trace's GPU-sharing cluster)."""
    nodes = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            model = _canonical(row["model"])
            try:
                gpu_mem = get_model(model).mem_mib or 0
            except UnknownGpuModel:
                gpu_mem = 0
            count = int(row["gpu"])
            gpus = tuple(
                GpuState(i, model, WHOLE_GPU_MILLI, gpu_mem, gpu_mem, PartitionMode.SHARED)
                for i in range(count)
            )
            cpu = int(row["cpu_milli"])
            mem = int(row["memory_mib"])
            nodes.append(NodeState(row["sn"], cpu, cpu, mem, mem, gpus))
    return tuple(nodes)


def load_tasks(path: Path) -> tuple[TaskRequest, ...]:
    """Tasks of a pod list; `gpu_spec` ("A|B", duplicates allowed) becomes the allowed-model set."""
    tasks = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            num_gpu = int(row["num_gpu"])
            spec = (row.get("gpu_spec") or "").strip()
            allowed = (
                frozenset(_canonical(m) for m in spec.split("|") if m.strip()) if num_gpu else frozenset()
            )
            tasks.append(
                TaskRequest(
                    task_id=row["name"],
                    cpu_milli=int(row["cpu_milli"]),
                    mem_mib=int(row["memory_mib"]),
                    num_gpu=num_gpu,
                    gpu_milli=int(row["gpu_milli"]) if num_gpu else 0,
                    allowed_models=allowed,
                )
            )
    return tuple(tasks)
