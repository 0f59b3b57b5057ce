"""Put the fake command-line tools (`nvidia-cuda-mps-control`) into a directory for PATH."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

FAKE_MPS = Path(__file__).with_name("fake_mps.py")


def install_fake_tools(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S -E {shlex.quote(str(FAKE_MPS))} "$@"\n'
    )
    script.chmod(0o755)
    return bin_dir
