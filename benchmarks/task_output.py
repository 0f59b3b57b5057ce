"""What does capturing and shipping a task's output cost? A task printing 1 MB/s under the real agent.

    python benchmarks/task_output.py [--window-s 20] [--mb-per-s 1]

The real `whalegen agent --backend sim` (default pace: tick 1 s) runs against a live plane double,
in the same run and for the same window:
- baseline: the agent supervising a task that prints nothing (`sleep`);
- loud: the agent supervising a task printing `--mb-per-s` MB/s of 100-byte lines on stdout;
- the printer alone, writing to /dev/null (what the task itself costs, without any capture).
CPU is utime+stime from /proc over the window, for the agent and for the task's launcher (which
reads the pipes and writes the capture). "Plane rows/s" counts the LogChunk rows the plane stores
(one per chunk the agent ships; each also updates its run's LogStream row) and the report POSTs.
Figures only; nothing here fails on a slow machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from whalegen.protocol import ComputeUnit, DesiredState, TaskSpec, UnitKind  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def printer(mb_per_s: float) -> str:
    return (
        "import sys, time\n"
        f"per_tick = int({mb_per_s} * 1_000_000 / 100 / 10)\n"
        "line = 'x' * 90\n"
        "n = 0\n"
        "start = time.monotonic()\n"
        "while True:\n"
        "    sys.stdout.write(''.join(f'{n + i:08d} {line}\\n' for i in range(per_tick)))\n"
        "    sys.stdout.flush()\n"
        "    n += per_tick\n"
        "    time.sleep(max(0.0, start + n / per_tick / 10 - time.monotonic()))\n"
    )


def progress(message: str) -> None:
    print(f"[bench task_output] {message}", file=sys.stderr, flush=True)


def shipped(plane: PlaneDouble, task_id: str) -> tuple[int, int, int, int, int]:
    """(reports carrying its output, chunks, lines, text bytes, lines the cap dropped) the plane got
    for one task."""
    with plane.lock:
        reports = list(plane.reports.values())
    chunks = [c for r in reports for c in r.logs if c.task_id == task_id]
    carrying = sum(1 for r in reports if any(c.task_id == task_id for c in r.logs))
    lines = sum(len(c.lines) for c in chunks)
    text = sum(len(line.text) + 1 for c in chunks for line in c.lines)
    return carrying, len(chunks), lines, text, sum(c.dropped_lines for c in chunks)


def launcher_pid(state_dir: Path, task_id: str) -> int:
    state = json.loads((state_dir / "agent-state.json").read_text())
    return next(int(t["pid"]) for t in state["tasks"] if t["task_id"] == task_id)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--mb-per-s", type=float, default=1.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="whalegen-bench-output-"))
    (tmp / "spec.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "bench", "gpus": [{"sku": "l40s"}]}]}))
    plane = PlaneDouble({"bench-token": "bench"}, heartbeat_interval_s=10.0, poll_wait_s=20.0)
    plane.start()
    state_dir = tmp / "state"
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "whalegen", "agent", "--server", plane.url, "--token", "bench-token",
            "--backend", "sim", "--sim-spec", str(tmp / "spec.yaml"), "--state-dir", str(state_dir),
            "--node-name", "bench", "--log-level", "WARNING",
        ],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=(tmp / "agent.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    alone = subprocess.Popen(
        [sys.executable, "-c", printer(args.mb_per_s)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    results: dict[str, dict[str, float]] = {}
    try:
        heartbeat = plane.wait_for(lambda: plane.heartbeats[-1] if plane.heartbeats else None, 60, "a beat")
        gpu = heartbeat.inventory[0].uuid
        unit = ComputeUnit(UnitKind.WHOLE)
        for phase, command in (
            ("quiet", ("sleep", "3600")),
            ("loud", (sys.executable, "-c", printer(args.mb_per_s))),
        ):
            task = TaskSpec(task_id=phase, command=command, gpu_uuid=gpu, unit=unit)
            plane.set_desired("bench-token", DesiredState(len(results) + 1, tasks=(task,)))
            plane.wait_for(lambda t=phase: plane.task_reports(t), 60, f"{phase} to start")  # type: ignore[misc]
            time.sleep(3.0)  # past start-up
            pid = launcher_pid(state_dir, phase)
            before = (cpu_s(agent.pid), cpu_s(pid), shipped(plane, phase), cpu_s(alone.pid))
            started = time.monotonic()
            progress(f"{phase}: measuring {args.window_s:.0f} s")
            time.sleep(args.window_s)
            wall = time.monotonic() - started
            after = (cpu_s(agent.pid), cpu_s(pid), shipped(plane, phase), cpu_s(alone.pid))
            reports, chunks, lines, text, dropped = (a - b for a, b in zip(after[2], before[2], strict=True))
            results[phase] = {
                "agent_cpu_pct": 100 * (after[0] - before[0]) / wall,
                "launcher_cpu_pct": 100 * (after[1] - before[1]) / wall,
                "printer_alone_cpu_pct": 100 * (after[3] - before[3]) / wall,
                "reports_per_s": reports / wall,
                "rows_per_s": chunks / wall,
                "lines_per_s": lines / wall,
                "dropped_per_s": dropped / wall,
                "mb_per_s": text / wall / 1e6,
            }
    finally:
        alone.kill()
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        plane.stop()
        state = state_dir / "agent-state.json"
        if state.exists():
            for record in json.loads(state.read_text()).get("tasks", []):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(record["pid"]), signal.SIGKILL)
    quiet, loud = results["quiet"], results["loud"]
    print(
        f"task output overhead, {args.window_s:.0f} s windows, agent tick 1 s, printer {args.mb_per_s} MB/s"
    )
    print(f"{'':<34}{'quiet task':>12}{'1 MB/s task':>13}")
    for key, label in (
        ("agent_cpu_pct", "agent CPU %"),
        ("launcher_cpu_pct", "launcher (capture) CPU %"),
        ("mb_per_s", "output shipped, MB/s"),
        ("lines_per_s", "lines shipped per s"),
        ("dropped_per_s", "lines dropped by the cap per s"),
        ("reports_per_s", "report POSTs per s"),
        ("rows_per_s", "plane LogChunk rows per s"),
    ):
        print(f"{label:<34}{quiet[key]:>12.2f}{loud[key]:>13.2f}")
    print(f"{'the printer alone, to /dev/null, CPU %':<34}{'':>12}{loud['printer_alone_cpu_pct']:>13.2f}")
    added = loud["agent_cpu_pct"] - quiet["agent_cpu_pct"] + loud["launcher_cpu_pct"]
    print(
        f"capture + shipping cost {added:.2f} CPU points per MB/s "
        f"({added / max(loud['printer_alone_cpu_pct'], 0.01):.2f}x what the printer itself burns)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
