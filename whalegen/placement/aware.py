"""Policies of the goodput comparison (docs/notes/goodput-design.md §6): two baselines, and profile-aware
`whalegen-aware`.

- `volcano-binpack`: whole GPUs only (the stock device plugin), the most-allocated node first (Volcano's
  binpack plugin: GPU weighted over CPU); a multi-GPU task is one task on one node, so it is its own gang.
- `share-binpack`: HAMi-style GPU shares: the most-allocated node, and on it the most-used GPU that still
  has the share free; no interference model.
- `whalegen-aware`: the `whalegen` policy's fragmentation descent with the task's *profile*
  (`TaskRequest.profile`, learned from telemetry) in the choice:
  1. **Effective throughput.** The task's speed on each GPU model from its learned compute exponent
     `a`: `FP32_TFLOPS^a × HBM_GBps^(1−a)` (the speed rule of whalegen/gpus/speed.py), times the
     MIG slice's share where the unit is a slice. Nodes are ranked by it; fragmentation breaks ties
     (equal speed, e.g. two nodes of one model).
  2. **A service on a MIG slice.** A slice isolates an online service from its neighbours but caps it by
     its SMs: its factor is predicted as the slice's share of the GPU's compute over the service's
     observed SM utilisation (`predicted_slice_factor`, its profile's P95). A slice predicted below the
     service's SLA is avoided: a unit that keeps the SLA is taken where one has room, the slice only where
     none has, since a waiting service breaks its SLA too (`slice_sla=refuse` refuses the slice outright:
     the service then waits with that sentence as its reason; the two gave identical replays on the three
     docs fleets, seed 1: docs/notes/goodput-runs.md).
  3. **Co-location.** On a shared (MPS / time-sliced) GPU the slowdown of every task on it is predicted
     from the SM utilisations (the Lucid-fitted rule of whalegen/goodput/interference.py, summed over
     the neighbours); a GPU where a predicted factor falls below `floor` for batch work is refused. An
     online task's SLA is a floor, so it is checked against the factor 99 in 100 of the measured pairs near
     it keep (`predicted_low_factor`), not the median rule: a GPU where that falls below its SLA is
     refused. Among admissible GPUs a co-location that keeps every factor
     above the floor goes before an idle GPU of the same model (two tasks at 0.9 each do 1.8 GPUs of
     work on one), and a slower model is taken only when nothing faster has room.
  4. **Reasons.** Every choice says why (`reasons[task_id]`): "H100-80GB chosen: 3.7× this task's
     V100M16 speed (bandwidth-bound, a = 0.08)"; every refusal too (`refusals[task_id]`).
  A task without a profile is placed as `whalegen` places it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from whalegen.forecast.interference import utilisation_factor, utilisation_low_factor
from whalegen.forecast.profiles import BoundClass, BoundProfile, bound_class
from whalegen.gpus.mig import COMPUTE_SLICES, MEMORY_SLICES, MigProfile
from whalegen.gpus.speed import GpuFigures, gpu_figures
from whalegen.placement.policies import NEG_INF, Choice, Policy, ScoreCache
from whalegen.placement.state import ClusterState, Request
from whalegen.placement.types import (
    WHOLE_GPU_MILLI,
    PartitionMode,
    RunningTask,
    ShapeMix,
    SlaRefusal,
    SlaRemedy,
    TaskProfile,
    TaskRequest,
)
from whalegen.placement.whalegen_policy import OPTIONS, WhalegenPolicy

# A neighbour whose utilisation nobody measured yet counts as a busy training job.
UNKNOWN_UTIL_PCT = 100.0
DEFAULT_FLOOR = 0.9  # the lowest predicted factor a batch task is co-located at (chosen on seed 3: notes)
DEFAULT_ADVANTAGE = 0.5  # a batch task defers models slower than this × its fleet-average speed …
DEFAULT_DEFER_S = 900.0  # … for at most this long
REFERENCE_MODEL = "V100M16"  # the speed ratios in reasons and the replay's reference


class VolcanoBinpackPolicy(Policy):
    """Whole GPUs; the node that is fullest after placement (GPU counted twice, CPU once)."""

    name = "volcano-binpack"
    whole_gpus_only = True

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        gpus = len(s.gpu_free[n]) * WHOLE_GPU_MILLI
        gpu_used = (gpus - sum(s.gpu_free[n]) + req.num_gpu * WHOLE_GPU_MILLI) / gpus if gpus else 0.0
        cpu_used = (
            (s.cpu_total[n] - s.cpu_free[n] + req.cpu_milli) / s.cpu_total[n] if s.cpu_total[n] else 0.0
        )
        return float(int(100 * (2 * gpu_used + cpu_used) / 3)), self.first_devices(req, devices)


class ShareBinpackPolicy(Policy):
    """GPU shares; the fullest node after placement, and on it the most-used GPU with room (HAMi binpack)."""

    name = "share-binpack"

    def score(self, n: int, req: Request, devices: list[int]) -> Choice:
        s = self.state
        gpus = len(s.gpu_free[n]) * WHOLE_GPU_MILLI
        used = (gpus - sum(s.gpu_free[n]) + req.num_gpu * req.gpu_milli) / gpus if gpus else 0.0
        return float(int(100 * used)), self.best_fit_devices(n, req, devices)


def predicted_factor(util_pct: float, others_util_pct: float) -> float:
    """The Lucid-fitted utilisation rule with the neighbours' utilisations summed."""
    return utilisation_factor(util_pct, others_util_pct)


