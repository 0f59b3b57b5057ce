"""The MIG enforcer over the real NvmlBackend on the simulator: idempotent, careful with busy work."""

from __future__ import annotations

import pytest

from agents.backend import NvmlBackend
from agents.enforce.mig import reconcile_mig
from agents.sim.backend import simulated_backend
from agents.sim.core import SimSystem
from agents.sim.spec import build_system
from whalegen.protocol import GpuLayout, MigInstanceSpec, PartitionMode, PartitionState


def setup(sku: str, mig: str = "enabled", **gpu: object) -> tuple[SimSystem, NvmlBackend, str]:
    system = build_system({"nodes": [{"name": "t", "gpus": [{"sku": sku, "mig": mig, **gpu}]}]})
    backend = simulated_backend(system)
    backend.open()
    return system, backend, backend.uuid(0)


def mig(uuid: str, *profiles: str | tuple[str, int]) -> GpuLayout:
    specs = [MigInstanceSpec(p) if isinstance(p, str) else MigInstanceSpec(p[0], p[1]) for p in profiles]
    return GpuLayout(uuid, PartitionMode.MIG, tuple(specs))


def apply(backend: NvmlBackend, layout: GpuLayout, allow: bool = False):  # type: ignore[no-untyped-def]
    return reconcile_mig(backend, 0, layout, generation=1, allow_mode_change=allow, now_s=0.0)


def layout_of(report) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return [(i.profile, i.start) for i in report.instances]


@pytest.mark.parametrize("sku", ["h100-80gb-sxm", "h200-141gb", "a100-40gb"])
def test_a_second_pass_over_an_unchanged_gpu_makes_no_mutating_call(sku: str) -> None:
    system, backend, uuid = setup(sku)
    names = [p.name for p in system.gpus[0].sku.gi_profiles]
    one, two, three = (next(n for n in names if n.startswith(k)) for k in ("1g.", "2g.", "3g."))
    layout = mig(uuid, three, two, one, one)
    first = apply(backend, layout)
    assert first.state is PartitionState.OK and len(first.actions) == 8
    assert layout_of(first) == [(one, 0), (one, 1), (two, 2), (three, 4)]
    mark = system.log.mark()
    second = apply(backend, layout)
    assert second.state is PartitionState.OK and second.actions == ()
    assert system.log.mutating_since(mark) == []
    assert layout_of(second) == layout_of(first)


