"""Idle agents: the CPU one real node agent costs its host when nothing happens, per agent-second.

    python benchmarks/agent_idle.py [--agents 200] [--duration-s 60] [--warm-up-s 20] [--rounds 2]
        [--baseline-tree DIR] [--json]

What runs (issue #42 item 2: the generators of benchmarks/agent_fleet.py cost ≈ 0.0009 cores per agent,
which keeps 2,000 real agents off a 2-core machine):
- **The agents**: benchmarks/agent_fleet.py's own generator process (`agent_fleet.py generate`):
  `--agents` real `agents.agent.Agent`s, each with its 1 s loop, its poller thread, its state file and
  outbox, on one simulated host of 4 L40S (agents.sim) seen under GPU UUIDs of its own. So what is
  measured here is what the fleet benchmark's generators spend, and a change to either shows here.
- **The plane**: tests/agents/plane_double.py in a process of its own (its CPU is not counted), at the
  shipped pace: heartbeat 10 s, no long poll (`poll_wait_s` 0), each node handed one desired state of
  4 whole GPUs at registration and no change after it. Idle: no run, no change, a heartbeat every 10 s
  and a reconcile every 30 s.
- **The window**: after every agent has started (spread over the ramp) and `--warm-up-s`, the generator
  process's utime + stime over `--duration-s` (from /proc, all its threads).

`--baseline-tree DIR` runs the same generator from another source tree (e.g. `git archive <commit>
agents benchmarks whalegen tests | tar -x -C DIR`: its agent, simulator and generator) in the same
invocation, alternating baseline and this tree for `--rounds` rounds, so both see the same machine.
Prints CPU milliseconds per agent-second for each run and the ratio of the medians. Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEARTBEAT_S = 10.0  # the plane's shipped WHALEGEN_AGENT_HEARTBEAT_S
GPUS_PER_NODE = 4  # agent_fleet.SIM_SPEC: one simulated host of 4 L40S, named "fleet"


def progress(message: str) -> None:
    print(f"[agent-idle {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the plane double, in a process of its own ------------------------------------------------------------
def serve_plane(tokens_path: Path, port_path: Path) -> int:
    """Answer the agents of `tokens_path` (name → token) until killed; each node's desired state is its
    4 GPUs whole, under the UUIDs the fleet generator's `NodeView` gives them (`<uuid>-<node name>`)."""
    from agents.sim.core import gpu_uuid
    from tests.agents.plane_double import PlaneDouble
    from whalegen.protocol import DesiredState, GpuLayout

    tokens: dict[str, str] = json.loads(tokens_path.read_text())
    plane = PlaneDouble({token: name for name, token in tokens.items()}, heartbeat_interval_s=HEARTBEAT_S,
                        poll_wait_s=0.0)  # fmt: skip
    for name, token in tokens.items():
        gpus = tuple(GpuLayout(f"{gpu_uuid('fleet', i)}-{name}") for i in range(GPUS_PER_NODE))
        plane.set_desired(token, DesiredState(generation=1, gpus=gpus))
    plane.start()
    port_path.write_text(str(plane.port))
    try:
        while True:
            time.sleep(3600)
    finally:
        plane.stop()


def _start_plane(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_path = work / "plane.port"
    command = [sys.executable, str(Path(__file__).resolve()), "plane", "--tokens", str(work / "tokens.json"),
               "--port-file", str(port_path)]  # fmt: skip
    log = (work / "plane.log").open("wb")
    plane = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not port_path.exists() or not port_path.read_text():
        if plane.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the plane double did not start:\n{(work / 'plane.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return plane, f"http://127.0.0.1:{port_path.read_text()}"


# ---- one run: a generator process of a tree against a fresh plane double ----------------------------------
def run_idle(work: Path, *, tree: Path, agents: int, duration_s: float, warm_up_s: float) -> dict[str, Any]:
    work.mkdir(parents=True)
    tokens = {f"idle-{n:05d}": f"token-idle-{n:05d}" for n in range(agents)}
    (work / "tokens.json").write_text(json.dumps(tokens))
    plane, url = _start_plane(work)
    try:
        ramp_s = max(5.0, agents / 50)
        started = time.time() + 2.0
        window = (started + ramp_s + warm_up_s, started + ramp_s + warm_up_s + duration_s)
        out = work / "generator.json"
        command = [sys.executable, str(tree / "benchmarks" / "agent_fleet.py"), "generate", "--server", url,
                   "--tokens", str(work / "tokens.json"), "--first", "0", "--count", str(agents),
                   "--work", str(work / "gen"), "--out", str(out), "--started-at", str(started),
                   "--ramp-s", str(ramp_s), "--window-start", str(window[0]),
                   "--window-end", str(window[1])]  # fmt: skip
        with (work / "generator.log").open("wb") as log:
            generator = subprocess.run(command, cwd=tree, stdout=log, stderr=log, check=False)
        if generator.returncode != 0:
            raise SystemExit(f"generator failed:\n{(work / 'generator.log').read_text()[-3000:]}")
        result = json.loads(out.read_text())
    finally:
        plane.kill()
        plane.wait()
    window_s = window[1] - window[0]
    beats = sum(len(times) for times in result["beats"].values())
    return {
        "agents": agents,
        "registered": result["registered"],
        "applied_a_desired_state": result["applied_a_desired_state"],
        "window_s": round(window_s, 1),
        "heartbeats_in_window": beats,
        "heartbeats_due": int(agents * window_s / HEARTBEAT_S),
        "generator_cpu_s": round(result["cpu_s"], 2),
        "cores": round(result["cpu_s"] / window_s, 4),
        # 1 ms per agent-second = 0.001 cores per agent.
        "cpu_ms_per_agent_s": round(1000 * result["cpu_s"] / (agents * window_s), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    plane = sub.add_parser("plane", help="(internal) the plane double")
    plane.add_argument("--tokens", type=Path, required=True)
    plane.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--warm-up-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-tree", type=Path, help="another source tree to measure in the same run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.command == "plane":
        return serve_plane(args.tokens, args.port_file)
    trees = {"this_tree": ROOT}
    if args.baseline_tree is not None:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="whalegen-agent-idle-") as tmp:
        for round_no in range(args.rounds):
            for label, tree in trees.items():
                progress(
                    f"round {round_no + 1}: {label} ({tree}), {args.agents} agents, {args.duration_s:.0f} s"
                )
                figures = run_idle(Path(tmp) / f"{label}-{round_no}", tree=tree, agents=args.agents,
                                   duration_s=args.duration_s, warm_up_s=args.warm_up_s)  # fmt: skip
                figures["load_average"] = [round(v, 2) for v in os.getloadavg()]
                runs[label].append(figures)
                progress(f"  {figures['cpu_ms_per_agent_s']} ms per agent-second")
    results: dict[str, Any] = {"runs": runs}
    medians = {label: statistics.median(r["cpu_ms_per_agent_s"] for r in rs) for label, rs in runs.items()}
    results["median_cpu_ms_per_agent_s"] = medians
    if "baseline" in medians:
        results["this_tree_over_baseline"] = round(medians["this_tree"] / medians["baseline"], 3)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for label, rs in runs.items():
            for r in rs:
                print(f"{label}: {r}")
        for key in ("median_cpu_ms_per_agent_s", "this_tree_over_baseline"):
            if key in results:
                print(f"{key}: {results[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
