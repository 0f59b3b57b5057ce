"""Pre-carving idle MIG GPUs ahead of the forecast shape mix (`decide` step 5b): the layout that serves the
forecast, never a GPU in use or one this decision uses, within the per-cycle bound, nothing without a
confident forecast, and off unless configured."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.whalegen.placement.builders import task
from tests.whalegen.scheduling.builders import Pool, mig, whole
from tests.whalegen.scheduling.strategies import pending, pools
from whalegen.placement.types import TaskRequest
from whalegen.scheduling import Config, Decisions, Snapshot, decide
from whalegen.scheduling.precarve import PrecarveConfig, ShapeForecast, unmet

SEVEN_G = ("7g.80gb", 0, False)
ON = Config(policy="whalegen", precarve=PrecarveConfig())
# Three 1g tasks (100 milli) and a 3g one (400 milli) expected in the next hour.
SMALL = ShapeForecast(expected=((1, 100, 3.0), (1, 400, 1.0)), confidence=0.8, source="arrivals model v3")


def with_forecast(snapshot: Snapshot, forecast: ShapeForecast | None = SMALL) -> Snapshot:
    return replace(snapshot, forecast=forecast)


def carved(decisions: Decisions) -> dict[tuple[str, int], str]:
    return {p.gpu: p.plan.text for p in decisions.precarves}


def test_unmet_puts_each_expected_task_on_the_smallest_free_instance_that_holds_it() -> None:
    # A 1g task fits a 1g or anything larger; the 3g task only the 3g: largest tasks first.
    assert unmet([(142, 2.0), (428, 1.0)], [142, 428]) == 1.0  # the 3g goes to the 3g task
    assert unmet([(142, 2.0), (428, 1.0)], [142, 142, 428]) == 0.0
    assert unmet([(100, 0.5)], []) == 0.5
    assert round(unmet([(100, 1.0)], [1000]), 2) == 0.9  # served on a 7g: a tenth of it used


def test_an_idle_whole_instance_gpu_is_recarved_into_the_layout_serving_the_forecast_mix() -> None:
    pool = Pool().node("m", mig(SEVEN_G), mig(SEVEN_G), mig(SEVEN_G), mig(SEVEN_G))
    decisions = decide(with_forecast(pool.snapshot()), ON, 0.0)
    assert len(decisions.precarves) == 1  # one GPU holds the three 1g and the 3g
    layout = decisions.precarves[0].plan.layout
    profiles = sorted(s.mig_profile for s in layout)
    assert profiles.count("1g.10gb") >= 3 and any(p.startswith("3g") or p.startswith("4g") for p in profiles)
    reason = decisions.precarves[0].reason
    assert reason.startswith("re-carved ahead of forecast: 3×1g.10gb")
    assert "expected in the next hour" in reason and "arrivals model v3" in reason
    assert decisions.precarves[0].plan.for_tasks == ()


def test_no_precarve_when_the_present_free_instances_already_serve_the_forecast() -> None:
    pool = Pool().node(
        "m", mig(*[("1g.10gb", s, False) for s in range(3)], ("3g.40gb", 4, False)), mig(SEVEN_G)
    )
    assert decide(with_forecast(pool.snapshot()), ON, 0.0).precarves == ()


def test_no_precarve_without_a_forecast_with_an_unsure_one_or_when_off() -> None:
    snapshot = Pool().node("m", mig(SEVEN_G), mig(SEVEN_G)).snapshot()
    assert decide(with_forecast(snapshot, None), ON, 0.0).precarves == ()
    unsure = replace(SMALL, confidence=0.3)
    assert decide(with_forecast(snapshot, unsure), ON, 0.0).precarves == ()
    unknown = replace(SMALL, confidence=None)
    assert decide(with_forecast(snapshot, unknown), ON, 0.0).precarves == ()
    assert decide(with_forecast(snapshot), Config(policy="whalegen"), 0.0).precarves == ()


def test_a_gpu_with_an_instance_in_use_is_never_recarved() -> None:
    busy = mig(("7g.80gb", 0, True))
    part = mig(("3g.40gb", 0, True), ("3g.40gb", 4, False))
    pool = Pool().node("m", busy, part)
    assert decide(with_forecast(pool.snapshot()), ON, 0.0).precarves == ()


def test_a_gpu_a_task_of_this_cycle_lands_on_is_left_alone() -> None:
    # The 1g task binds to GPU 0's 7g (the only unit); GPU 0 must not be re-carved under it.
    pool = Pool().node("m", mig(SEVEN_G))
    decisions = decide(
        with_forecast(pool.snapshot([task("t", gpus=1, milli=100, gpu_mem_mib=5_000)])), ON, 0.0
    )
    assert [b.placement.node for b in decisions.placements] == ["m"]
    assert decisions.precarves == ()


def test_at_most_max_gpus_per_cycle_most_gain_first() -> None:
    pool = Pool().node("m", *[mig(SEVEN_G) for _ in range(8)])
    many = ShapeForecast(expected=((1, 100, 40.0),), confidence=0.9)
    config = replace(ON, precarve=PrecarveConfig(max_gpus=2, keep_whole_share=0.0))
    decisions = decide(with_forecast(pool.snapshot(), many), config, 0.0)
    assert len(decisions.precarves) == 2
    # Seven 1g instances (six 1g.10gb and the 1g.20gb that fills the eighth memory slice).
    assert all(len(p.plan.layout) == 7 for p in decisions.precarves)
    assert all(p.reason.startswith("re-carved ahead of forecast: 40×1g.10gb") for p in decisions.precarves)


def test_a_share_of_one_piece_gpus_is_kept_whole() -> None:
    pool = Pool().node("m", *[mig(SEVEN_G) for _ in range(4)])
    many = ShapeForecast(expected=((1, 100, 40.0),), confidence=0.9)
    config = replace(ON, precarve=PrecarveConfig(max_gpus=10, keep_whole_share=0.5))
    decisions = decide(with_forecast(pool.snapshot(), many), config, 0.0)
    assert len(decisions.precarves) == 2  # of four 7g GPUs, two stay in one piece


def test_expected_whole_gpu_tasks_keep_the_7g_gpus_when_no_whole_gpu_is_free() -> None:
    # Two whole one-GPU tasks and one 1g task expected; two idle 7g GPUs, no free whole GPU: carving one
    # up would serve the 1g task and leave a whole task without a GPU, no gain.
    pool = Pool().node("m", mig(SEVEN_G), mig(SEVEN_G)).node("w", whole(held=True))
    mix = ShapeForecast(expected=((1, 1000, 2.0), (1, 100, 1.0)), confidence=0.9)
    config = replace(ON, precarve=PrecarveConfig(keep_whole_share=0.0))
    assert decide(with_forecast(pool.snapshot(), mix), config, 0.0).precarves == ()
    # With two free whole GPUs outside MIG the whole tasks go there, and a 7g GPU may be carved.
    freed = Pool().node("m", mig(SEVEN_G), mig(SEVEN_G)).node("w", whole(), whole())
    mix = replace(mix, expected=((1, 1000, 2.0), (1, 100, 3.0)))
    assert len(decide(with_forecast(freed.snapshot(), mix), config, 0.0).precarves) == 1


def test_the_replays_default_config_never_precarves() -> None:
    pool = Pool().node("m", mig(SEVEN_G), mig(SEVEN_G))
    assert Config().precarve is None
    assert decide(with_forecast(pool.snapshot()), Config(), 0.0).precarves == ()


@st.composite
def forecasts(draw: st.DrawFn) -> ShapeForecast:
    shapes = draw(
        st.lists(
            st.tuples(
                st.sampled_from([1, 1, 1, 2]),
                st.sampled_from([100, 142, 250, 400, 500, 1000]),
                st.floats(0.1, 20.0),
            ),
            min_size=1,
            max_size=5,
        )
    )
    return ShapeForecast(expected=tuple(shapes), confidence=draw(st.floats(0.0, 1.0)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=pools(),
    tasks=pending(),
    forecast=forecasts(),
    max_gpus=st.integers(0, 4),
    keep=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_precarve_never_changes_a_gpu_with_a_unit_in_use_or_one_this_decision_uses(
    pool: Pool, tasks: list[TaskRequest], forecast: ShapeForecast, max_gpus: int, keep: float
) -> None:
    snapshot = with_forecast(pool.snapshot(tasks), forecast)
    config = Config(policy="whalegen", precarve=PrecarveConfig(max_gpus=max_gpus, keep_whole_share=keep))
    decisions = decide(snapshot, config, 0.0)
    used = {(b.placement.node, i) for b in decisions.placements for i in b.placement.gpu_indexes}
    used |= {plan.gpu for plan in decisions.layouts}
    assert len(decisions.precarves) <= max_gpus
    assert len({p.gpu for p in decisions.precarves}) == len(decisions.precarves)
    for p in decisions.precarves:
        view = snapshot.gpu_views[p.gpu]
        assert not any(u.held for u in view.units), f"{view.name} has a unit in use"
        assert p.gpu in snapshot.idle_mig and p.gpu not in used
        assert p.plan.for_tasks == () and p.reason.startswith("re-carved ahead of forecast")
    # Pre-carving decides nothing else: the same decision without it.
    plain = decide(snapshot, Config(policy="whalegen"), 0.0)
    assert [b.task_id for b in plain.placements] == [b.task_id for b in decisions.placements]
    assert plain.layouts == decisions.layouts
