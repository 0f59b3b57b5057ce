"""No policy can read the truth: the replay hands the decision its requests and the telemetry, nothing else.

Two properties over seeds, policies and GPU modes (hypothesis): (1) nothing of the truth (World, TrueSpeed,
MeasuredPairs, the Job with its work, the Service with its future utilisation) is reachable from the
policy's side after a run, while it is reachable from the replay (the walk finds it where it is); (2) every
profile a decision is handed is the telemetry's own profile of that workload at that moment.
"""

from __future__ import annotations

import gc
import math
import types
import weakref
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import whalegen.goodput.replay as replay_module
from tests.whalegen.goodput.test_replay import RULE, V100, _gavel, measured_pairs
from whalegen.goodput.data import JobType
from whalegen.goodput.fleet import parse_fleet
from whalegen.goodput.jobs import Job, Service, ServiceProfile
from whalegen.goodput.replay import ReplayConfig, World, run_goodput, workload_name
from whalegen.goodput.telemetry import SPEED_NOISE, Telemetry
from whalegen.goodput.truth import MeasuredPairs, TrueSpeed
from whalegen.scheduling import Decider

TRUTH = (World, TrueSpeed, MeasuredPairs, Job, Service, ServiceProfile)
A = JobType("ResNet-18 (batch size 32)", 1)
B = JobType("LM (batch size 5)", 1)
POLICIES = ("k8s-default", "volcano-binpack", "share-binpack", "fgd", "whalegen", "whalegen-aware")


def _reachable(root: object) -> Iterator[object]:
    """Every object reachable from `root` through data: containers, instances' fields, bound methods'
    selves, closures' cells and weak references; not through modules, classes or functions' globals
    (which reach everything loaded)."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, types.FunctionType):
            stack.extend(cell.cell_contents for cell in obj.__closure__ or ())
        elif isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
        elif isinstance(obj, weakref.ref):
            stack.append(obj())
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif not isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType, types.CodeType)):
            stack.extend(r for r in gc.get_referents(obj) if not isinstance(r, type))


def _fleet(mode: str) -> object:
    group: list[dict[str, object]] = [{"mode": mode, "count": 2}] if mode != "whole" else []
    if mode == "mps":
        group[0]["max_shares"] = 3
    if mode == "mig":
        group[0]["layout"] = ["3g.40gb", "2g.20gb", "2g.20gb"]
    return parse_fleet(
        {
            "name": "tiny",
            "pools": [
                {"name": "a", "gpu_model": "A100-80GB", "nodes": 1, "gpus_per_node": 3, "cpu_cores": 64,
                 "mem_gib": 512, "gpus": group},
                {"name": "v", "gpu_model": V100, "nodes": 1, "gpus_per_node": 2, "cpu_cores": 32,
                 "mem_gib": 256},
            ],
        }
    )  # fmt: skip


def _jobs() -> list[Job]:
    gavel = _gavel()
    jobs = []
    for i in range(16):
        job_type = (A, B)[i % 2]
        milli = (250, 1000, 400, 600)[i % 4]
        runtime_s = 900.0 + 400 * i
        work = runtime_s * gavel.solo[(V100, job_type)] * min(1.0, milli / 1000)
        jobs.append(Job(f"j{i:02d}", 120 * i, job_type, 1, milli, 1000, 1024, i % 3 == 0, work, runtime_s))
    return jobs


SERVICES = [Service("svc-000", ServiceProfile("pod", (20.0, 70.0, 35.0), ()), 0.9)]


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(_gavel(), RULE, [V100, "A100-80GB"], measured_pairs(), seed=3)


def _captured_run(world: World, policy: str, seed: int, mode: str) -> replay_module._GoodputReplay:
    """A real run; the loop is the real `run_steps`, wrapped only to keep the replay it drives."""
    kept: list[replay_module._GoodputReplay] = []
    real = replay_module.run_steps

    def keep(arrivals: Any, replay: Any, *args: Any) -> float:
        kept.append(replay)
        return real(arrivals, replay, *args)

    with mock.patch.object(replay_module, "run_steps", keep):
        run_goodput(_fleet(mode), _jobs(), SERVICES, world, policy, seed, ReplayConfig(load=1.2))  # type: ignore[arg-type]
    return kept[0]


@settings(max_examples=12, deadline=None)
@given(
    policy=st.sampled_from(POLICIES), seed=st.integers(0, 1000), mode=st.sampled_from(("mps", "mig", "whole"))
)
def test_nothing_of_the_truth_is_reachable_from_the_policys_side(policy: str, seed: int, mode: str) -> None:
    world = World.build(_gavel(), RULE, [V100, "A100-80GB"], measured_pairs(), seed=seed)
    replay = _captured_run(world, policy, seed, mode)
    leaked = [type(o).__name__ for o in _reachable(replay.side) if isinstance(o, TRUTH)]
    assert leaked == []
    # The walk is not blind: from the replay itself, the truth is reachable.
    assert any(isinstance(o, World) for o in _reachable(replay))
    assert isinstance(replay.side.telemetry, Telemetry) and isinstance(replay.side.decider, Decider)


@settings(max_examples=8, deadline=None)
@given(policy=st.sampled_from(("whalegen-aware", "fgd")), seed=st.integers(0, 1000))
def test_every_profile_a_decision_reads_is_the_telemetrys(world: World, policy: str, seed: int) -> None:
    jobs = {j.job_id: j for j in _jobs()}
    handed: list[tuple[object, object]] = []
    real_step = Decider.step

    def step(self: Decider, pending: Any, *args: Any, **kwargs: Any) -> Any:
        telemetry = current[0].side.telemetry
        for request in pending:
            job = jobs.get(request.task_id)
            if job is not None:
                handed.append((request.profile, telemetry.job_profile(workload_name(job))))
        return real_step(self, pending, *args, **kwargs)

    current: list[replay_module._GoodputReplay] = []
    real_run = replay_module.run_steps

    def keep(arrivals: Any, replay: Any, *args: Any) -> float:
        current.append(replay)
        return real_run(arrivals, replay, *args)

    with mock.patch.object(replay_module, "run_steps", keep), mock.patch.object(Decider, "step", step):
        run_goodput(_fleet("mps"), list(jobs.values()), SERVICES, world, policy, seed, ReplayConfig(load=1.2))  # type: ignore[arg-type]
    assert handed and all(given_ == learned for given_, learned in handed)


def test_telemetry_samples_carry_noise_around_what_ran() -> None:
    telemetry = Telemetry(seed=5)
    for _ in range(400):
        telemetry.job_sample("w", V100, 10.0, 50.0)
    samples = telemetry.book.speeds["w"][V100]
    assert len(set(samples)) == 400 and all(s > 0 for s in samples)
    logs = sorted(abs(math.log(s / 10.0)) for s in samples)
    assert logs[len(logs) // 2] == pytest.approx(0.674 * SPEED_NOISE, rel=0.25)  # median |z| σ
    telemetry.job_sample("w", "K80", 0.0, 50.0)  # a job that cannot run there reports nothing
    assert "K80" not in telemetry.book.speeds["w"]
