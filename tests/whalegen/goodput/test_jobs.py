from __future__ import annotations

import csv
from pathlib import Path

import pytest

from whalegen.goodput.data import GavelData
from whalegen.goodput.jobs import (
    MAX_RUNTIME_S,
    MIN_RUNTIME_S,
    REFERENCE_MODEL,
    ServiceProfile,
    draw_services,
    load_jobs,
    load_service_profiles,
)


@pytest.fixture(scope="module")
def openb_default(traces_dir: Path) -> Path:
    return traces_dir / "openb" / "openb_pod_list_default.csv"


@pytest.fixture(scope="module")
def profiles(traces_dir: Path) -> tuple[ServiceProfile, ...]:
    return load_service_profiles(traces_dir)


def test_every_gpu_task_becomes_a_job_with_its_trace_size_and_qos(
    openb_default: Path, gavel: GavelData
) -> None:
    jobs = load_jobs(openb_default, gavel, seed=7)
    with openb_default.open(newline="") as handle:
        rows = {r["name"]: r for r in csv.DictReader(handle) if int(r["num_gpu"]) > 0}
    assert len(jobs) == len(rows) == 3078 + 3911 + 75  # traces/README.md §1.2: sharing, whole, multi-GPU
    for job in jobs:
        row = rows[job.job_id]
        assert (job.num_gpus, job.gpu_milli, job.cpu_milli, job.mem_mib) == (
            int(row["num_gpu"]),
            int(row["gpu_milli"]),
            int(row["cpu_milli"]),
            int(row["memory_mib"]),
        )
        assert job.job_type.num_gpus == job.num_gpus
        assert job.preemptible == (row["qos"] == "BE")
        lifetime = int(row["deletion_time"]) - int(row["creation_time"])
        assert job.reference_runtime_s == min(MAX_RUNTIME_S, max(MIN_RUNTIME_S, lifetime))
        # A fractional job's work is its runtime at its share of the GPU (issue #41: it cannot use more).
        share = int(row["gpu_milli"]) / 1000 if int(row["gpu_milli"]) < 1000 else 1.0
        assert job.work_iterations == pytest.approx(
            job.reference_runtime_s * gavel.solo[(REFERENCE_MODEL, job.job_type)] * share
        )
        assert job.work_ref_gpu_s == pytest.approx(job.reference_runtime_s * share * job.num_gpus)
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    assert jobs[0].arrival_s == 0
    assert sum(j.shareable for j in jobs) == 3078


def test_jobs_are_deterministic_per_seed(openb_default: Path, gavel: GavelData) -> None:
    first = load_jobs(openb_default, gavel, seed=1)
    assert load_jobs(openb_default, gavel, seed=1) == first
    other = load_jobs(openb_default, gavel, seed=2)
    assert [j.job_type for j in other] != [j.job_type for j in first]
    assert [j.arrival_s for j in other] == [j.arrival_s for j in first]  # only the types are drawn


def test_a_task_list_without_times_is_refused(traces_dir: Path, gavel: GavelData) -> None:
    with pytest.raises(ValueError, match="creation_time"):
        load_jobs(traces_dir / "openb" / "openb_pod_list_multigpu20.csv", gavel, seed=1)


def test_service_profiles_are_the_well_sampled_genai_pods(profiles: tuple[ServiceProfile, ...]) -> None:
    # traces/README.md §3: 128 pods have at least 200 samples; the grid holds 1,441 timestamps.
    assert len(profiles) == 128
    assert [p.pod_id for p in profiles] == sorted(p.pod_id for p in profiles)
    assert all(200 <= len(p.util_pct) <= 1441 for p in profiles)
    assert all(0.0 <= v <= 100.0 for p in profiles for v in p.util_pct)
    assert all(p.mem_bytes for p in profiles)


def test_services_are_drawn_deterministically_per_seed(profiles: tuple[ServiceProfile, ...]) -> None:
    services = draw_services(profiles, 10, seed=3)
    assert services == draw_services(profiles, 10, seed=3)
    assert len({s.profile.pod_id for s in services}) == 10
    assert all(s.sla_min_factor == 0.9 for s in services)
    assert [s.profile for s in draw_services(profiles, 10, seed=4)] != [s.profile for s in services]
    with pytest.raises(ValueError, match="count must be"):
        draw_services(profiles, len(profiles) + 1, seed=3)
