"""What `whalegen demo` runs besides the plane: one simulated agent per node (the real agent code on the
simulated NVML, as subprocesses) and a workload generator drawing task shapes from the openb trace.

The scheduling cycle is not here: it is the `schedule-pools` beat entry of `apps.scheduling`, which the
demo's in-process beat fires like any other entry. Nothing in this module places a task.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import ctypes.util
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import close_old_connections
from django.db.models import Count

from apps.fleet.nodes import node_token_issue
from apps.inventory.models import Gpu, Node
from apps.workloads.models import Queue, Task
from apps.workloads.services import TaskSubmission, task_submit
from whalegen.gpus.skus import SKUS

log = logging.getLogger("whalegen.demo")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# Catalogue model → simulator SKU (agents/sim fixtures), from the fixtures themselves. The simulator has
# no L4: the nearest SKU it has, an L40S, stands in (whole GPUs and MPS only, like an L4); the plane keeps
# its own model name.
SIM_SKUS = {sku.model: sku.key for sku in SKUS.values()} | {"L4": "l40s"}

# When the trace is missing: (gpu_count, gpu_milli, weight), shaped like openb's mix (mostly single
# GPUs, many fractions, a few multi-GPU tasks).
BUILTIN_SHAPES = [
    (1, 1000, 40),
    (1, 500, 15),
    (1, 250, 10),
    (1, 100, 10),
    (2, 1000, 12),
    (4, 1000, 8),
    (8, 1000, 5),
]


def sim_spec(nodes: list[Node]) -> dict[str, object]:
    """A simulator fleet spec matching the seeded nodes GPU for GPU (index order, MIG mode as seeded)."""
    spec_nodes = []
    for node in nodes:
        gpus = [
            {
                "sku": SIM_SKUS[gpu.model],
                "mig": "enabled" if gpu.partition_mode == Gpu.PartitionMode.MIG else "disabled",
            }
            for gpu in node.gpus.order_by("index")
        ]
        spec_nodes.append({"name": node.name, "gpus": gpus})
    return {"driver_version": "570.124.06", "nodes": spec_nodes}


def isolation_line(*, is_root: bool | None = None) -> str:
    """How the demo's tasks run, in one line for its banner (docs/isolation.md). As root, the agents
    start each run as its tenant's uid in the hardened `process` runtime; not root, they cannot, so they
    declare the host single-tenant (`SimulatedAgents`) and run one tenant's tasks at a time."""
    if is_root is None:
        is_root = os.geteuid() == 0
    if is_root:
        return (
            "tasks run as host processes, each as its tenant's uid in a cgroup with a private /tmp "
            "(docs/isolation.md)"
        )
    return (
        f"tasks run as host processes as your own user (uid {os.geteuid()}), without a sandbox: not root, so "
        "each agent runs one tenant's tasks at a time; run as root for a uid per tenant, cgroups and a "
        "private /tmp (docs/isolation.md)"
    )


def _die_with_parent() -> None:
    """In the agent's child process: SIGTERM it when the demo dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Agent:
    node: str
    state_dir: Path
    proc: subprocess.Popen[bytes]


class SimulatedAgents:
    """`whalegen agent --backend sim` per node, each with a freshly issued node credential."""

    def __init__(self, work_dir: Path, server: str, *, limit: int | None = None) -> None:
        self.work_dir = work_dir
        self.server = server
        self.limit = limit
        self.agents: list[_Agent] = []

    def start(self) -> int:
        from agents.sim.tools import install_fake_tools

        nodes = list(Node.objects.select_related("cluster").order_by("cluster__name", "name"))[: self.limit]
        if not nodes:
            return 0
        # A fresh simulated host each start: the previous run's processes were ended with it.
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(parents=True)
        spec_path = self.work_dir / "fleet.yaml"
        spec_path.write_text(yaml.safe_dump(sim_spec(nodes), sort_keys=False))
        bin_dir = install_fake_tools(self.work_dir / "bin")
        root = Path(settings.BASE_DIR)
        for node in nodes:
            state_dir = self.work_dir / node.name
            state_dir.mkdir()
            token_file = state_dir / "token"
            token_file.write_text(node_token_issue(node=node))
            token_file.chmod(0o600)
            env = dict(
                os.environ,
                PATH=f"{bin_dir}:{os.environ.get('PATH', '')}",
                PYTHONPATH=str(root),
                WHALEGEN_AGENT_TOKEN_FILE=str(token_file),
            )
            env.pop("WHALEGEN_AGENT_TOKEN", None)
            if os.geteuid() != 0:
                # An agent that is not root cannot start a run as its tenant's uid and refuses runs
                # unless the host is declared single-tenant: the demo is one person's machine, it says so
                # (and its banner says what that means: `isolation_line`).
                env["WHALEGEN_AGENT_SINGLE_TENANT"] = "true"
            with (state_dir / "agent.log").open("ab") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable, "-m", "whalegen", "agent", "--server", self.server,
                        "--backend", "sim", "--sim-spec", str(spec_path), "--sim-node", node.name,
                        "--node-name", node.name, "--state-dir", str(state_dir),
                        "--heartbeat-s", "5", "--poll-wait-s", "10", "--reconcile-s", "15",
                    ],
                    cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                )  # fmt: skip
            self.agents.append(_Agent(node.name, state_dir, proc))
        return len(self.agents)

    def stop(self) -> None:
        """Stop the agents, then the tasks they leave running on purpose (a demo leaves nothing behind)."""
        for agent in self.agents:
            if agent.proc.poll() is None:
                agent.proc.terminate()
        for agent in self.agents:
            try:
                agent.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait()
            state = agent.state_dir / "agent-state.json"
            if state.exists():
                for record in json.loads(state.read_text()).get("tasks", []):
                    with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, ValueError):
                        os.killpg(int(record["pid"]), signal.SIGKILL)
            for pid_file in agent.state_dir.glob("mps/*/pipe/nvidia-cuda-mps-control.pid"):
                with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)


def trace_shapes(traces_dir: Path) -> list[tuple[int, int, float]]:
    """(gpu_count, gpu_milli, lifetime_s) of every GPU task in openb's default list, or [] if absent."""
    path = traces_dir / "openb" / "openb_pod_list_default.csv"
    if not path.is_file():
        return []
    shapes = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if count < 1 or milli < 1:
                continue
            try:
                lifetime_s = max(float(row["deletion_time"]) - float(row["creation_time"]), 1.0)
            except (KeyError, ValueError):
                lifetime_s = 3600.0
            shapes.append((count, min(milli, 1000), lifetime_s))
    return shapes