def predicted_low_factor(util_pct: float, others_util_pct: float) -> float:
    """The factor the measured pairs near these utilisations keep in 99 cases of 100: what an SLA is
    checked against (whalegen.forecast.interference, "co-location risk")."""
    return utilisation_low_factor(util_pct, others_util_pct)


def predicted_slice_factor(util_pct: float, compute_share: float) -> float:
    """A service's predicted throughput factor on a MIG slice with `compute_share` of the GPU's SMs, from
    its observed SM utilisation (% of a whole GPU): a slice cannot give it more SMs than it has, so a
    service that keeps 60 % of a GPU busy gets 3/7 ÷ 0.60 = 0.71 of its throughput on a 3g slice.

    Only what production observes: the unit's size (the placement binds it) and the service's telemetry.
    No interference term: a MIG slice is isolated from its neighbours."""
    if util_pct <= 0.0:
        return 1.0
    return min(1.0, 100.0 * compute_share / util_pct)


def relative_speed(figures: GpuFigures, reference: GpuFigures, exponent: float) -> float:
    """The speed rule's ratio between two models for a task of compute exponent `exponent`."""
    ratio: float = (figures.fp32_tflops / reference.fp32_tflops) ** exponent * (
        figures.mem_bandwidth_gbps / reference.mem_bandwidth_gbps
    ) ** (1 - exponent)
    return ratio


def bound_label(exponent: float) -> str:
    return bound_class(exponent).value


def reads_profiles(policy: str) -> bool:
    """Whether a cycle under `policy` reads task profiles (the snapshot then loads them)."""
    return policy.split(":", 1)[0] == AwarePolicy.name


def task_profile(bound: BoundProfile) -> TaskProfile | None:
    """What the placement reads of a profile key's telemetry; None when the key is not classified."""
    if bound.bound is BoundClass.UNKNOWN or bound.compute_exponent is None:
        return None
    return TaskProfile(compute_exponent=bound.compute_exponent, sm_util_pct=bound.sm_util_pct)


@dataclass(frozen=True)
class _Option:
    speed: float  # the unit's speed over the reference model's, alone
    value: float  # effective speed: with the predicted co-location factor
    colocated: bool  # shares a GPU with admissible neighbours
    frag: float  # the fragmentation score (tie-break)
    node: int
    devices: tuple[int, ...]
    why: str
    isolated: bool = False  # a MIG instance
    below_sla: bool = False  # a MIG slice predicted below the online task's SLA (taken only as a last resort)


