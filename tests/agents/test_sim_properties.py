"""Property tests of the simulated NVML, driven through the real pynvml wrappers and NvmlBackend."""

from __future__ import annotations

from itertools import combinations, count

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.backend import BackendError
from agents.sim.backend import simulated_backend
from agents.sim.spec import build_system
from whalegen.gpus import mig_profiles
from whalegen.protocol import MigInstance

SKUS = {"a100-40gb": "A100-40GB", "h100-80gb-sxm": "H100-80GB", "h200-141gb": "H200-141GB"}


def recount(model: str, instances: list[MigInstance], profile_id: int) -> int:
    """Brute force: the most further instances of the profile that fit, trying every start subset."""
    profile = next(p for p in mig_profiles(model) if p.profile_id == profile_id)
    used = 0
    for inst in instances:
        used |= ((1 << inst.size) - 1) << inst.start
    room = profile.max_instances - sum(1 for i in instances if i.profile_id == profile_id)
    for k in range(min(room, len(profile.starts)), 0, -1):
        for starts in combinations(profile.starts, k):
            masks = [profile.slice_mask(s) for s in starts]
            combined = 0
            for mask in masks:
                combined |= mask
            if not combined & used and bin(combined).count("1") == k * profile.memory_slices:
                return k
    return 0


operation = st.tuples(
    st.sampled_from(["create", "destroy", "busy", "idle"]), st.integers(0, 6), st.integers(0, 7)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sku=st.sampled_from(sorted(SKUS)), ops=st.lists(operation, max_size=20))
@example(  # the pid reuse above: the second instance's process was replaced, its destroy went through
    sku="a100-40gb",
    ops=[
        ("create", 0, 0),
        ("create", 0, 1),
        ("busy", 0, 0),
        ("busy", 1, 0),
        ("idle", 0, 0),
        ("busy", 0, 0),
        ("destroy", 1, 0),
    ],
)
def test_random_create_destroy_keeps_nvmls_invariants(sku: str, ops: list[tuple[str, int, int]]) -> None:
    system = build_system({"nodes": [{"name": "p", "gpus": [{"sku": sku, "mig": "enabled"}]}]})
    backend = simulated_backend(system)
    backend.open()
    profiles = mig_profiles(SKUS[sku])
    busy: dict[int, int] = {}  # GI ID → pid
    # Fresh pids, as an OS gives: the simulated host keys processes by pid, so a reused one replaced the
    # process of another instance, which the test still counted busy (hypothesis found it: busy, busy,
    # idle, busy made two instances' processes one).
    pids = count(10_000)
    for kind, pick, start_pick in ops:
        instances = backend.instances(0)
        if kind == "create":
            profile = profiles[pick % len(profiles)]
            start = profile.starts[start_pick % len(profile.starts)]
            expected_ok = (
                start in profile.starts
                and recount(SKUS[sku], instances, profile.profile_id) > 0
                and not any((((1 << i.size) - 1) << i.start) & profile.slice_mask(start) for i in instances)
            )
            try:
                backend.create_default_ci(
                    0, backend.create_gi(0, profile.profile_id, start, profile.memory_slices)
                )
                assert expected_ok
            except BackendError as error:
                assert not expected_ok and error.failure.name == "INSUFFICIENT_RESOURCES"
        elif instances:
            target = instances[pick % len(instances)]
            if kind == "busy" and target.gi_id not in busy:
                busy[target.gi_id] = next(pids)
                system.add_process(busy[target.gi_id], 0, used_mib=1, gi_id=target.gi_id, ci_id=target.ci_id)
            elif kind == "idle" and target.gi_id in busy:
                system.remove_process(busy.pop(target.gi_id))
            elif kind == "destroy":
                assert target.ci_id is not None
                if target.gi_id in busy:
                    with pytest.raises(BackendError) as refused:
                        backend.destroy_ci(0, target.gi_id, target.ci_id)
                    assert refused.value.failure.name == "IN_USE"
                else:
                    backend.destroy_ci(0, target.gi_id, target.ci_id)
                    backend.destroy_gi(0, target.gi_id)
        # Invariants after every step, read back through NVML.
        after = backend.instances(0)
        occupied = 0
        for inst in after:
            mask = ((1 << inst.size) - 1) << inst.start
            assert not occupied & mask, "two GPU instances share a memory slice"
            occupied |= mask
        assert {gi for gi in busy} <= {i.gi_id for i in after}, "a busy instance disappeared"
        for profile in profiles:
            assert backend.remaining_capacity(0, profile.profile_id) == recount(
                SKUS[sku], after, profile.profile_id
            )
