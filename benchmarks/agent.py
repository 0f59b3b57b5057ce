"""How light is the node agent? RSS and idle CPU of the real `whalegen agent` process.

    python benchmarks/agent.py [--idle-s 30] [--png agent-footprint.png]

Runs, side by side and for the same idle window:
- baseline A: a bare Python interpreter that sleeps (the floor any Python agent pays);
- baseline B: an interpreter that imports the agent's dependencies (pynvml, requests, PyYAML) and sleeps;
- the agent: `whalegen agent --backend sim` on a simulated host (an H100 in MIG mode with a layout
  applied, and an L40S), heartbeating and long-polling a live plane double with default intervals.
CPU is utime+stime from /proc over the window; RSS is VmRSS at the end. Goals: ≤ 60 MB, < 1 % CPU.
Figures only; nothing here fails on a slow machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.agents.plane_double import PlaneDouble  # noqa: E402
from whalegen.protocol import DesiredState, GpuLayout, MigInstanceSpec, PartitionMode  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
RSS_GOAL_MB = 60.0
CPU_GOAL_PCT = 1.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def progress(message: str) -> None:
    print(f"[bench agent] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="whalegen-bench-agent-"))
    spec = {
        "nodes": [{"name": "bench", "gpus": [{"sku": "h100-80gb-sxm", "mig": "enabled"}, {"sku": "l40s"}]}]
    }
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))
    plane = PlaneDouble({"bench-token": "bench"}, heartbeat_interval_s=10.0, poll_wait_s=20.0)
    plane.start()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs: dict[str, subprocess.Popen[bytes]] = {
        "bare python": subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]),
        "python + agent deps": subprocess.Popen(
            [sys.executable, "-c", "import pynvml, requests, yaml, time; time.sleep(3600)"]
        ),
    }
    log = (tmp / "agent.log").open("wb")
    procs["whalegen agent"] = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whalegen",
            "agent",
            "--server",
            plane.url,
            "--token",
            "bench-token",
            "--backend",
            "sim",
            "--sim-spec",
            str(tmp / "spec.yaml"),
            "--state-dir",
            str(tmp / "state"),
            "--node-name",
            "bench",
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        progress("waiting for the agent to register and apply a MIG layout")
        heartbeat = plane.wait_for(
            lambda: plane.heartbeats[-1] if plane.heartbeats else None, 60, "a heartbeat"
        )
        h100 = heartbeat.inventory[0].uuid
        layout = GpuLayout(h100, PartitionMode.MIG, (MigInstanceSpec("3g.40gb"), MigInstanceSpec("2g.20gb")))
        plane.set_desired("bench-token", DesiredState(1, gpus=(layout,)))
        plane.wait_for(lambda: plane.partition_reports(h100), 60, "the layout to be applied")
        time.sleep(2.0)  # let start-up work settle before measuring idle
        start_cpu = {name: cpu_s(p.pid) for name, p in procs.items()}
        started = time.monotonic()
        progress(f"measuring {args.idle_s:.0f} s of idle")
        time.sleep(args.idle_s)
        wall = time.monotonic() - started
        rows = []
        for name, proc in procs.items():
            used = cpu_s(proc.pid) - start_cpu[name]
            rows.append((name, rss_mb(proc.pid), 100.0 * used / wall))
        beats = len(plane.heartbeats)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=20)
        plane.stop()
    base_rss, base_cpu = rows[0][1], rows[0][2]
    deps_rss = rows[1][1]
    print(
        f"agent footprint over {wall:.1f} s idle (heartbeat 10 s, long poll 20 s, tick 1 s); "
        f"{beats} heartbeats"
    )
    print(f"{'process':<22}{'RSS MB':>9}{'CPU %':>9}{'RSS / bare':>12}")
    for name, rss, cpu in rows:
        print(f"{name:<22}{rss:>9.1f}{cpu:>9.2f}{rss / base_rss:>11.2f}x")
    agent_rss, agent_cpu = rows[2][1], rows[2][2]
    print(
        f"agent above its own dependencies: {agent_rss - deps_rss:+.1f} MB; CPU above bare python: "
        f"{agent_cpu - base_cpu:+.2f} points"
    )
    print(
        f"goals: RSS ≤ {RSS_GOAL_MB:.0f} MB → {'met' if agent_rss <= RSS_GOAL_MB else 'MISSED'}; "
        f"idle CPU < {CPU_GOAL_PCT:.0f} % → {'met' if agent_cpu < CPU_GOAL_PCT else 'MISSED'}"
    )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
        names = [r[0] for r in rows]
        left.barh(names, [r[1] for r in rows], color=["#999", "#999", "#1f77b4"])
        left.axvline(RSS_GOAL_MB, color="red", linestyle="--", label="goal")
        left.set_xlabel("RSS (MB)")
        left.legend()
        right.barh(names, [r[2] for r in rows], color=["#999", "#999", "#1f77b4"])
        right.axvline(CPU_GOAL_PCT, color="red", linestyle="--")
        right.set_xlabel("idle CPU (%)")
        right.set_yticks([])
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
