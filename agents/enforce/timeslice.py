"""Time-slice watchdog: the driver isolates nothing between time-sliced contexts (reference §7.1), so
the agent bounds each task's GPU memory itself, from NVML's per-process memory, and stops a task
that goes over its slice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from whalegen.protocol import ProcessSample


@dataclass(frozen=True)
class Overrun:
    task_id: str
    used_mib: int
    limit_mib: int
    pids: tuple[int, ...]

    @property
    def reason(self) -> str:
        return (
            f"timeslice_memory_exceeded: used {self.used_mib} MiB > slice {self.limit_mib} MiB "
            f"(pids {list(self.pids)})"
        )


def find_overruns(
    processes: list[ProcessSample], limits_mib: dict[str, int], task_of_pid: Callable[[int], str | None]
) -> list[Overrun]:
    """Sum each bounded task's GPU memory over all its processes and list those above their bound.

    A task's processes are found through `task_of_pid` (process group → task), so a child the task
    forks counts against the same slice. Memory NVML cannot report (None) counts as zero.
    """
    used: dict[str, int] = {}
    pids: dict[str, list[int]] = {}
    for proc in processes:
        task_id = task_of_pid(proc.pid)
        if task_id is None or task_id not in limits_mib:
            continue
        used[task_id] = used.get(task_id, 0) + (proc.used_mib or 0)
        pids.setdefault(task_id, []).append(proc.pid)
    return [
        Overrun(task_id, used[task_id], limits_mib[task_id], tuple(sorted(pids[task_id])))
        for task_id in sorted(used)
        if used[task_id] > limits_mib[task_id]
    ]
