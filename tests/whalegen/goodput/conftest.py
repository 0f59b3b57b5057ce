from __future__ import annotations

from pathlib import Path

import pytest

from whalegen.goodput.data import (
    GAVEL_FILE,
    LUCID_COLOCATE_FILE,
    LUCID_SINGLE_FILE,
    GavelData,
    LucidPair,
    LucidSolo,
    default_traces_dir,
    load_gavel,
    load_lucid_colocate,
    load_lucid_single,
)


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared public traces, read in place ($WHALEGEN_TRACES_DIR; CI refuses to run without them)."""
    path = default_traces_dir()
    if not (path / GAVEL_FILE).is_file():
        pytest.skip(f"public traces not found at {path} (set WHALEGEN_TRACES_DIR)")
    return path


@pytest.fixture(scope="session")
def gavel(traces_dir: Path) -> GavelData:
    return load_gavel(traces_dir / GAVEL_FILE)


@pytest.fixture(scope="session")
def lucid_single(traces_dir: Path) -> tuple[LucidSolo, ...]:
    return load_lucid_single(traces_dir / LUCID_SINGLE_FILE)


@pytest.fixture(scope="session")
def lucid_pairs(traces_dir: Path) -> tuple[LucidPair, ...]:
    return load_lucid_colocate(traces_dir / LUCID_COLOCATE_FILE)