class AwarePolicy(WhalegenPolicy):
    name = "whalegen-aware"
    task_aware = True

    def __init__(self, **options: str) -> None:
        floor = options.pop("floor", str(DEFAULT_FLOOR))
        advantage = options.pop("advantage", str(DEFAULT_ADVANTAGE))
        defer = options.pop("defer_s", str(DEFAULT_DEFER_S))
        # `preempt_deferred=1` restores the first version, where a deferred task proposed victims.
        preempt_deferred = options.pop("preempt_deferred", "0")
        # What a slice predicted below a service's SLA gets: `avoid` (the default) takes it only where no
        # other unit has room, `refuse` never takes it (the service waits, with the reason).
        slice_sla = options.pop("slice_sla", "avoid")
        super().__init__(**{k: v for k, v in options.items() if k in OPTIONS})
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise ValueError(
                "whalegen-aware options are floor, advantage, defer_s, preempt_deferred, slice_sla and "
                f"{', '.join(OPTIONS)}, got {sorted(unknown)}"
            )
        self.floor = float(floor)
        self.advantage = float(advantage)
        self.defer_s = float(defer)
        self.preempt_deferred = preempt_deferred not in ("0", "false", "no")
        if slice_sla not in ("avoid", "refuse"):
            raise ValueError(f"whalegen-aware slice_sla is avoid or refuse, got {slice_sla!r}")
        self.refuse_slices = slice_sla == "refuse"
        self.now_s = 0.0
        self._fleet_mean: dict[float, float] = {}
        self.task: TaskRequest | None = None
        self.profiles: dict[str, TaskProfile] = {}  # every task seen, for its later neighbours
        self.reasons: dict[str, str] = {}
        self.refusals: dict[str, str] = {}
        # Task id → the SLA refusal of its last `select` (the engine's `Outcome.SLA_REFUSED`).
        self.sla_refused: dict[str, SlaRefusal] = {}
        self._remedies: list[SlaRemedy] = []
        self._sla_hit = False
        # Task id → (the step's clock, why, the models it would take) for a task this policy deferred while
        # units had room: a wait by choice, not a shortage, so the decision drops preemptions for it on the
        # models it declines (a victim there would free a unit it declines again; whalegen.scheduling).
        self.deferred: dict[str, tuple[float, str, frozenset[str]]] = {}
        self._occupants: dict[tuple[int, int], list[str]] = {}
        self._occupants_at = -1

    def attach(self, state: ClusterState, mix: ShapeMix, rng: random.Random) -> None:
        super().attach(state, mix, rng)
        self.reference = gpu_figures(REFERENCE_MODEL)
        self.figures: dict[str, GpuFigures | None] = {}
        for model in {m for m in state.models if m is not None}:
            try:
                self.figures[model] = gpu_figures(model)
            except ValueError:
                self.figures[model] = None

    def begin_task(self, task: TaskRequest, now_s: float) -> None:
        self.task = task
        self.now_s = now_s
        self.deferred.pop(task.task_id, None)
        self.sla_refused.pop(task.task_id, None)
        if task.profile is not None:
            self.profiles[task.task_id] = task.profile

    def know_running(self, task: RunningTask) -> None:
        if task.profile is not None:
            self.profiles[task.task_id] = task.profile

    def sla_refusal(self, task_id: str) -> SlaRefusal | None:
        return self.sla_refused.get(task_id)

    # -- the choice --------------------------------------------------------------------------------

    def select(self, req: Request, scores: Callable[[], ScoreCache]) -> tuple[int, tuple[int, ...]] | None:
        task = self.task
        profile = task.profile if task is not None else None
        if task is None or profile is None or req.num_gpu == 0 or profile.compute_exponent is None:
            return super().select(req, scores)
        cache = scores()
        frags = {n: float(cache.scores[n]) for n in np.flatnonzero(cache.scores > NEG_INF).tolist()}
        if req.is_share:
            # The fragmentation scores offer a share only a node's first fresh GPU (partly used ones go
            # through the gap index): a node whose every GPU is partly used is a co-location to weigh too.
            lowest = min(frags.values(), default=0.0)
            for gap, codes in self.gaps.items():
                if gap >= req.gpu_milli:
                    for code in codes:
                        frags.setdefault(code // self.width, lowest)
        feasible = sorted(frags)
        if not feasible:
            return None
        options: list[_Option] = []
        refused: list[str] = []
        self._remedies = []
        self._sla_hit = False
        for n in feasible:
            frag = frags[n]
            if req.is_share:
                for d in self.state.eligible_devices(n, req) or []:
                    option = self._share_option(n, d, req, task.task_id, profile, frag, refused)
                    if option is not None:
                        options.append(option)
            else:
                speed = self._speed(n, profile)
                if speed is not None:
                    options.append(_Option(speed, speed, False, frag, n, cache.devices_of(n), ""))
        considered = options
        if not options and self._sla_hit:
            # Every unit with room was refused, some for an online task's SLA: a choice the engine must
            # not answer with victims by resources (they would free a unit refused again).
            self.sla_refused[task.task_id] = SlaRefusal(
                "; ".join(refused[:3]),
                tuple(self._remedies),
                frozenset(self.state.names[n] for n in feasible),
            )
        if profile.sla_min_factor is None and options and self.now_s - task.submitted_at_s < self.defer_s:
            # Comparative advantage: a model on which this task runs at less than `advantage` × its
            # fleet-average speed is left to tasks that run well there, until it has waited `defer_s`.
            mean = self._mean_speed(profile)
            kept = [o for o in options if o.speed >= self.advantage * mean]
            if not kept:
                best_slow = max(options, key=lambda o: o.speed)
                why = (
                    f"deferred: the best unit with room ({self.state.models[best_slow.node]}) runs it at "
                    f"{best_slow.speed / mean:.2f}× its fleet-average speed, below {self.advantage:g}×; it "
                    f"takes it after {self.defer_s:g} s of waiting"
                )
                refused.append(why)
                if not self.preempt_deferred:
                    self.deferred[task.task_id] = (self.now_s, why, self._accepted_models(profile, mean))
            options = kept
        if not options:
            self.refusals[task.task_id] = "; ".join(refused[:3]) or "no GPU model with known figures has room"
            return None
        if profile.sla_min_factor is not None:
            # A slice predicted below the SLA only where nothing else has room (waiting breaks it too).
            options = [o for o in options if not o.below_sla] or options
            # An online service: a MIG instance first (isolated: no neighbour can break its SLA), then
            # the slowest model (the fast ones are worth more to batch work); it needs no speed.
            best = max(
                options, key=lambda o: (o.isolated, -round(o.speed, 6), not o.colocated, o.frag, -o.node)
            )
        else:
            # The fastest unit first; on it an admissible co-location before an idle GPU (it keeps the idle
            # one for the next task), the least slowed co-location first; fragmentation breaks ties.
            best = max(
                options, key=lambda o: (round(o.speed, 6), o.colocated, round(o.value, 6), o.frag, -o.node)
            )
        self.reasons[task.task_id] = self._reason(best, considered, profile)
        self.refusals.pop(task.task_id, None)
        return best.node, best.devices

    def _speed(
        self, n: int, profile: TaskProfile, slice_fraction: tuple[float, float] = (1.0, 1.0)
    ) -> float | None:
        model = self.state.models[n]
        figures = self.figures.get(model) if model is not None else None
        if figures is None or profile.compute_exponent is None:
            return None
        a = profile.compute_exponent
        compute, bandwidth = slice_fraction
        speed: float = relative_speed(figures, self.reference, a) * compute**a * bandwidth ** (1 - a)
        return speed

    def _accepted_models(self, profile: TaskProfile, mean: float) -> frozenset[str]:
        """The pool's models on which the task runs at `advantage` × its fleet-average speed or more."""
        a = profile.compute_exponent if profile.compute_exponent is not None else 0.5
        return frozenset(
            model
            for model, figures in self.figures.items()
            if figures is not None and relative_speed(figures, self.reference, a) >= self.advantage * mean
        )

    def _mean_speed(self, profile: TaskProfile) -> float:
        """The task's speed averaged over every GPU of the pool (over the reference model's)."""
        a = profile.compute_exponent if profile.compute_exponent is not None else 0.5
        key = round(a, 3)
        mean = self._fleet_mean.get(key)
        if mean is None:
            total = weight = 0.0
            for n in range(len(self.state)):
                speed = self._speed(n, profile)
                if speed is not None:
                    total += speed * self.state.gpu_count[n]
                    weight += self.state.gpu_count[n]
            mean = total / weight if weight else 1.0
            self._fleet_mean[key] = mean
        return mean

    def _share_option(
        self,
        n: int,
        d: int,
        req: Request,
        task_id: str,
        profile: TaskProfile,
        frag: float,
        refused: list[str],
    ) -> _Option | None:
        s = self.state
        mode = s.modes[n][d]
        if mode is PartitionMode.MIG:
            return self._mig_option(n, d, req, task_id, profile, frag, refused)
        speed = self._speed(n, profile)
        if speed is None:
            return None
        if mode is not PartitionMode.SHARED:
            return _Option(speed, speed, False, frag, n, (d,), "")
        neighbours = self._on(n, d)
        if not neighbours:
            return _Option(speed, speed, False, frag, n, (d,), "")
        members = [(task_id, profile)] + [(t, self.profiles.get(t, TaskProfile())) for t in neighbours]
        utils = [p.sm_util_pct if p.sm_util_pct is not None else UNKNOWN_UTIL_PCT for _, p in members]
        total = sum(utils)
        factors = []
        for (member, p), u in zip(members, utils, strict=True):
            f = predicted_factor(u, total - u)
            checked = self._checked_factor(p, u, total - u)
            limit = p.sla_min_factor if p.sla_min_factor is not None else self.floor
            if checked < limit:
                what = (
                    f"{member}'s SLA {limit:.2f}"
                    if p.sla_min_factor is not None
                    else f"the floor {limit:.2f}"
                )
                told = (
                    f"{checked:.2f}× in 99 of 100 measured pairs"
                    if p.sla_min_factor is not None
                    else f"{f:.2f}×"
                )
                why = f"sharing it predicts {told} for {member}, below {what}"
                refused.append(f"{s.names[n]} GPU {s.gpu_index[n][d]} refused: {why}")
                if p.sla_min_factor is not None:
                    self._sla_hit = True
                    self._remedy(n, d, members, why)
                return None
            factors.append((member, f))
        shown = ", ".join(f"{m} {f:.2f}×" for m, f in factors[1:])
        return _Option(
            speed,
            speed * factors[0][1],
            True,
            frag,
            n,
            (d,),
            f"shares GPU {s.gpu_index[n][d]}: predicted {factors[0][1]:.2f}× for it, {shown}",
        )

    @staticmethod
    def _checked_factor(profile: TaskProfile, util_pct: float, others_util_pct: float) -> float:
        """The factor a co-location is admitted on: for an online service the low quantile of the measured
        pairs near it (an SLA is a floor, and the median rule hides the pairs' spread), for batch work the
        median rule against the floor."""
        if profile.sla_min_factor is not None:
            return predicted_low_factor(util_pct, others_util_pct)
        return predicted_factor(util_pct, others_util_pct)

    def _mig_option(
        self,
        n: int,
        d: int,
        req: Request,
        task_id: str,
        profile: TaskProfile,
        frag: float,
        refused: list[str],
    ) -> _Option | None:
        """The MIG instance device d would give the task. For an online service whose observed utilisation
        predicts a factor below its SLA on that slice: marked `below_sla` (taken only where no other unit
        has room), or under `slice_sla=refuse` refused, with the reason in `refused`."""
        s = self.state
        mig = self._mig_unit(n, d, req)
        if mig is None:
            return None
        share = mig.compute_slices / COMPUTE_SLICES
        why = f"MIG {mig.name}"
        below_sla = False
        sla = profile.sla_min_factor
        if sla is not None:
            util = profile.sm_util_pct if profile.sm_util_pct is not None else UNKNOWN_UTIL_PCT
            f = predicted_slice_factor(util, share)
            below = (
                f"a MIG {mig.name} gives {100 * share:.0f} % of the GPU's SMs and {task_id} is observed at "
                f"{util:.0f} %: predicted {f:.2f}×, below its SLA {sla:.2f}"
            )
            below_sla = f < sla
            if below_sla and self.refuse_slices:
                refused.append(f"{s.names[n]} GPU {s.gpu_index[n][d]} refused: {below}")
                self._sla_hit = True
                return None
            why = (
                f"{below}; no unit that keeps its SLA has room"
                if below_sla
                else f"MIG {mig.name}: predicted {f:.2f}× at its observed {util:.0f} % SM utilisation"
            )
        speed = self._speed(n, profile, (share, mig.memory_slices / MEMORY_SLICES))
        return None if speed is None else _Option(speed, speed, False, frag, n, (d,), why, True, below_sla)

    def _mig_unit(self, n: int, d: int, req: Request) -> MigProfile | None:
        """The MIG instance the task would be bound to on device d, as the state binds it (the smallest free
        carved instance that covers it): the slice judged is the slice bound, not the smallest profile
        that would cover the request (a 500-milli service on a GPU carved 4g + 3g gets the 4g)."""
        found = self.state._mig_unit(n, d, req)
        return None if found is None else found[0]

    def _remedy(self, n: int, d: int, members: list[tuple[str, TaskProfile]], why: str) -> None:
        """Note the GPU's batch neighbours as a remedy when the co-location is admissible without them
        (the task first in `members`; online neighbours stay: they are never preempted for another).
        Only for an online task: displacing batch work for batch work only moves the wait."""
        batch = tuple(t for t, p in members[1:] if p.sla_min_factor is None)
        if members[0][1].sla_min_factor is None or not batch:
            return
        kept = [members[0]] + [(t, p) for t, p in members[1:] if p.sla_min_factor is not None]
        utils = [p.sm_util_pct if p.sm_util_pct is not None else UNKNOWN_UTIL_PCT for _, p in kept]
        total = sum(utils)
        for (_, p), u in zip(kept, utils, strict=True):
            limit = p.sla_min_factor if p.sla_min_factor is not None else self.floor
            if len(kept) > 1 and self._checked_factor(p, u, total - u) < limit:
                return
        s = self.state
        self._remedies.append(SlaRemedy(s.names[n], s.gpu_index[n][d], batch, why))

    def _on(self, n: int, d: int) -> list[str]:
        """Tasks bound on device position d of node n (rebuilt when the working copy changed)."""
        s = self.state
        if self._occupants_at != s.changes:
            occupants: dict[tuple[int, int], list[str]] = {}
            for task_id, binding in s.bindings.items():
                for position, milli in zip(binding.gpu_indexes, binding.held_milli, strict=True):
                    if milli:
                        occupants.setdefault((binding.node, position), []).append(task_id)
            self._occupants = occupants
            self._occupants_at = s.changes
        return sorted(self._occupants.get((n, d), []))

    def _reason(self, best: _Option, options: list[_Option], profile: TaskProfile) -> str:
        s = self.state
        model = s.models[best.node] or "?"
        if profile.sla_min_factor is not None:
            where = (
                "a MIG instance (isolated: no neighbour can break its SLA)"
                if best.isolated
                else ("the slowest model with room (the fast ones are worth more to batch work)")
            )
            return f"{model} chosen for an online task: {where}" + (f"; {best.why}" if best.why else "")
        a = profile.compute_exponent if profile.compute_exponent is not None else 0.5
        label = f"{bound_label(a)}, a = {a:.2f}"
        others = [o for o in options if (s.models[o.node] or "?") != model]
        if others:
            runner = max(others, key=lambda o: o.value)
            other_model = s.models[runner.node] or "?"
            ratio = best.value / runner.value if runner.value > 0 else math.inf
            head = f"{model} chosen: {ratio:.1f}× this task's {other_model} speed ({label})"
        else:
            head = f"{model} chosen: the only model with room ({label})"
        return f"{head}; {best.why}" if best.why else head


GOODPUT_POLICIES: dict[str, Callable[[], Policy]] = {
    "volcano-binpack": VolcanoBinpackPolicy,
    "share-binpack": ShareBinpackPolicy,
}
