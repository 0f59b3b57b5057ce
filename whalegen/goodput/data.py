"""Loaders for the measured speed and co-location data behind the goodput replay (traces/README.md).

Two public sources, read in place and never copied into the repository:
- Gavel (`gavel/simulation_throughputs.json.gz`, OSDI'20): training throughput of 26 job types at 1, 2, 4
  and 8 GPUs on K80, P100 and V100, alone and for pairs sharing the same GPUs.
- Lucid (`lucid-profiles/`, ASPLOS'23): 66 training configurations profiled alone on one GPU (speed,
  SM and memory-controller utilisation, memory) and 1,388 measured co-located pairs.

The folder comes from `$WHALEGEN_TRACES_DIR`, else `../shared/traces` next to the repository (the
settings' default), read when a loader is called, never at import.
"""

from __future__ import annotations

import ast
import csv
import gzip
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

GAVEL_FILE = Path("gavel") / "simulation_throughputs.json.gz"
LUCID_SINGLE_FILE = Path("lucid-profiles") / "single_data.csv"
LUCID_COLOCATE_FILE = Path("lucid-profiles") / "colocate_info.csv"

# Gavel's consolidated worker types and the catalogue model each one is. The `*_unconsolidated` workers
# (the same jobs with their GPUs spread over servers) are not loaded: a fleet node packs a job's GPUs.
# Gavel's V100s are taken as 16 GB SXM2 cards (AWS p3 instances, as we read the paper's cluster; inferred),
# its K80 worker as one GK210 die (whalegen/gpus/catalogue.py).
GAVEL_WORKER_MODELS: dict[str, str] = {"k80": "K80", "p100": "P100", "v100": "V100M16"}


class TraceFileMissing(FileNotFoundError):
    def __init__(self, path: Path) -> None:
        super().__init__(
            f"measured data file not found: {path} (set WHALEGEN_TRACES_DIR to the folder holding "
            f"gavel/ and lucid-profiles/; traces/README.md)"
        )
        self.path = path


