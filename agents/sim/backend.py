"""Build the simulated host the agent runs against with `--backend sim`: Layer A under Layer B."""

from __future__ import annotations

from pathlib import Path

from agents.backend import NvmlBackend
from agents.sim.core import SimSystem
from agents.sim.shim import install
from agents.sim.spec import build_system, load_spec

# A simulated CUDA program declares its GPU memory in this directory (see agents.sim.fake_cuda_app).
PROC_DIR_ENV = "WHALEGEN_SIM_PROC_DIR"


def simulated_backend(system: SimSystem) -> NvmlBackend:
    """The production NvmlBackend, its pynvml now talking to `system` instead of the driver."""
    install(system)
    extra = {PROC_DIR_ENV: str(system.proc_dir)} if system.proc_dir is not None else {}
    return NvmlBackend(extra_task_env=extra)


def from_spec_file(spec_path: Path, node: str | None, sim_dir: Path) -> tuple[SimSystem, NvmlBackend]:
    """A simulator whose control inbox, process directory and call log live under `sim_dir`."""
    for sub in ("control", "procs"):
        (sim_dir / sub).mkdir(parents=True, exist_ok=True)
    system = build_system(
        load_spec(spec_path),
        node,
        call_log_path=sim_dir / "calls.jsonl",
        control_dir=sim_dir / "control",
        proc_dir=sim_dir / "procs",
        state_path=sim_dir / "driver-state.json",
    )
    return system, simulated_backend(system)