def test_matching_instances_are_kept_and_only_the_difference_is_changed() -> None:
    system, backend, uuid = setup("h100-80gb-sxm")
    apply(backend, mig(uuid, "3g.40gb", "3g.40gb"))
    before = {i.start: i.mig_uuid for i in backend.instances(0)}
    mark = system.log.mark()
    report = apply(backend, mig(uuid, ("3g.40gb", 4), "2g.20gb", "1g.10gb"))
    assert report.state is PartitionState.OK
    assert layout_of(report) == [("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert next(i.mig_uuid for i in report.instances if i.start == 4) == before[4]  # untouched
    made = [r.function for r in system.log.mutating_since(mark)]
    assert (
        made.count("nvmlGpuInstanceDestroy") == 1
        and made.count("nvmlDeviceCreateGpuInstanceWithPlacement") == 2
    )


def test_busy_instances_are_never_destroyed_and_block_what_needs_their_slices() -> None:
    system, backend, uuid = setup("h200-141gb")
    apply(backend, mig(uuid, ("3g.71gb", 0), ("3g.71gb", 4)))
    busy = next(i for i in backend.instances(0) if i.start == 4)
    system.add_process(501, 0, used_mib=1000, gi_id=busy.gi_id, ci_id=busy.ci_id)
    mark = system.log.mark()
    drain = apply(backend, mig(uuid, "7g.141gb"))
    assert drain.state is PartitionState.NEEDS_DRAIN and "pids [501]" in drain.reason
    assert system.log.mutating_since(mark) == []  # refused as a whole: nothing half-done
    kept = apply(backend, mig(uuid, "4g.71gb"))  # fits beside the busy 3g once the idle one goes
    assert kept.state is PartitionState.BLOCKED and "3g.71gb@4 (pids [501])" in kept.reason
    assert layout_of(kept) == [("4g.71gb", 0), ("3g.71gb", 4)]
    destroyed = [r for r in system.log.mutating_since(mark) if r.function == "nvmlGpuInstanceDestroy"]
    assert [r.code for r in destroyed] == [0]  # only the idle one, and never an IN_USE attempt
    system.remove_process(501)
    done = apply(backend, mig(uuid, "4g.71gb"))
    assert done.state is PartitionState.OK and layout_of(done) == [("4g.71gb", 0)]


def test_an_unknown_profile_is_infeasible_with_not_supported() -> None:
    _, backend, uuid = setup("a100-40gb")
    report = apply(backend, mig(uuid, "3g.71gb"))
    assert report.state is PartitionState.INFEASIBLE and report.errors[0].name == "NOT_SUPPORTED"


def test_an_nvml_refusal_during_creation_is_reported_as_nvmls_error() -> None:
    system, backend, uuid = setup("h100-80gb-sxm")
    system.faults.add("nvmlDeviceCreateGpuInstanceWithPlacement", code=None, times=1)  # latency only
    from agents.sim.core import Nvml

    system.faults.add("nvmlDeviceCreateGpuInstanceWithPlacement", Nvml.INSUFFICIENT_RESOURCES, times=1)
    report = apply(backend, mig(uuid, "2g.20gb", "2g.20gb"))
    assert report.state is PartitionState.ERROR
    assert [(e.op, e.code) for e in report.errors] == [("nvmlDeviceCreateGpuInstanceWithPlacement", 23)]
    assert apply(backend, mig(uuid, "2g.20gb", "2g.20gb")).state is PartitionState.OK  # next pass heals


def test_mig_mode_is_left_alone_unless_the_node_allows_changes() -> None:
    system, backend, uuid = setup("h100-80gb-sxm", mig="disabled")
    refused = apply(backend, mig(uuid, "7g.80gb"))
    assert refused.state is PartitionState.MODE_CHANGE_NOT_ALLOWED and refused.actions == ()
    assert [r for r in system.log.entries if r.mutating] == []
    allowed = apply(backend, mig(uuid, "7g.80gb"), allow=True)
    assert allowed.state is PartitionState.OK and layout_of(allowed) == [("7g.80gb", 0)]


def test_hopper_mode_is_reasserted_after_a_driver_reload_when_allowed() -> None:
    system, backend, uuid = setup("h200-141gb")
    layout = mig(uuid, "3g.71gb", "3g.71gb")
    apply(backend, layout)
    system.reload_driver()
    assert apply(backend, layout).state is PartitionState.MODE_CHANGE_NOT_ALLOWED
    again = apply(backend, layout, allow=True)
    assert again.state is PartitionState.OK and layout_of(again) == [("3g.71gb", 0), ("3g.71gb", 4)]


def test_a_busy_gpu_blocks_a_mode_change_and_nothing_is_killed() -> None:
    system, backend, uuid = setup("h100-80gb-sxm", mig="disabled")
    system.add_process(77, 0, used_mib=10)
    report = apply(backend, mig(uuid, "7g.80gb"), allow=True)
    assert report.state is PartitionState.BLOCKED and "[77]" in report.reason
    assert 77 in system.processes and [r for r in system.log.entries if r.mutating] == []


def test_passthrough_ampere_reports_reboot_required() -> None:
    _, backend, uuid = setup("a100-80gb", mig="disabled", reset_supported=False)
    report = apply(backend, mig(uuid, "7g.80gb"), allow=True)
    assert report.state is PartitionState.REBOOT_REQUIRED
    assert [e.name for e in report.errors] == ["RESET_REQUIRED"]


def test_whole_gpu_layout_on_a_mig_gpu_disables_mig_after_clearing_it() -> None:
    system, backend, uuid = setup("h100-80gb-sxm")
    apply(backend, mig(uuid, "4g.40gb", "3g.40gb"))
    report = apply(backend, GpuLayout(uuid, PartitionMode.WHOLE), allow=True)
    assert report.state is PartitionState.OK
    assert (system.gpus[0].mig_current, system.gpus[0].gis) == (0, {})


COMPLETE_LAYOUTS = [
    "7g",
    "4g+3g",
    "4g+2g+1g",
    "4g+2g+1g'",
    "4g+3*1g",
    "4g+2*1g+1g'",
    "3g+2*2g",
    "3g+2g+2*1g",
    "3g+4*1g",
    "3*2g+1g",
    "3*2g+1g'",
    "2*2g+3*1g",
    "2*2g+2*1g+1g'",
    "2g+5*1g",
    "2g+4*1g+1g'",
    "7*1g",
    "6*1g+1g'",
]  # reference §4.5; 1g' is the double-memory 1g


@pytest.mark.parametrize("sku", ["a100-80gb", "h100-80gb-sxm", "h200-141gb"])
@pytest.mark.parametrize("layout", COMPLETE_LAYOUTS)
def test_every_complete_layout_is_created_on_the_simulated_gpu(sku: str, layout: str) -> None:
    system, backend, uuid = setup(sku)
    by_kind: dict[str, str] = {}
    for profile in system.gpus[0].sku.gi_profiles:
        kind = profile.name.split(".")[0]
        if profile.profile_id == 15:
            kind = "1g'"
        elif profile.profile_id == 20:
            continue
        by_kind[kind] = profile.name
    names = []
    for part in layout.split("+"):
        count, _, kind = part.rpartition("*")
        names += [by_kind[kind]] * int(count or 1)
    report = apply(backend, mig(uuid, *names))
    assert report.state is PartitionState.OK, report.reason
    assert sorted(i.profile for i in report.instances) == sorted(names)
    assert all(i.mig_uuid for i in report.instances)
    assert (
        sum(next(p.compute_slices for p in system.gpus[0].sku.gi_profiles if p.name == n) for n in names) == 7
    )
    for profile in system.gpus[0].sku.gi_profiles:  # full: nothing else fits
        if profile.profile_id != 20:
            assert backend.remaining_capacity(0, profile.profile_id) == 0
