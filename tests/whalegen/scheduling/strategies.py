"""Random unit-exact pools and pending sets for property tests: whole, MPS and MIG GPUs, some MIG GPUs
idle with a mixed layout, some partly held; tasks of every isolation, gangs, tenants with quotas."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.whalegen.scheduling.builders import Gpu, Pool, mig, mps, whole
from whalegen.placement.types import Isolation, Quota, TaskRequest

# Layouts an operator runs on an H100 (start slices valid for each profile).
LAYOUTS = [
    [("3g.40gb", 0), ("3g.40gb", 4)],
    [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)],
    [("1g.10gb", s) for s in range(7)],
    [("4g.40gb", 0), ("3g.40gb", 4)],
    [("7g.80gb", 0)],
    [("7g.80gb", 0)],
    [("3g.40gb", 0)],
]
TENANTS = ("a", "b", "c")


@st.composite
def gpus(draw: st.DrawFn) -> Gpu:
    kind = draw(st.sampled_from(["whole", "whole", "mps", "mig", "mig"]))
    if kind == "whole":
        return whole(held=draw(st.booleans()))
    if kind == "mps":
        shares = draw(st.sampled_from([2, 4, 10]))
        return mps(shares=shares, held=draw(st.integers(0, shares)))
    layout = draw(st.sampled_from(LAYOUTS))
    idle = draw(st.booleans())
    return mig(*[(p, s, not idle and draw(st.booleans())) for p, s in layout])


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    pool = Pool()
    for i in range(draw(st.integers(1, 4))):
        cpu = draw(st.sampled_from([4_000, 16_000, 64_000]))
        pool.node(f"n{i}", *draw(st.lists(gpus(), min_size=1, max_size=4)), cpu_milli=cpu)
    return pool


@st.composite
def pending(draw: st.DrawFn) -> list[TaskRequest]:
    out: list[TaskRequest] = []
    gang_members: dict[str, int] = {}
    for i in range(draw(st.integers(1, 12))):
        num_gpu = draw(st.sampled_from([1, 1, 1, 2]))
        milli = draw(st.sampled_from([100, 250, 430, 500, 1000])) if num_gpu == 1 else 1000
        isolation = draw(st.sampled_from(list(Isolation)))
        gang = draw(st.sampled_from([None, None, None, "g1", "g2"]))
        tenant = draw(st.sampled_from(TENANTS))
        if gang is not None:
            gang = f"{tenant}:{gang}"
            gang_members[gang] = gang_members.get(gang, 0) + 1
        out.append(
            TaskRequest(
                task_id=f"t{i}",
                cpu_milli=draw(st.sampled_from([1_000, 2_000, 8_000])),
                mem_mib=1024,
                num_gpu=num_gpu,
                gpu_milli=milli,
                gpu_mem_mib=draw(st.sampled_from([0, 0, 8_000, 30_000])),
                gang_id=gang,
                priority=draw(st.integers(0, 3)),
                tenant=tenant,
                isolation=isolation,
                submitted_at_s=float(i),
            )
        )
    # Gang sizes as submitted: usually complete, sometimes one member short.
    short = draw(st.booleans())
    return [
        t
        if t.gang_id is None
        else _sized(t, gang_members[t.gang_id] + (1 if short and t.gang_id.endswith("g2") else 0))
        for t in out
    ]


def _sized(task: TaskRequest, size: int) -> TaskRequest:
    from dataclasses import replace

    return replace(task, gang_size=size)


@st.composite
def quotas(draw: st.DrawFn) -> list[Quota]:
    return [
        Quota(t, draw(st.sampled_from([0, 1000, 2000, 4000])), draw(st.sampled_from([0, 1000, 3000])))
        for t in TENANTS
        if draw(st.booleans())
    ]
