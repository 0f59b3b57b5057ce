"""A pool's online-service reserve sized from the forecast of its online arrivals (pure;
docs/notes/goodput-design.md §10).

The reserve is idle GPU milli a batch task may not take (`EngineConfig.online_reserve_milli`). Sized from
the pool's own history: online tasks submitted in the last `lookback_s` give a rate; times `horizon_s`
that is the mean of a Poisson count of online arrivals in the next interval, and the reserve keeps that
count's `quantile` (0.9: one interval in ten sees more arrivals than were kept for) times what one arrival
asks (the mean ask of those seen), plus what online tasks waiting now ask. The operator's static reserve
is the floor; `cap_milli` bounds the forecast (a burst of online submissions must not idle a whole pool).

The count quantile times the mean ask is the compound-Poisson quantile when every arrival asks the same,
an approximation otherwise. The replay's `+headroom` (whalegen.goodput.headroom) is the same rule with one
service size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from whalegen.gpus.catalogue import WHOLE_GPU_MILLI

DEFAULT_LOOKBACK_S = 3 * 3600.0
DEFAULT_HORIZON_S = 3600.0
DEFAULT_QUANTILE = 0.9


def poisson_quantile(mean: float, quantile: float) -> int:
    """The smallest k with P(N ≤ k) ≥ quantile for N ~ Poisson(mean)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if mean <= 0.0:
        return 0
    term = math.exp(-mean)
    total = term
    k = 0
    while total < quantile:
        k += 1
        term *= mean / k
        total += term
    return k


def gpus_text(milli: int) -> str:
    """2500 → "2.5 GPUs", 1000 → "1 GPU"."""
    gpus = milli / WHOLE_GPU_MILLI
    return f"{gpus:g} GPU" if gpus == 1 else f"{gpus:g} GPUs"


@dataclass(frozen=True)
class OnlineReserve:
    """What a pool keeps idle for online tasks, and how it was sized (for the reasons and the what-if)."""

    milli: int
    floor_milli: int
    forecast_milli: int = 0  # the forecast's ask after the cap (0: static, or nothing forecast)
    seen: int = 0  # online arrivals in the lookback window
    expected: float = 0.0  # mean online arrivals in the next horizon
    kept: int = 0  # arrivals the reserve holds room for (the Poisson quantile)
    each_milli: int = 0  # what one arrival asks (mean of those seen)
    waiting_milli: int = 0  # what online tasks pending now ask
    capped: bool = False
    quantile: float = DEFAULT_QUANTILE
    lookback_s: float = DEFAULT_LOOKBACK_S
    horizon_s: float = DEFAULT_HORIZON_S
    forecast: bool = False  # False: the static reserve alone

    def why(self) -> str:
        """One clause for a reason: "1.5 GPUs forecast for online arrivals (…)"; "" for a static reserve."""
        if not self.forecast:
            return ""
        detail = (
            f"{self.kept} at the {self.quantile:.0%} quantile of {self.expected:.2g} expected in the next "
            f"{self.horizon_s / 3600:g} h, from {self.seen} in the last {self.lookback_s / 3600:g} h, "
            f"{self.each_milli} milli-GPU each"
        )
        if self.waiting_milli:
            detail += f", plus {self.waiting_milli} milli-GPU of online tasks waiting"
        if self.capped:
            detail += ", capped"
        if self.forecast_milli >= self.floor_milli:
            floor = f"; static floor {self.floor_milli}" if self.floor_milli else ""
            return f"{gpus_text(self.milli)} forecast for online arrivals ({detail}{floor})"
        return (
            f"{gpus_text(self.milli)} static floor, above the {gpus_text(self.forecast_milli)} forecast for "
            f"online arrivals ({detail})"
        )


def size_online_reserve(
    *,
    arrival_milli: Sequence[int],
    waiting_milli: int,
    floor_milli: int,
    cap_milli: int | None = None,
    quantile: float = DEFAULT_QUANTILE,
    lookback_s: float = DEFAULT_LOOKBACK_S,
    horizon_s: float = DEFAULT_HORIZON_S,
) -> OnlineReserve:
    """The reserve for online tasks: `arrival_milli` holds what each online task submitted in the last
    `lookback_s` asks (all GPUs together), `waiting_milli` what online tasks pending now ask."""
    if lookback_s <= 0 or horizon_s <= 0:
        raise ValueError("lookback_s and horizon_s must be positive")
    seen = len(arrival_milli)
    expected = seen / lookback_s * horizon_s
    kept = poisson_quantile(expected, quantile)
    each = math.ceil(sum(arrival_milli) / seen) if seen else 0
    forecast = waiting_milli + kept * each
    capped = cap_milli is not None and forecast > cap_milli
    if cap_milli is not None:
        forecast = min(forecast, cap_milli)
    return OnlineReserve(
        milli=max(floor_milli, forecast),
        floor_milli=floor_milli,
        forecast_milli=forecast,
        seen=seen,
        expected=expected,
        kept=kept,
        each_milli=each,
        waiting_milli=waiting_milli,
        capped=capped,
        quantile=quantile,
        lookback_s=lookback_s,
        horizon_s=horizon_s,
        forecast=True,
    )
