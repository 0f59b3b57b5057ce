from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared public traces (traces/README.md); read in place, never copied into the repo."""
    path = Path(os.environ.get("WHALEGEN_TRACES_DIR", "/work/shared/traces"))
    if not (path / "genai-2026").is_dir():
        pytest.skip(f"public traces not found at {path} (set WHALEGEN_TRACES_DIR)")
    return path
