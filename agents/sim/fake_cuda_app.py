"""A stand-in CUDA program for simulated hosts: it "allocates" GPU memory and obeys MPS limits.

`python -m agents.sim.fake_cuda_app --alloc-mib N [--grow-mib G --steps K --step-s S] [--sm-pct P]
[--mem-pct M] [--exit-code C]`

What a real CUDA program does, reduced to what the agent can observe:
1. Under MPS (`CUDA_MPS_PIPE_DIRECTORY` set) it connects to the (fake) MPS daemon, which fixes its
   thread share and pinned-memory limit at connect time: min(server value, client environment).
2. An allocation above the pinned limit fails with CUDA's out-of-memory error (exit code 2).
3. Its device memory shows up in NVML: it declares it in `$WHALEGEN_SIM_PROC_DIR/<pid>.json`, which
   the simulated NVML reads as the process list of that GPU or MIG device, with the share of the SMs
   it keeps busy (`--sm-pct`, default 35; 0 plays a task that holds its GPU and computes nothing) and
   the share of time it keeps the device memory busy (`--mem-pct`; by default half its SM share). NVML
   reports the second as the GPU's memory utilisation: near the SM share reads as bandwidth-bound, a
   small fraction of it as compute-bound (whalegen.forecast.profiles.classify_bound).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from agents.sim.fake_mps import MpsUnavailable, connect_client, disconnect_client

OUT_OF_MEMORY_EXIT = 2


def _declare(
    proc_dir: Path | None, device_uuid: str, used_mib: int, mps: bool, sm_pct: int, mem_pct: int | None
) -> None:
    if proc_dir is None:
        return
    path = proc_dir / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    declared = {"device_uuid": device_uuid, "used_mib": used_mib, "mps": mps, "sm_pct": sm_pct}
    if mem_pct is not None:
        declared["mem_pct"] = mem_pct
    tmp.write_text(json.dumps(declared))
    tmp.replace(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fake_cuda_app")
    parser.add_argument("--alloc-mib", type=int, default=0)
    parser.add_argument("--grow-mib", type=int, default=0, help="extra MiB per step")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--sm-pct", type=int, default=35, help="share of the SMs kept busy, 0-100")
    parser.add_argument(
        "--mem-pct",
        type=int,
        default=None,
        help="share of time device memory is busy, 0-100 (default: half SM)",
    )
    parser.add_argument("--say", default="", help="print '<say> i/steps' per step instead of the MiB used")
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args(argv)
    env = dict(os.environ)
    proc_dir = Path(env["WHALEGEN_SIM_PROC_DIR"]) if env.get("WHALEGEN_SIM_PROC_DIR") else None
    # 1. Device and limits.
    mps = "CUDA_MPS_PIPE_DIRECTORY" in env
    limit_mib = None
    if mps:
        try:
            limits = connect_client(env, os.getpid(), os.getuid())
        except MpsUnavailable as error:
            print(f"CUDA error: all CUDA-capable devices are busy or unavailable ({error})", file=sys.stderr)
            return 3
        device_uuid = str(limits["device_uuid"])
        limit_mib = limits["pinned_mib"]
        print(f"mps server={limits['server_pid']} thread_pct={limits['thread_pct']:g}", end=" ")
        print(f"pinned_limit_mib={limit_mib}")
    else:
        # A program given several GPUs declares the first (the one its default CUDA context is on).
        device_uuid = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
        print(f"device {device_uuid}")
    sys.stdout.flush()
    try:
        # 2. Allocate, then grow step by step.
        used = 0
        for step in range(max(1, args.steps)):
            want = args.alloc_mib + step * args.grow_mib
            if limit_mib is not None and want > limit_mib:
                message = f"allocating {want} MiB exceeds the MPS pinned limit {limit_mib} MiB"
                print(f"CUDA error: out of memory ({message})", file=sys.stderr)
                return OUT_OF_MEMORY_EXIT
            used = want
            mem_pct = None if args.mem_pct is None else max(0, min(100, args.mem_pct))
            _declare(proc_dir, device_uuid, used, mps, max(0, min(100, args.sm_pct)), mem_pct)
            line = f"{args.say} {step + 1}/{args.steps}" if args.say else f"step {step} using {used} MiB"
            print(line, flush=True)
            time.sleep(args.step_s)
        return int(args.exit_code)
    finally:
        if proc_dir is not None:
            (proc_dir / f"{os.getpid()}.json").unlink(missing_ok=True)
        if mps:
            disconnect_client(env, os.getpid())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