# The generator's idle task: the 3rd submission, then every IDLE_EVERY-th. It holds a whole GPU and
# 2 GiB of its memory at 0 % SM for IDLE_RUNTIME_S, so the idle check (WHALEGEN_IDLE_AFTER_S, which
# `whalegen demo` shortens to 120 s) flags it on the dashboard a few minutes into the demo.
IDLE_FIRST, IDLE_EVERY, IDLE_RUNTIME_S = 3, 25, 420


def idle_task_request(queue: Queue) -> TaskSubmission:
    app = [sys.executable, "-m", "agents.sim.fake_cuda_app"]
    return TaskSubmission(
        queue=queue.name,
        name="gen-idle-notebook",
        gpu_count=1,
        gpu_milli=1000,
        isolation=Task.Isolation.EXCLUSIVE,  # a whole GPU of its own: the GPU's utilisation is its own
        kind=Task.Kind.INTERACTIVE,
        command=[
            *app,
            "--alloc-mib",
            "2048",
            "--sm-pct",
            "0",
            "--steps",
            str(IDLE_RUNTIME_S // 5),
            "--step-s",
            "5",
        ],
        max_runtime_s=IDLE_RUNTIME_S * 2,
        profile_key="demo-idle-notebook",
    )


class WorkloadGenerator:
    """Submits a task every `interval_s` on behalf of a random tenant queue, shaped like a draw from the
    trace. Trace lifetimes (hours to weeks) are squeezed onto 5–60 s on a log scale so the demo moves;
    1 in 12 tasks exits non-zero so failures show too; now and then one holds its GPU idle
    (`idle_task_request`). A request the quota refuses is skipped."""

    def __init__(self, traces_dir: Path, *, interval_s: float, seed: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.shapes = trace_shapes(traces_dir)
        self.source = "openb trace" if self.shapes else "built-in shapes (openb trace not found)"
        self.submitted = 0
        self.refused = 0
        self._stop = threading.Event()

    def draw(self) -> tuple[int, int, float]:
        if self.shapes:
            return self.rng.choice(self.shapes)
        count, milli, _ = self.rng.choices(BUILTIN_SHAPES, weights=[w for *_, w in BUILTIN_SHAPES])[0]
        return count, milli, self.rng.lognormvariate(9, 2)

    def submit_one(self) -> Task | None:
        count, milli, lifetime_s = self.draw()
        queue = self.rng.choice(list(Queue.objects.select_related("tenant")))
        number = self.submitted + self.refused + 1
        if number == IDLE_FIRST or (number > IDLE_FIRST and (number - IDLE_FIRST) % IDLE_EVERY == 0):
            # Into a pool with whole GPUs: a MIG instance reports no utilisation to judge by.
            whole = Queue.objects.filter(pool__nodes__gpus__partition_mode=Gpu.PartitionMode.WHOLE)
            queue = self.rng.choice(list(whole.select_related("tenant").distinct().order_by("pk")) or [queue])
            return self._submit(queue, idle_task_request(queue))
        # log10 lifetime in [1, 7] s of the trace → [5, 60] s here.
        runtime_s = round(5 + 55 * min(max((math.log10(lifetime_s) - 1) / 6, 0.0), 1.0))
        fails = self.rng.random() < 1 / 12
        command = ["sh", "-c", f"sleep {runtime_s}; exit {3 if fails else 0}"]
        request = TaskSubmission(
            queue=queue.name,
            name=f"gen-{count}x{milli}",
            gpu_count=count if milli == 1000 else 1,
            gpu_milli=milli,
            kind=Task.Kind.BATCH,
            command=command,
            max_runtime_s=runtime_s * 4,
            profile_key=f"openb-{count}x{milli}",
        )
        return self._submit(queue, request)

    def _submit(self, queue: Queue, request: TaskSubmission) -> Task | None:
        member = queue.tenant.memberships.select_related("user").first()
        try:
            task, _ = task_submit(
                tenant=queue.tenant, request=request, submitted_by=member.user if member else None
            )
        except ValidationError:
            self.refused += 1
            return None
        self.submitted += 1
        return task

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.submit_one()
            except Exception:  # one bad draw must not end the stream
                log.exception("workload generator: submission failed")
            finally:
                close_old_connections()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="whalegen-workload", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


def status_line() -> str:
    """One line for the console: tasks by state, nodes by state."""
    tasks = Counter(dict(Task.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")))
    nodes = Counter(Node.objects.values_list("state", flat=True))
    order = ["pending", "admitted", "assigned", "running", "succeeded", "failed", "cancelled"]
    shown = ", ".join(f"{tasks.get(s, 0)} {s}" for s in order)
    return f"tasks: {shown}; nodes: " + ", ".join(f"{n} {s}" for s, n in sorted(nodes.items()))
