"""A job type's throughput on a GPU model: measured where Gavel measured it, a fitted rule elsewhere.

This is the *rule* (the estimate `whalegen-aware` shares, through whalegen.gpus.speed); the goodput
replay's truth (whalegen.goodput.truth.TrueSpeed) is the measurement where measured and this rule times a
per-(job type, model) error drawn with the run's seed elsewhere.

The rule is `whalegen.gpus.speed` (docs/notes/goodput-design.md §2): per job type,
throughput = k × FP32 TFLOPS^a × HBM bandwidth^(1 − a), fitted on the models Gavel measured the job on;
two parameters on three measured models leave one degree of freedom, which is what the hold-one-model-out
check uses.

An unmeasured model's throughput is anchored: the newest measured card's (V100's) measurement times the
rule's ratio between the two cards, so only the shape `a` comes from the fit and the speed-up stays
between the FLOPS ratio and the bandwidth ratio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from whalegen.goodput.data import GavelData, JobType
from whalegen.gpus.catalogue import get_model
from whalegen.gpus.speed import PowerLawFit, fit_power_law, gpu_figures

# Models that are the same chip as a measured one, with more memory only: they take its measurements.
SAME_CHIP: dict[str, str] = {"V100M32": "V100M16"}


class SpeedModel:
    """Throughput (Gavel's iterations per second) of a job type on any catalogue model with figures."""

    def __init__(self, gavel: GavelData, measured_models: Iterable[str] | None = None) -> None:
        self._gavel = gavel
        self.measured_models = tuple(
            sorted(measured_models if measured_models is not None else gavel.gpu_models)
        )
        self._fits: dict[JobType, PowerLawFit] = {}
        for job in gavel.job_types:
            points = [
                (gpu_figures(m), gavel.solo[(m, job)]) for m in self.measured_models if (m, job) in gavel.solo
            ]
            if points:
                self._fits[job] = fit_power_law(points)

    @property
    def job_types(self) -> tuple[JobType, ...]:
        return tuple(sorted(self._fits))

    def fit(self, job: JobType) -> PowerLawFit:
        try:
            return self._fits[job]
        except KeyError:
            raise KeyError(f"job type {job} was never measured") from None

    def compute_exponent(self, job: JobType) -> float:
        return self.fit(job).compute_exponent

    def measured(self, job: JobType, model_name: str) -> float | None:
        """The measured throughput, 0.0 where Gavel found the job does not fit, None where not measured."""
        model = get_model(model_name).name
        model = SAME_CHIP.get(model, model)
        if model not in self.measured_models:
            return None
        if (model, job) in self._gavel.solo_unfit:
            return 0.0
        return self._gavel.solo.get((model, job))

    def throughput(self, job: JobType, model_name: str) -> float:
        """Measured where measured, else the fitted rule on the model's catalogue figures."""
        value = self.measured(job, model_name)
        if value is not None:
            return value
        anchor = self.anchor_model(job)
        return self.fit(job).from_anchor(
            gpu_figures(anchor), self._gavel.solo[(anchor, job)], gpu_figures(model_name)
        )

    def anchor_model(self, job: JobType) -> str:
        """The measured model with the most FP32 TFLOPS (the newest, V100) on which the job fits."""
        fitting = [m for m in self.measured_models if (m, job) in self._gavel.solo]
        if not fitting:
            raise KeyError(f"job type {job} was never measured")
        return max(fitting, key=lambda m: gpu_figures(m).fp32_tflops)


@dataclass(frozen=True)
class HoldoutRow:
    rule: str
    held_out_model: str
    jobs: int
    median_rel_error: float
    max_rel_error: float


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# Rules compared in the hold-out: the fitted exponent (anchored, as SpeedModel predicts; and the plain
# least-squares line), the two pure roofline ceilings, and a model-blind baseline that predicts the mean of
# the retained models' throughputs (no heterogeneity at all).
HOLDOUT_RULES: dict[str, float | None] = {"fitted a": None, "a = 1 (FLOPS)": 1.0, "a = 0 (bandwidth)": 0.0}
UNANCHORED_RULE = "fitted a, unanchored"
EQUAL_SPEED_RULE = "equal speed"


def holdout_errors(gavel: GavelData) -> list[HoldoutRow]:
    """Fit on two measured models, predict the third, for each rule; relative error |pred − meas| / meas.

    Only job types measured (and fitting) on every model take part, so each rule sees the same jobs.
    Predictions are anchored on the retained model with the most FP32 TFLOPS, as SpeedModel does.
    """
    models = gavel.gpu_models
    jobs = [j for j in gavel.job_types if all((m, j) in gavel.solo for m in models)]
    rows = []
    for rule in (*HOLDOUT_RULES, UNANCHORED_RULE, EQUAL_SPEED_RULE):
        for held in models:
            kept = [m for m in models if m != held]
            errors = []
            for job in jobs:
                points = [(gpu_figures(m), gavel.solo[(m, job)]) for m in kept]
                if rule == EQUAL_SPEED_RULE:
                    predicted = sum(t for _, t in points) / len(points)
                elif rule == UNANCHORED_RULE:
                    predicted = fit_power_law(points).throughput(gpu_figures(held))
                else:
                    anchor = max(points, key=lambda p: p[0].fp32_tflops)
                    fit = fit_power_law(points, HOLDOUT_RULES[rule])
                    predicted = fit.from_anchor(anchor[0], anchor[1], gpu_figures(held))
                truth = gavel.solo[(held, job)]
                errors.append(abs(predicted - truth) / truth)
            rows.append(HoldoutRow(rule, held, len(jobs), _median(errors), max(errors)))
    return rows
