"""Build the simulated host the agent runs against with `--backend sim`: Layer A under Layer B."""

from __future__ import annotations

from pathlib import Path

from agents.backend import NvmlBackend
from agents.sim.cdi import SimCdi, device_name, remove_spec, sim_cdi, write_spec
from agents.sim.core import SimSystem
from agents.sim.shim import install
from agents.sim.spec import build_system, load_spec

# A simulated CUDA program declares its GPU memory in this directory (see agents.sim.fake_cuda_app).
PROC_DIR_ENV = "WHALEGEN_SIM_PROC_DIR"


class SimBackend(NvmlBackend):
    """The production NvmlBackend over the simulated NVML, naming its devices in its own CDI spec
    (agents.sim.cdi): written when it opens, removed when it closes. Without a CDI home (`cdi` None:
    a simulator built in memory by a unit test) it names no devices."""

    def __init__(self, system: SimSystem, extra_task_env: dict[str, str], cdi: SimCdi | None) -> None:
        super().__init__(extra_task_env=extra_task_env)
        self.system = system
        self.cdi = cdi

    def open(self) -> None:
        super().open()
        if self.cdi is not None:
            write_spec(self.cdi, self.system)

    def close(self) -> None:
        if self.cdi is not None:
            remove_spec(self.cdi)
        super().close()

    def _cdi(self) -> SimCdi:
        if self.cdi is None:
            raise LookupError("this simulated host has no directory, so no CDI spec (see simulated_backend)")
        return self.cdi

    def cdi_device(self, uuid: str) -> str:
        return device_name(self._cdi(), self.system, uuid)

    def cdi_spec_dirs(self) -> tuple[Path, ...]:
        return (self._cdi().spec_dir,)

    def refresh_cdi(self) -> str | None:
        if self.cdi is None:
            return "this simulated host has no directory, so no CDI spec"
        write_spec(self.cdi, self.system)
        return None


def simulated_backend(
    system: SimSystem, *, host_dir: Path | None = None, cdi_dir: Path | None = None
) -> SimBackend:
    """The production NvmlBackend, its pynvml now talking to `system` instead of the driver. With
    `host_dir` (the simulated host's own directory) it also writes a CDI spec for its GPUs, into
    `cdi_dir` (default: agents.sim.cdi.sim_cdi's choice)."""
    install(system)
    extra = {PROC_DIR_ENV: str(system.proc_dir)} if system.proc_dir is not None else {}
    # The simulated host's CUDA stack: its stand-in programs (`python -m agents.sim.fake_cuda_app`) are
    # importable by a run, whose environment carries nothing of the agent's (docs/isolation.md).
    extra["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    cdi = sim_cdi(host_dir, cdi_dir) if host_dir is not None else None
    return SimBackend(system, extra, cdi)


def from_spec_file(
    spec_path: Path, node: str | None, sim_dir: Path, *, cdi_dir: Path | None = None
) -> tuple[SimSystem, SimBackend]:
    """A simulator whose control inbox, process directory, call log and CDI device nodes live under
    `sim_dir`."""
    for sub in ("control", "procs"):
        (sim_dir / sub).mkdir(parents=True, exist_ok=True)
    # Tasks run as their tenants' uids and declare their GPU memory here (the simulated driver's view of
    # a CUDA context): each may drop its own file in, none may list or touch another's (sticky, no read).
    (sim_dir / "procs").chmod(0o1733)
    system = build_system(
        load_spec(spec_path),
        node,
        call_log_path=sim_dir / "calls.jsonl",
        control_dir=sim_dir / "control",
        proc_dir=sim_dir / "procs",
        state_path=sim_dir / "driver-state.json",
    )
    return system, simulated_backend(system, host_dir=sim_dir, cdi_dir=cdi_dir)
