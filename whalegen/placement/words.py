"""Amounts as users wrote them: a request says `gpu_count: 2` or `gpu_milli: 500`, so the sentences it
gets back speak GPUs ("2 GPUs", "0.5 GPU"), never the milli-GPUs the plane counts in."""

from __future__ import annotations

WHOLE_GPU_MILLI = 1000


def gpus_text(milli: int) -> str:
    """1000 → "1 GPU", 12000 → "12 GPUs", 500 → "0.5 GPU", 2250 → "2.25 GPUs"."""
    amount = f"{milli / WHOLE_GPU_MILLI:.3f}".rstrip("0").rstrip(".")
    return f"{amount} GPU" if 0 < milli <= WHOLE_GPU_MILLI else f"{amount} GPUs"


def quota_wait_text(
    *, tenant: str, held_milli: int, asked_milli: int, guaranteed_milli: int, borrow_milli: int
) -> str:
    """Why a task waits for its team's quota, in the words submission refusals and overrides use too:
    what the team holds, what the task asks, and how much of the team's work must end first."""
    limit = guaranteed_milli + borrow_milli
    short = held_milli + asked_milli - limit
    return (
        f"quota: tenant {tenant} holds {gpus_text(held_milli)} in this pool, its limit is "
        f"{gpus_text(limit)} ({gpus_text(guaranteed_milli)} guaranteed + {gpus_text(borrow_milli)} "
        f"borrowable), and this task asks {gpus_text(asked_milli)}; it fits once {gpus_text(short)} of "
        "the tenant's work ends"
    )


def quota_mem_wait_text(*, tenant: str, held_mem_mib: int, asked_mem_mib: int, limit_mem_mib: int) -> str:
    """Why a task waits for its team's GPU-memory bound: what the team's admitted tasks state, what the
    task asks (its GPU memory on each of its GPUs) and how much must end first."""
    return (
        f"quota: tenant {tenant}'s admitted tasks state {held_mem_mib} MiB of GPU memory in this pool, its "
        f"limit is {limit_mem_mib} MiB, and this task asks {asked_mem_mib} MiB; it fits once "
        f"{held_mem_mib + asked_mem_mib - limit_mem_mib} MiB of the tenant's work ends"
    )
