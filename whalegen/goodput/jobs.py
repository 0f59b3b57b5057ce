"""The work a goodput replay offers: training and batch jobs, and online services
(docs/notes/goodput-design.md §5).

Jobs (recipe, deterministic per seed): every GPU task of an openb task list (traces/README.md §1.2)
becomes one job, in creation order:
1. arrival: its `creation_time`, in seconds from the first task;
2. size: its `num_gpu` (1, 2, 4 or 8: the scales Gavel measured) and `gpu_milli` (< 1000: a sharing
   task, which may run on an MPS / time-sliced GPU), CPU and host memory;
3. job type: drawn uniformly (seeded) among the Gavel job types of that GPU count;
4. work: its lifetime (`deletion_time − creation_time`, clipped to [60 s, 7 days]) run at the job type's
   reference speed, its measured V100 throughput, on the share of the GPU it asks for:
   `iterations = runtime_s × T(V100) × gpu_milli / 1000` (a fractional job uses no more than its share;
   whalegen.goodput.truth);
5. preemptible: QoS `BE` (best effort) is preemptible; `LS`, `Burstable` and `Guaranteed` are not.

Services: pods of the genai-2026 trace (traces/README.md §3) with at least 200 utilisation samples, their
GPU utilisation and GPU memory series on the trace's 57 s grid, drawn without replacement (seeded). Their
values are scaled upstream: use them for shape and relative level only.
"""

from __future__ import annotations

import csv
import io
import random
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from whalegen.goodput.data import GavelData, JobType, TraceFileMissing

REFERENCE_MODEL = "V100M16"
MIN_RUNTIME_S = 60
MAX_RUNTIME_S = 7 * 24 * 3600
PREEMPTIBLE_QOS = frozenset({"BE"})
GENAI_STEP_S = 57
GENAI_UTIL_FILE = Path("genai-2026") / "pod_gpu_duty_cycle_anon.tar.gz"
GENAI_MEMORY_FILE = Path("genai-2026") / "pod_gpu_memory_used_bytes_anon.tar.gz"
MIN_SERVICE_SAMPLES = 200
# An online service tolerates running at 90 % of its speed alone (issue #14's example SLA).
DEFAULT_SLA_MIN_FACTOR = 0.9


@dataclass(frozen=True)
class Job:
    job_id: str
    arrival_s: int
    job_type: JobType
    num_gpus: int
    gpu_milli: int  # per GPU; < 1000 only for a one-GPU sharing job
    cpu_milli: int
    mem_mib: int
    preemptible: bool
    work_iterations: float  # at the job type's own throughput unit
    reference_runtime_s: float  # how long the work takes alone on the reference model

    @property
    def shareable(self) -> bool:
        return self.gpu_milli < 1000

    @property
    def work_ref_gpu_s(self) -> float:
        """The job's work in reference (V100) GPU-seconds: its reference runtime × the share of each GPU it
        uses × its GPUs."""
        share = self.gpu_milli / 1000 if self.shareable else 1.0
        return self.reference_runtime_s * share * self.num_gpus


def load_jobs(path: Path, gavel: GavelData, seed: int) -> tuple[Job, ...]:
    """The module docstring's recipe over an openb pod list with time columns (default or gpuspec10)."""
    if not path.is_file():
        raise TraceFileMissing(path)
    rng = random.Random(seed)
    by_scale: dict[int, list[JobType]] = {}
    for job_type in gavel.job_types:
        if (REFERENCE_MODEL, job_type) in gavel.solo:
            by_scale.setdefault(job_type.num_gpus, []).append(job_type)
    with path.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["num_gpu"]) > 0]
    if rows and "creation_time" not in rows[0]:
        raise ValueError(f"{path}: needs creation_time and deletion_time (multigpu20 has none)")
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    start = int(rows[0]["creation_time"]) if rows else 0
    jobs = []
    for row in rows:
        num_gpus = int(row["num_gpu"])
        candidates = by_scale.get(num_gpus)
        if not candidates:
            raise ValueError(f"{path}: {row['name']}: Gavel measured no job type on {num_gpus} GPUs")
        job_type = rng.choice(candidates)
        lifetime_s = int(row["deletion_time"]) - int(row["creation_time"])
        runtime_s = float(min(MAX_RUNTIME_S, max(MIN_RUNTIME_S, lifetime_s)))
        gpu_milli = int(row["gpu_milli"])
        share = gpu_milli / 1000 if gpu_milli < 1000 else 1.0
        jobs.append(
            Job(
                job_id=row["name"],
                arrival_s=int(row["creation_time"]) - start,
                job_type=job_type,
                num_gpus=num_gpus,
                gpu_milli=gpu_milli,
                cpu_milli=int(row["cpu_milli"]),
                mem_mib=int(row["memory_mib"]),
                preemptible=row["qos"] in PREEMPTIBLE_QOS,
                work_iterations=runtime_s * gavel.solo[(REFERENCE_MODEL, job_type)] * share,
                reference_runtime_s=runtime_s,
            )
        )
    return tuple(jobs)


@dataclass(frozen=True)
class ServiceProfile:
    """One genai-2026 pod: GPU utilisation (%) and GPU memory (bytes, scaled) per 57 s step."""

    pod_id: str
    util_pct: tuple[float, ...]
    mem_bytes: tuple[float, ...]  # empty where the memory file has no sample for the pod

    @property
    def mean_util_pct(self) -> float:
        return sum(self.util_pct) / len(self.util_pct)


@dataclass(frozen=True)
class Service:
    service_id: str
    profile: ServiceProfile
    sla_min_factor: float  # the lowest throughput factor (shared over alone) it tolerates


def _series(path: Path) -> dict[str, list[tuple[int, float]]]:
    if not path.is_file():
        raise TraceFileMissing(path)
    series: dict[str, list[tuple[int, float]]] = {}
    with tarfile.open(path, "r:gz") as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".csv"))
        raw = archive.extractfile(member)
        if raw is None:
            raise ValueError(f"{path}: {member.name} is not a file")
        for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
            pod = row["container_ip"]
            if pod:  # columns by name: the files order them differently
                series.setdefault(pod, []).append((int(float(row["timestamp_anon"])), float(row["value"])))
    return series


def load_service_profiles(
    traces_dir: Path, min_samples: int = MIN_SERVICE_SAMPLES
) -> tuple[ServiceProfile, ...]:
    """Pods with at least `min_samples` utilisation samples, series in time order, sorted by pod id."""
    util = _series(traces_dir / GENAI_UTIL_FILE)
    memory = _series(traces_dir / GENAI_MEMORY_FILE)
    profiles = []
    for pod, samples in sorted(util.items()):
        if len(samples) < min_samples:
            continue
        profiles.append(
            ServiceProfile(
                pod_id=pod,
                util_pct=tuple(v for _, v in sorted(samples)),
                mem_bytes=tuple(v for _, v in sorted(memory.get(pod, []))),
            )
        )
    return tuple(profiles)


def draw_services(
    profiles: Sequence[ServiceProfile], count: int, seed: int, sla_min_factor: float = DEFAULT_SLA_MIN_FACTOR
) -> tuple[Service, ...]:
    if not 0 <= count <= len(profiles):
        raise ValueError(f"count must be 0 … {len(profiles)} (the profiles available), got {count}")
    chosen = random.Random(seed).sample(list(profiles), count)
    return tuple(Service(f"svc-{i:03d}", p, sla_min_factor) for i, p in enumerate(chosen))
