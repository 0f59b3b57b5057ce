"""Put the fake command-line tools (`nvidia-cuda-mps-control`) into a directory for PATH."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

FAKE_MPS = Path(__file__).with_name("fake_mps.py")
REPO = Path(__file__).resolve().parents[2]


def install_fake_tools(bin_dir: Path) -> Path:
    """`nvidia-cuda-mps-control` (self-contained, stdlib only) and `nvidia-smi` (reads a simulated host)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = shlex.quote(sys.executable)
    tools = {
        "nvidia-cuda-mps-control": f'exec {python} -S -E {shlex.quote(str(FAKE_MPS))} "$@"',
        "nvidia-smi": f'PYTHONPATH={shlex.quote(str(REPO))} exec {python} -m agents.sim.fake_smi "$@"',
    }
    for name, line in tools.items():
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(0o755)
    return bin_dir