def default_traces_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$WHALEGEN_TRACES_DIR`, else `../shared/traces` beside the repository root."""
    env = os.environ if environ is None else environ
    root = env.get("WHALEGEN_TRACES_DIR")
    if root:
        return Path(root)
    return Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise TraceFileMissing(path)
    return path


# --- Gavel ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class JobType:
    """A Gavel job type: the model with its batch size (`"ResNet-50 (batch size 64)"`) on `num_gpus` GPUs."""

    model: str
    num_gpus: int

    @property
    def family(self) -> str:
        """The model without its batch size: `ResNet-50`, `LM`, `A3C`."""
        return self.model.split(" (", 1)[0]

    def __str__(self) -> str:
        return f"{self.model} x{self.num_gpus}"


@dataclass(frozen=True)
class GavelData:
    """Gavel throughputs by catalogue model name; iterations per second, comparable within one job type.

    `solo[(model, job)]` is the job alone. `pairs[(model, a, b)]` is `(a's, b's)` throughput when the two
    share the same GPU(s); both orders are stored, swapped. Pairs Gavel marks `[0, 0]` (they do not fit
    in memory together) are in `unfit`, not in `pairs`; a job whose solo throughput is 0 (it does not fit
    on that model's memory: ResNet-50 at batch 128 on 2+ K80s) is in `solo_unfit`, not in `solo`.
    """

    solo: Mapping[tuple[str, JobType], float]
    pairs: Mapping[tuple[str, JobType, JobType], tuple[float, float]]
    unfit: frozenset[tuple[str, JobType, JobType]]
    solo_unfit: frozenset[tuple[str, JobType]]

    @property
    def gpu_models(self) -> tuple[str, ...]:
        return tuple(sorted({model for model, _ in self.solo}))

    @property
    def job_types(self) -> tuple[JobType, ...]:
        return tuple(sorted({job for _, job in self.solo}))


def _job_type(key: str) -> JobType:
    model, num_gpus = ast.literal_eval(key)  # keys are Python tuple reprs: "('LM (batch size 5)', 2)"
    return JobType(str(model), int(num_gpus))


def load_gavel(path: Path) -> GavelData:
    """Read `simulation_throughputs.json.gz` (or the plain JSON); raise TraceFileMissing if absent."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(_existing(path), "rt") as handle:
        raw = json.load(handle)
    solo: dict[tuple[str, JobType], float] = {}
    pairs: dict[tuple[str, JobType, JobType], tuple[float, float]] = {}
    unfit: set[tuple[str, JobType, JobType]] = set()
    solo_unfit: set[tuple[str, JobType]] = set()
    for worker, model in GAVEL_WORKER_MODELS.items():
        for key, entries in raw[worker].items():
            job = _job_type(key)
            alone = float(entries["null"])
            if alone <= 0.0:
                solo_unfit.add((model, job))
                continue
            solo[(model, job)] = alone
            for other_key, value in entries.items():
                if other_key == "null":
                    continue
                other = _job_type(other_key)
                mine, theirs = float(value[0]), float(value[1])
                if mine == 0.0 and theirs == 0.0:
                    unfit.add((model, job, other))
                else:
                    pairs[(model, job, other)] = (mine, theirs)
    return GavelData(solo=solo, pairs=pairs, unfit=frozenset(unfit), solo_unfit=frozenset(solo_unfit))


# --- Lucid ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class LucidConfig:
    """One profiled Lucid training configuration (one GPU, an RTX 3090 by the artifact's memory limit)."""

    model: str
    dataset: str
    batch_size: int
    amp: bool

    def __str__(self) -> str:
        return f"{self.model}/{self.dataset} bs{self.batch_size}{' amp' if self.amp else ''}"


@dataclass(frozen=True)
class LucidSolo:
    config: LucidConfig
    speed: float  # workload-specific units; compare only within one model
    gpu_util_pct: float  # SM utilisation alone
    gmem_util_pct: float  # memory-controller (bandwidth) utilisation alone, nvidia-smi utilization.memory
    gmem_mib: float
    label: int  # Lucid's hand-assigned sharing sensitivity, 0 (least) … 2 (most)


@dataclass(frozen=True)
class LucidPair:
    """Two configurations sharing one GPU; speeds are each side's throughput over its solo throughput."""

    first: LucidConfig
    second: LucidConfig
    speed_first: float
    speed_second: float
    gpu_util_pct: float
    gmem_util_pct: float
    gmem_mib: float


def _config(row: Mapping[str, str], suffix: str = "") -> LucidConfig:
    return LucidConfig(
        model=row[f"model{suffix}"],
        dataset=row[f"dataset{suffix}"],
        batch_size=int(row[f"batchsize{suffix}"]),
        amp=row[f"amp{suffix}"].strip() == "1",
    )


def load_lucid_single(path: Path) -> tuple[LucidSolo, ...]:
    with _existing(path).open(newline="") as handle:
        return tuple(
            LucidSolo(
                config=_config(row),
                speed=float(row["speed"]),
                gpu_util_pct=float(row["gpu_util"]),
                gmem_util_pct=float(row["gmem_util"]),
                gmem_mib=float(row["gmem"]),
                label=int(row["label"]),
            )
            for row in csv.DictReader(handle)
        )


def load_lucid_colocate(path: Path) -> tuple[LucidPair, ...]:
    """Read `colocate_info.csv`; its first, unnamed column is a row index and is dropped."""
    with _existing(path).open(newline="") as handle:
        reader = csv.DictReader(handle)
        pairs = []
        for row in reader:
            if int(row["gpu_num1"]) != 1 or int(row["gpu_num2"]) != 1:
                raise ValueError(f"{path}: row {row['']}: co-location rows are one GPU each")
            pairs.append(
                LucidPair(
                    first=_config(row, "1"),
                    second=_config(row, "2"),
                    speed_first=float(row["speed1"]),
                    speed_second=float(row["speed2"]),
                    gpu_util_pct=float(row["gpu_util"]),
                    gmem_util_pct=float(row["gmem_util"]),
                    gmem_mib=float(row["gmem"]),
                )
            )
    return tuple(pairs)
