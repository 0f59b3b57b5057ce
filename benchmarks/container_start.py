"""What does a container start cost beside a process start? `true` under each, one after the other.

    python benchmarks/container_start.py [--runs 20]

In the same run, alternating so drift hits both alike:
- process: the task launcher (`agents/launch.py`, as the runner starts it, output captured) running
  `true`: the launcher's floor;
- process, sandboxed: the same with the sandbox plan a root agent gives a process run (the tenant's uid,
  a cgroup with CPU, memory and pids limits made and removed, a private /tmp): the process runtime;
- container: `podman … run --rm IMAGE true` with the argv `agents.isolation.podman.run_argv` builds
  (the test image, network none, the env file, the ulimits, --init): the engine's floor;
- container via launcher: the launcher running that argv (what a container run costs the agent, less
  the run's cgroup).
Wall time from spawn to exit, median and P95. Needs root, podman and the test image (scripts/test-image).
Figures only; nothing here fails on a slow machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.isolation.plan import SandboxPlan  # noqa: E402
from agents.isolation.podman import (  # noqa: E402
    container_name,
    engine_available,
    engine_config_from_env,
    env_file_text,
    run_argv,
)

IMAGE = "localhost/whalegen-test/busybox:1"
LAUNCHER = ROOT / "agents" / "launch.py"


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} … failed ({done.returncode}): {done.stderr.decode().strip()}")
    return elapsed


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    engine = dataclasses.replace(engine_config_from_env(os.environ), network="none")
    reason = engine_available(engine)
    if reason is not None:
        raise SystemExit(f"no container engine: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env_file = work / "env"
        env_file.write_text(env_file_text({"WHALEGEN_TASK_ID": "bench"}))

        def launcher(n: int, command: list[str], plan: SandboxPlan | None = None) -> list[str]:
            task = work / f"run-{n}"
            task.mkdir()
            head = [sys.executable, "-S", "-E", str(LAUNCHER), str(task / "exit.json")]
            head += ["--output", str(task / "output"), "--cap-bytes", str(1 << 20)]
            if plan is not None:
                head += ["--cwd", str(task), "--plan", str(plan.write(task))]
            return [*head, "--", *command]

        def sandboxed(n: int) -> SandboxPlan:
            return SandboxPlan(
                cgroup=f"whalegen/bench-{os.getpid()}-{n}",
                cpu_milli=1000,
                host_mem_mib=4096,
                pids_max=4096,
                uid=200_001,
                gid=200_001,
                private_tmp=True,
                expose=(str(work / f"run-{n}"),),
            )

        def container(n: int) -> list[str]:
            name = container_name("bench", f"t{n}", 1, "bench")
            return run_argv(
                engine, name=name, image=IMAGE, command=["true"], uid=20001, gid=20001, env_file=str(env_file)
            )

        timed(container(-1))  # warm the image's layers and podman's caches once, not measured
        samples: dict[str, list[float]] = {
            "process": [],
            "process, sandboxed": [],
            "container": [],
            "container via launcher": [],
        }
        for n in range(args.runs):
            samples["process"].append(timed(launcher(3 * n, ["true"])))
            samples["process, sandboxed"].append(timed(launcher(3 * n + 2, ["true"], sandboxed(3 * n + 2))))
            samples["container"].append(timed(container(3 * n)))
            samples["container via launcher"].append(timed(launcher(3 * n + 1, container(3 * n + 1))))
    base = statistics.median(samples["process"])
    base_p95 = p95(samples["process"])
    print(f"start of `true`, {args.runs} runs each, same run ({' '.join(engine.prefix)})")
    print(f"{'':24} {'median ms':>10} {'P95 ms':>10} {'× process (median, P95)':>26}")
    for label, values in samples.items():
        median, tail = statistics.median(values), p95(values)
        ratio = f"{median / base:.1f}× , {tail / base_p95:.1f}×"
        print(f"{label:24} {median * 1000:10.1f} {tail * 1000:10.1f} {ratio:>26}")


if __name__ == "__main__":
    main()
