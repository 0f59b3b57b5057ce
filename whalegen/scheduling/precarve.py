"""Re-carving idle MIG GPUs ahead of the forecast shape mix (`decide`'s step 5b), pure.

A task that no present unit holds waits for a last-resort re-carve (step 5): one cycle, then the agent's
apply time. Pre-carving does that work before the task arrives: when the arrivals forecast expects MIG
tasks of shapes the pool's free instances cannot hold, an idle MIG GPU whose layout serves the expected
shapes worse than another valid layout of its model is given that layout now.

The measure is *expected tasks not served* over the forecast horizon (`unmet`), in tasks' worth: the
expected one-GPU arrivals (whole ones too, a 7g instance holds them) matched against the free MIG
instances of the pool, each task on the smallest free instance with at least its compute share, largest
tasks first; a task on a larger instance than its share counts as served by that share only (a 1g task
on a 7g instance strands six slices of the GPU until it ends).
Whole one-GPU tasks are first given the pool's free whole GPUs outside MIG mode, as step 3 does.

Rules (docs/scheduling.md §3b):
- only idle MIG GPUs the snapshot offers for re-carving (`IdleMigGpu`: healthy, no unit held, no process
  stopping, not promised), that no placement, preemption or re-carve of this cycle touches; the layout
  goes through `plan_repartition`, which refuses a GPU with a unit in use;
- only with a forecast at least `min_confidence` sure (1 − its held-out shape-mix distance); none without;
- a GPU changes only if that serves at least `min_gain_tasks` more expected tasks; at most `max_gpus`
  GPUs per cycle, greedily by gain;
- at least `keep_whole_share` of the idle MIG GPUs that are one 7-slice instance stay so, for whole-GPU
  work the forecast did not see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from whalegen.gpus.mig import MigProfile, mig_profiles
from whalegen.gpus.mig_plan import complete_layouts
from whalegen.placement.recarve import IdleMigGpu
from whalegen.placement.repartition import GpuView, RepartitionPlan, WantedInstance, plan_repartition
from whalegen.placement.state import mig_profile_for
from whalegen.placement.types import WHOLE_GPU_MILLI

GpuKey = tuple[str, int]  # (engine node name, GPU index)


@dataclass(frozen=True)
class ShapeForecast:
    """Expected arrivals per task shape over the next `horizon_s` (the pool's arrivals model)."""

    expected: tuple[tuple[int, int, float], ...]  # (GPUs per task, milli per GPU, expected arrivals)
    horizon_s: float = 3600.0
    # How far to trust the mix: 1 − the model's held-out total-variation distance between the forecast and
    # the actual shape mix of an hour. None: unknown (no pre-carve).
    confidence: float | None = None
    source: str = ""  # for reasons, e.g. "arrivals model v3"


@dataclass(frozen=True)
class PrecarveConfig:
    max_gpus: int = 2  # GPUs re-carved ahead of the forecast per cycle
    min_gain_tasks: float = 1.0  # expected tasks a re-carve must serve beyond the present layout
    min_confidence: float = 0.5
    keep_whole_share: float = 0.25  # of the idle MIG GPUs in one 7-slice instance, kept so (rounded down)


@dataclass(frozen=True)
class Precarve:
    """An idle MIG GPU given a new layout for no task yet, and why."""

    gpu: GpuKey
    plan: RepartitionPlan  # `for_tasks` is empty
    reason: str


@dataclass(frozen=True)
class _Option:
    gain: float
    key: GpuKey
    profiles: tuple[MigProfile, ...]


@cache
def _layouts(model: str) -> tuple[tuple[MigProfile, ...], ...]:
    """Every complete layout of the model (the 17 of the reference table on A100/H100/H200)."""
    by_id = {p.profile_id: p for p in mig_profiles(model)}
    return tuple(tuple(by_id[i] for i in layout) for layout in complete_layouts(tuple(by_id.values())))


def unmet(demand: Iterable[tuple[int, float]], supply: Iterable[int]) -> float:
    """Expected tasks (milli, count) not served by the free instances (milli each), in tasks' worth: each
    task goes on the smallest free instance that holds it, largest tasks first, and counts as served by
    its share of the instance (a 1g task on a 7g instance is a seventh served: the rest of the GPU is
    stranded until it ends)."""
    # Fluid: an expectation of 0.4 tasks takes 0.4 of an instance (the rest holds other expected tasks).
    left: dict[int, float] = {size: float(n) for size, n in Counter(supply).items()}
    sizes = sorted(left)
    short = 0.0
    for milli, count in sorted(demand, reverse=True):
        need = count
        for size in sizes:
            if need <= 0:
                break
            if size < milli or left[size] <= 0:
                continue
            take = min(need, left[size])
            left[size] -= take
            need -= take
            short += take * (1 - min(milli / size, 1.0))
        short += max(need, 0.0)
    return short


def _one_piece(instances: Sequence[int]) -> bool:
    return len(instances) == 1 and instances[0] >= WHOLE_GPU_MILLI


def _count(value: float) -> str:
    return f"{value:.0f}" if value >= 1 else f"{value:.1f}"


def precarve(
    *,
    idle: Mapping[GpuKey, IdleMigGpu],
    views: Mapping[GpuKey, GpuView],
    touched: set[GpuKey],
    free_mig_milli: Sequence[int],
    free_whole_gpus: int,
    forecast: ShapeForecast | None,
    config: PrecarveConfig,
) -> tuple[Precarve, ...]:
    """The idle MIG GPUs to re-carve now for the forecast, at most `config.max_gpus` (see the module).

    `free_mig_milli`: the compute share of every free MIG instance left after this cycle's placements on
    GPUs *not* in `idle`; `free_whole_gpus`: free whole GPUs outside MIG mode left after them.
    """
    # 1. A forecast to act on.
    if forecast is None or forecast.confidence is None or forecast.confidence < config.min_confidence:
        return ()
    if config.max_gpus <= 0:
        return ()
    demand: dict[int, float] = {}
    for num_gpu, milli, count in forecast.expected:
        if num_gpu == 1 and 0 < milli <= WHOLE_GPU_MILLI and count > 0:
            demand[milli] = demand.get(milli, 0.0) + count
    if WHOLE_GPU_MILLI in demand:
        demand[WHOLE_GPU_MILLI] = max(demand[WHOLE_GPU_MILLI] - free_whole_gpus, 0.0)
    demand = {m: c for m, c in demand.items() if c > 0}
    if not demand or not any(m < WHOLE_GPU_MILLI for m in demand):
        return ()  # nothing a smaller instance would serve better than the layouts there are
    # 2. The GPUs that may change, and what each holds now.
    candidates = {
        key: tuple(i.gpu_milli for i in gpu.instances)
        for key, gpu in sorted(idle.items())
        if key not in touched and key in views and mig_profiles(views[key].model)
    }
    if not candidates:
        return ()
    one_piece = sum(1 for held in candidates.values() if _one_piece(held))
    keep_one_piece = int(config.keep_whole_share * one_piece)
    supply = {key: list(held) for key, held in candidates.items()}
    fixed = list(free_mig_milli)
    items = list(demand.items())

    def total() -> list[int]:
        return fixed + [m for held in supply.values() for m in held]

    # 3. Greedily, the re-carve that serves the most expected tasks, until none gains enough.
    out: list[Precarve] = []
    done: set[GpuKey] = set()
    while len(out) < config.max_gpus:
        base = unmet(items, total())
        best: _Option | None = None
        seen: set[tuple[str, tuple[int, ...]]] = set()
        for key, held in supply.items():
            if key in done:
                continue
            model = views[key].model
            shape = (model, tuple(sorted(held)))
            if shape in seen:
                continue  # a GPU alike another one already weighed gains the same
            seen.add(shape)
            others = [m for k, ms in supply.items() if k != key for m in ms] + fixed
            for layout in _layouts(model):
                new = [p.gpu_milli for p in layout]
                if sorted(new) == sorted(held):
                    continue
                if _one_piece(held) and not _one_piece(new) and one_piece <= keep_one_piece:
                    continue
                gain = base - unmet(items, others + new)
                if gain < config.min_gain_tasks - 1e-9:
                    continue
                # More gain first; then fewer, larger instances (they hold more shapes later).
                if best is None or (gain, -len(layout)) > (best.gain + 1e-9, -len(best.profiles)):
                    best = _Option(gain, key, layout)
        if best is None:
            break
        view = views[best.key]
        plan = plan_repartition(
            view, [WantedInstance(f"ahead-{n}", p.name) for n, p in enumerate(best.profiles)]
        )
        done.add(best.key)
        if not isinstance(plan, RepartitionPlan):
            continue  # the planner refuses it (it says why to a task; here no task asked): leave it
        before = supply[best.key]
        if _one_piece(before):
            one_piece -= 1
        supply[best.key] = [p.gpu_milli for p in best.profiles]
        out.append(
            Precarve(
                best.key,
                RepartitionPlan(plan.layout, ()),
                _reason(view, before, plan, demand, forecast, best.gain),
            )
        )
    return tuple(out)


def _reason(
    view: GpuView,
    before: Sequence[int],
    plan: RepartitionPlan,
    demand: Mapping[int, float],
    forecast: ShapeForecast,
    gain: float,
) -> str:
    """ "re-carved ahead of forecast: 3×1g.18gb expected in the next hour (…)": the expected shapes the
    new layout has instances for, by the profile each would get on this model."""
    carved = {slot.mig_profile for slot in plan.layout}
    expected: dict[str, float] = {}
    for milli, count in sorted(demand.items()):
        profile = mig_profile_for(view.model, milli, 0)
        if profile is not None and profile.name in carved:
            expected[profile.name] = expected.get(profile.name, 0.0) + count
    shapes = ", ".join(
        f"{_count(n)}×{name}" for name, n in sorted(expected.items(), key=lambda item: (-item[1], item[0]))
    )
    hours = forecast.horizon_s / 3600
    horizon = "the next hour" if hours == 1 else f"the next {hours:g} h"
    source = f", {forecast.source}" if forecast.source else ""
    old = "+".join(_profile_names(view)) or f"{len(before)} instances"
    return (
        f"re-carved ahead of forecast: {shapes or 'MIG tasks'} expected in {horizon}{source}; "
        f"{view.name} {old} -> {plan.text} serves {gain:.1f} more of them (in tasks' worth)"
    )[:500]


def _profile_names(view: GpuView) -> list[str]:
    return [u.mig_profile for u in sorted(view.units, key=lambda u: u.mig_start or 0) if u.mig_profile]


__all__ = ["Precarve", "PrecarveConfig", "ShapeForecast", "precarve", "unmet"]
