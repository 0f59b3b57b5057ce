"""The online headroom of the goodput replay: idle GPU milli kept for the online services the forecast
expects in the next hour (docs/notes/goodput-design.md §6, step 3b).

The forecast is the services' own arrival history: their rate over the last `lookback_s`, times the
horizon, is the mean of a Poisson count of arrivals; the headroom is that count's `quantile` (0.9: one
hour in ten sees more arrivals than were kept for) times what one service asks. Departures are not
netted off: a service that leaves frees its own unit, which is not the headroom's job. Production sizes
its pools' reserves by the same rule (whalegen.forecast.online_reserve).
"""

from __future__ import annotations

from collections.abc import Sequence

from whalegen.forecast.online_reserve import (
    DEFAULT_HORIZON_S,
    DEFAULT_LOOKBACK_S,
    DEFAULT_QUANTILE,
    size_online_reserve,
)


def forecast_arrivals(
    arrivals_s: Sequence[float], now_s: float, lookback_s: float, horizon_s: float
) -> float:
    """Expected service arrivals in (now, now + horizon]: the rate seen in (now − lookback, now]."""
    if lookback_s <= 0 or horizon_s <= 0:
        raise ValueError("lookback_s and horizon_s must be positive")
    recent = sum(1 for t in arrivals_s if now_s - lookback_s < t <= now_s)
    return recent / lookback_s * horizon_s


def online_headroom_milli(
    arrivals_s: Sequence[float],
    now_s: float,
    service_milli: int,
    *,
    lookback_s: float = DEFAULT_LOOKBACK_S,
    horizon_s: float = DEFAULT_HORIZON_S,
    quantile: float = DEFAULT_QUANTILE,
) -> int:
    """Idle milli-GPU to keep for the services expected in the next `horizon_s`: production's sizing
    (`size_online_reserve`) over the services seen in the lookback, each asking `service_milli`."""
    seen = [service_milli for t in arrivals_s if now_s - lookback_s < t <= now_s]
    reserve = size_online_reserve(
        arrival_milli=seen,
        waiting_milli=0,
        floor_milli=0,
        quantile=quantile,
        lookback_s=lookback_s,
        horizon_s=horizon_s,
    )
    return reserve.milli
