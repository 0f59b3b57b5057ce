"""The policy side of a goodput replay: what a policy may read, and nothing of the truth (issue #41 item 1).

The replay's physics (whalegen.goodput.truth) reports *samples* here, as node agents report NVML
telemetry: a job's throughput and SM utilisation while it runs alone on a GPU, a service's utilisation
every step. Each job sample carries measurement noise (lognormal σ `SPEED_NOISE` on the throughput,
± `UTIL_NOISE_PCT` on the utilisation), drawn from the run's seed. Profiles are then learned from the
samples alone, as the production profile code does (apps/scheduling/profiles.py, apps/forecasting:
throughput per GPU model fitted by the speed rule's power law, mean SM utilisation; a service's P95 over
its last hour). `Telemetry` holds no
reference to the truth: `PolicySide` (the decision and its telemetry) is what the replay hands a policy.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass

from whalegen.gpus.speed import fit_power_law, gpu_figures
from whalegen.placement.types import TaskProfile
from whalegen.scheduling import Decider
from whalegen.sim.stats import nearest_rank_percentile

SPEED_NOISE = 0.05  # lognormal σ of one throughput sample
UTIL_NOISE_PCT = 3.0  # standard deviation of one SM utilisation sample, in points
SERVICE_WINDOW_S = 3600  # the service telemetry a profile is learned from


class ProfileBook:
    """Profiles learned from telemetry: per workload name, throughput alone per model and SM utilisation."""

    def __init__(self) -> None:
        self.speeds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.utils: dict[str, list[float]] = defaultdict(list)
        self._cache: dict[str, TaskProfile] = {}

    def observe(self, workload: str, model: str, throughput: float, util_pct: float) -> None:
        self.speeds[workload][model].append(throughput)
        self.utils[workload].append(util_pct)
        self._cache.pop(workload, None)
        self._cache.pop("", None)

    def profile(self, workload: str) -> TaskProfile:
        cached = self._cache.get(workload)
        if cached is not None:
            return cached
        by_model = self.speeds.get(workload, {})
        exponent: float | None = None
        if len(by_model) >= 2:
            points = [(gpu_figures(m), sum(v) / len(v)) for m, v in sorted(by_model.items())]
            exponent = fit_power_law(points).compute_exponent
        if exponent is None:
            exponent = self._prior_exponent()
        utils = self.utils.get(workload)
        util = sum(utils) / len(utils) if utils else None
        profile = TaskProfile(compute_exponent=exponent, sm_util_pct=util)
        self._cache[workload] = profile
        return profile

    def _prior_exponent(self) -> float:
        fitted = [
            fit_power_law([(gpu_figures(m), sum(v) / len(v)) for m, v in sorted(by.items())]).compute_exponent
            for by in self.speeds.values()
            if len(by) >= 2
        ]
        return sum(fitted) / len(fitted) if fitted else 0.5


class Telemetry:
    """Noisy samples in, profiles out (module docstring)."""

    def __init__(self, seed: int) -> None:
        self.book = ProfileBook()
        self._rng = random.Random(f"telemetry:{seed}")
        # Each service's samples of the last `SERVICE_WINDOW_S` (older ones are dropped as new ones come).
        self.service_samples: dict[str, deque[tuple[float, float]]] = defaultdict(deque)

    def job_sample(self, workload: str, model: str, throughput: float, util_pct: float) -> None:
        """One sample of a job running alone; a job that does not run (throughput 0) reports nothing."""
        if throughput <= 0.0:
            return
        noisy = throughput * math.exp(self._rng.gauss(0.0, SPEED_NOISE))
        util = min(100.0, max(0.0, util_pct + self._rng.gauss(0.0, UTIL_NOISE_PCT)))
        self.book.observe(workload, model, noisy, util)

    def service_sample(self, service_id: str, at_s: float, util_pct: float) -> None:
        samples = self.service_samples[service_id]
        samples.append((at_s, util_pct))
        while samples[0][0] <= at_s - SERVICE_WINDOW_S:
            samples.popleft()

    def job_profile(self, workload: str) -> TaskProfile:
        return self.book.profile(workload)

    def _recent(self, service_id: str, at_s: float) -> list[float]:
        return [u for t, u in self.service_samples.get(service_id, ()) if t > at_s - SERVICE_WINDOW_S]

    def service_profile(self, service_id: str, at_s: float, sla_min_factor: float) -> TaskProfile:
        """The P95 of its own last hour of samples. A service not seen running yet has no utilisation: the
        placement counts it as saturating a GPU. A prior pooled over the running services (the replay's
        rule before 7 Dec 2026) put a new service on a MIG slice sized for the others' load, where it then
        stayed for its life: on the older-mig fleet every SLA-violating minute (1.1–1.6 %) was one of
        those (docs/notes/goodput-runs.md, "The co-location risk")."""
        own = self._recent(service_id, at_s)
        util = nearest_rank_percentile(own, 95) if own else None
        return TaskProfile(compute_exponent=0.5, sm_util_pct=util, sla_min_factor=sla_min_factor)


@dataclass(frozen=True)
class PolicySide:
    """Everything a policy's decision reads in the replay: the production decision and the telemetry."""

    decider: Decider
    telemetry: Telemetry
