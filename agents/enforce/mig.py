"""MIG enforcer: bring one GPU's instances to the wanted layout without disturbing work (reference §5.4).

Unlike mig-parted (clear everything, recreate with automatic placement), it keeps every matching
instance, never destroys an instance that has processes, plans explicit starts for the missing ones
by backtracking over the starts NVML reports, and makes no mutating call when nothing differs.
MIG mode is changed only when both the node's configuration and the desired state allow it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.backend import (
    GPU_IS_LOST,
    IN_USE,
    NOT_SUPPORTED,
    RESET_REQUIRED,
    SUCCESS,
    BackendError,
    GpuBackend,
)
from whalegen.gpus.mig import MigProfile
from whalegen.gpus.mig_plan import Placement, Wanted, plan_placements
from whalegen.protocol import (
    GpuLayout,
    MigInstance,
    NvmlFailure,
    PartitionMode,
    PartitionReport,
    PartitionState,
)

INSUFFICIENT_RESOURCES = 23  # the code NVML gives a create that does not fit


@dataclass
class _Outcome:
    actions: list[str] = field(default_factory=list)
    errors: list[NvmlFailure] = field(default_factory=list)


def _profile_table(backend: GpuBackend, gpu: int) -> dict[str, MigProfile]:
    """The GI profiles as NVML itself describes them: names, counts and placements from the driver."""
    table = {}
    for info in backend.gi_profiles(gpu):
        placements = backend.placements(gpu, info.profile_id)
        sizes = {size for _, size in placements}
        table[info.name] = MigProfile(
            profile_id=info.profile_id,
            index=info.index,
            name=info.name,
            compute_slices=info.compute_slices,
            memory_slices=sizes.pop() if len(sizes) == 1 else max(sizes, default=0),
            max_instances=info.max_instances,
            starts=tuple(start for start, _ in placements),
            mem_mib=info.mem_mib,
            sm_count=info.sm_count,
            provenance="nvml",
        )
    return table


def _report(
    layout: GpuLayout,
    state: PartitionState,
    generation: int,
    now_s: float,
    outcome: _Outcome,
    instances: list[MigInstance] | tuple[MigInstance, ...] = (),
    reason: str = "",
) -> PartitionReport:
    return PartitionReport(
        gpu_uuid=layout.gpu_uuid,
        state=state,
        at_s=now_s,
        generation=generation,
        instances=tuple(instances),
        actions=tuple(outcome.actions),
        errors=tuple(outcome.errors),
        reason=reason,
    )


def reconcile_mig(
    backend: GpuBackend,
    gpu: int,
    layout: GpuLayout,
    *,
    generation: int,
    allow_mode_change: bool,
    now_s: float,
) -> PartitionReport:
    """One pass for one GPU. Never raises for NVML errors: they come back as typed failures."""
    outcome = _Outcome()
    try:
        return _reconcile(backend, gpu, layout, generation, allow_mode_change, now_s, outcome)
    except BackendError as error:
        outcome.errors.append(error.failure)
        state = PartitionState.GPU_LOST if error.code == GPU_IS_LOST else PartitionState.ERROR
        return _report(layout, state, generation, now_s, outcome, reason=str(error))


def _reconcile(
    backend: GpuBackend,
    gpu: int,
    layout: GpuLayout,
    generation: int,
    allow_mode_change: bool,
    now_s: float,
    outcome: _Outcome,
) -> PartitionReport:
    want_mig = layout.mode is PartitionMode.MIG
    # 1. Mode.
    mig = backend.mig_state(gpu)
    if mig is None:
        if want_mig:
            outcome.errors.append(
                NvmlFailure("nvmlDeviceGetMigMode", NOT_SUPPORTED, "NOT_SUPPORTED", layout.gpu_uuid)
            )
            return _report(
                layout, PartitionState.INFEASIBLE, generation, now_s, outcome, reason="GPU has no MIG"
            )
        return _report(layout, PartitionState.OK, generation, now_s, outcome)
    if mig.current != want_mig:
        blocked = _change_mode(backend, gpu, layout, want_mig, allow_mode_change, generation, now_s, outcome)
        if blocked is not None:
            return blocked
    if not want_mig:
        return _report(layout, PartitionState.OK, generation, now_s, outcome)

    # 2. Geometry: what is there, what is wanted, what matches.
    table = _profile_table(backend, gpu)
    unknown = [spec.profile for spec in layout.instances if spec.profile not in table]
    if unknown:
        outcome.errors.append(
            NvmlFailure(
                "nvmlDeviceGetGpuInstanceProfileInfo", NOT_SUPPORTED, "NOT_SUPPORTED", layout.gpu_uuid
            )
        )
        reason = f"profiles {unknown} not offered here (known: {sorted(table)})"
        return _report(layout, PartitionState.INFEASIBLE, generation, now_s, outcome, reason=reason)
    actual = backend.instances(gpu)
    wanted = [Wanted(table[spec.profile].profile_id, spec.start) for spec in layout.instances]
    matched, missing = _match(actual, wanted)
    unmatched = [inst for inst in actual if inst.gi_id not in {m.gi_id for m in matched.values()}]
    busy_unmatched = [inst for inst in unmatched if inst.busy_pids]
    profiles = list(table.values())

    # 3. Plan: keep every match if possible, else keep only busy instances and move idle ones.
    keep = list(matched.values())
    plan = plan_placements(
        profiles, [_placed(i) for i in keep + busy_unmatched], [wanted[i] for i in missing]
    )
    if plan is None:
        busy_matched = {i: inst for i, inst in matched.items() if inst.busy_pids}
        rest = [i for i in range(len(wanted)) if i not in busy_matched]
        fixed = [_placed(i) for i in list(busy_matched.values()) + busy_unmatched]
        plan = plan_placements(profiles, fixed, [wanted[i] for i in rest])
        if plan is not None:
            keep, missing = list(busy_matched.values()), rest
    if plan is None:
        return _refuse(layout, profiles, wanted, actual, generation, now_s, outcome)

    # 4. Act: destroy idle instances that are not kept (CIs first), then create the missing ones.
    kept_ids = {inst.gi_id for inst in keep}
    for inst in actual:
        if inst.gi_id in kept_ids or inst.busy_pids:
            continue
        if inst.ci_id is not None:
            backend.destroy_ci(gpu, inst.gi_id, inst.ci_id)
            outcome.actions.append(f"destroy_ci gi {inst.gi_id} ci {inst.ci_id}")
        backend.destroy_gi(gpu, inst.gi_id)
        outcome.actions.append(f"destroy_gi {inst.profile}@{inst.start} gi {inst.gi_id}")
    for inst in keep:
        if inst.ci_id is None:  # a GI left without its compute instance is not usable by CUDA
            ci_id = backend.create_default_ci(gpu, inst.gi_id)
            outcome.actions.append(f"create_ci gi {inst.gi_id} → ci {ci_id}")
    by_id = {p.profile_id: p for p in profiles}
    for placement in plan:
        profile = by_id[placement.profile_id]
        try:
            gi_id = backend.create_gi(gpu, profile.profile_id, placement.start, profile.memory_slices)
            outcome.actions.append(f"create_gi {profile.name}@{placement.start} → gi {gi_id}")
            ci_id = backend.create_default_ci(gpu, gi_id)
            outcome.actions.append(f"create_ci gi {gi_id} → ci {ci_id}")
        except BackendError as error:
            outcome.errors.append(error.failure)
            reason = f"creating {profile.name}@{placement.start} failed: {error.failure.name}"
            return _report(
                layout, PartitionState.ERROR, generation, now_s, outcome, backend.instances(gpu), reason
            )
    final = backend.instances(gpu) if outcome.actions else actual
    # Busy instances outside the layout stay until their work ends; say so rather than call it done.
    if busy_unmatched:
        reason = "busy instances outside the layout kept until their processes end: " + ", ".join(
            f"{i.profile}@{i.start} (pids {list(i.busy_pids)})" for i in busy_unmatched
        )
        return _report(layout, PartitionState.BLOCKED, generation, now_s, outcome, final, reason)
    return _report(layout, PartitionState.OK, generation, now_s, outcome, final)


def _placed(inst: MigInstance) -> Placement:
    return Placement(inst.profile_id, inst.start)


def _match(actual: list[MigInstance], wanted: list[Wanted]) -> tuple[dict[int, MigInstance], list[int]]:
    """Pair wanted entries with existing instances: pinned ones by (profile, start) first, then the
    free ones by profile, busy instances before idle ones so running work is kept."""
    free = sorted(actual, key=lambda inst: (not inst.busy_pids, inst.start))
    matched: dict[int, MigInstance] = {}
    for pinned_pass in (True, False):
        for i, want in enumerate(wanted):
            if i in matched or (want.start is not None) != pinned_pass:
                continue
            for inst in free:
                if inst.profile_id == want.profile_id and (want.start is None or inst.start == want.start):
                    matched[i] = inst
                    free.remove(inst)
                    break
    return matched, [i for i in range(len(wanted)) if i not in matched]


def _refuse(
    layout: GpuLayout,
    profiles: list[MigProfile],
    wanted: list[Wanted],
    actual: list[MigInstance],
    generation: int,
    now_s: float,
    outcome: _Outcome,
) -> PartitionReport:
    """No plan around the busy instances: tell a drain from an impossible layout. Nothing changes."""
    if plan_placements(profiles, [], wanted) is not None:
        busy = [f"{i.profile}@{i.start} (pids {list(i.busy_pids)})" for i in actual if i.busy_pids]
        reason = "layout needs busy instances moved: " + ", ".join(busy)
        return _report(layout, PartitionState.NEEDS_DRAIN, generation, now_s, outcome, actual, reason)
    names = {p.profile_id: p.name for p in profiles}
    asked = " + ".join(
        f"{names[w.profile_id]}{'' if w.start is None else '@' + str(w.start)}" for w in wanted
    )
    # The refusal carries the code NVML returns for a create that does not fit, so the plane sees
    # the same error whether the agent or the driver said no.
    outcome.errors.append(
        NvmlFailure(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            INSUFFICIENT_RESOURCES,
            "INSUFFICIENT_RESOURCES",
            layout.gpu_uuid,
            f"{asked} does not fit the memory-slice geometry",
        )
    )
    reason = f"{asked} cannot be placed on this GPU"
    return _report(layout, PartitionState.INFEASIBLE, generation, now_s, outcome, actual, reason)


def _change_mode(
    backend: GpuBackend,
    gpu: int,
    layout: GpuLayout,
    want_mig: bool,
    allow_mode_change: bool,
    generation: int,
    now_s: float,
    outcome: _Outcome,
) -> PartitionReport | None:
    """Switch MIG mode if allowed and idle; None when the mode now matches, else the report to send."""
    word = "enable" if want_mig else "disable"
    if not allow_mode_change:
        reason = f"MIG must be {word}d but this node does not allow MIG mode changes"
        return _report(
            layout, PartitionState.MODE_CHANGE_NOT_ALLOWED, generation, now_s, outcome, reason=reason
        )
    procs = backend.processes(gpu)
    if procs:
        reason = f"cannot {word} MIG: processes {[p.pid for p in procs]} use the GPU"
        outcome.errors.append(NvmlFailure("nvmlDeviceSetMigMode", IN_USE, "IN_USE", layout.gpu_uuid))
        return _report(layout, PartitionState.BLOCKED, generation, now_s, outcome, reason=reason)
    mig = backend.mig_state(gpu)
    if mig is not None and mig.current:
        for inst in backend.instances(gpu):  # clear first, as mig-parted does (§5.2)
            if inst.ci_id is not None:
                backend.destroy_ci(gpu, inst.gi_id, inst.ci_id)
                outcome.actions.append(f"destroy_ci gi {inst.gi_id} ci {inst.ci_id}")
            backend.destroy_gi(gpu, inst.gi_id)
            outcome.actions.append(f"destroy_gi {inst.profile}@{inst.start} gi {inst.gi_id}")
    status = backend.set_mig_mode(gpu, want_mig)
    outcome.actions.append(f"set_mig_mode {int(want_mig)} → activation {status}")
    if status == RESET_REQUIRED:
        outcome.errors.append(NvmlFailure("nvmlDeviceSetMigMode", status, "RESET_REQUIRED", layout.gpu_uuid))
        reason = "the platform cannot reset this GPU (passthrough): reboot the VM to apply the MIG mode"
        return _report(layout, PartitionState.REBOOT_REQUIRED, generation, now_s, outcome, reason=reason)
    if status == IN_USE:
        outcome.errors.append(NvmlFailure("nvmlDeviceSetMigMode", status, "IN_USE", layout.gpu_uuid))
        reason = "MIG mode change is pending: a client holds the GPU"
        return _report(layout, PartitionState.BLOCKED, generation, now_s, outcome, reason=reason)
    after = backend.mig_state(gpu)
    if status != SUCCESS or after is None or after.current != want_mig:
        reason = f"MIG mode change is pending (activation status {status}); a GPU reset applies it"
        return _report(layout, PartitionState.PENDING_RESET, generation, now_s, outcome, reason=reason)
    return None
