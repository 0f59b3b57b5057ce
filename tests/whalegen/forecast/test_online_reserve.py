"""The online reserve sized from a pool's online arrivals (whalegen.forecast.online_reserve), by hand."""

from __future__ import annotations

import pytest

from whalegen.forecast.online_reserve import poisson_quantile, size_online_reserve

# Poisson(2): P(≤2) = 0.677, P(≤3) = 0.857, P(≤4) = 0.947, P(≤5) = 0.983.
# Poisson(2/3): P(≤1) = 0.856, P(≤2) = 0.970.
SIX_IN_THREE_HOURS = [500, 1000, 500, 1000, 500, 1000]  # mean ask 750 milli-GPU


def test_poisson_quantile_by_hand() -> None:
    assert [poisson_quantile(2.0, q) for q in (0.6, 0.8, 0.9, 0.94, 0.95)] == [2, 3, 4, 4, 5]
    assert poisson_quantile(2 / 3, 0.9) == 2
    assert poisson_quantile(0.0, 0.9) == 0


def test_the_reserve_keeps_the_upper_quantile_of_online_arrivals_times_their_mean_ask() -> None:
    # Six arrivals in 3 h: 2 expected in the next hour; the 90 % quantile is 4 arrivals of 750 milli each.
    reserve = size_online_reserve(arrival_milli=SIX_IN_THREE_HOURS, waiting_milli=0, floor_milli=0)
    assert (reserve.expected, reserve.kept, reserve.each_milli, reserve.milli) == (2.0, 4, 750, 3000)
    assert reserve.why() == (
        "3 GPUs forecast for online arrivals (4 at the 90% quantile of 2 expected in the next 1 h, "
        "from 6 in the last 3 h, 750 milli-GPU each)"
    )
    # A lower quantile keeps room for fewer: the 60 % quantile of Poisson(2) is 2 arrivals.
    assert (
        size_online_reserve(
            arrival_milli=SIX_IN_THREE_HOURS, waiting_milli=0, floor_milli=0, quantile=0.6
        ).milli
        == 1500
    )


def test_online_tasks_waiting_now_are_kept_for_on_top_of_the_forecast() -> None:
    reserve = size_online_reserve(arrival_milli=SIX_IN_THREE_HOURS, waiting_milli=1000, floor_milli=0)
    assert reserve.milli == 4000
    assert "plus 1000 milli-GPU of online tasks waiting" in reserve.why()


def test_two_arrivals_in_three_hours_keep_one_and_a_half_gpus() -> None:
    reserve = size_online_reserve(arrival_milli=[750, 750], waiting_milli=0, floor_milli=500)
    assert reserve.milli == 1500  # 2 arrivals (the 90 % quantile of 0.67) of 750
    assert reserve.why().startswith("1.5 GPUs forecast for online arrivals (2 at the 90% quantile of 0.67")
    assert reserve.why().endswith("; static floor 500)")


def test_the_static_reserve_is_the_floor_and_the_cap_bounds_the_forecast() -> None:
    quiet = size_online_reserve(arrival_milli=[], waiting_milli=0, floor_milli=500)
    assert (quiet.milli, quiet.forecast_milli) == (500, 0)
    assert quiet.why().startswith("0.5 GPUs static floor, above the 0 GPUs forecast for online arrivals")
    capped = size_online_reserve(
        arrival_milli=SIX_IN_THREE_HOURS, waiting_milli=0, floor_milli=0, cap_milli=2000
    )
    assert (capped.milli, capped.capped) == (2000, True)
    assert capped.why().endswith(", capped)")
    # The operator's floor wins over the cap: it is what they asked for.
    assert (
        size_online_reserve(arrival_milli=[], waiting_milli=0, floor_milli=3000, cap_milli=2000).milli == 3000
    )


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        size_online_reserve(arrival_milli=[1000], waiting_milli=0, floor_milli=0, lookback_s=0)
