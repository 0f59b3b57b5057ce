"""The online headroom of the goodput replay: idle GPU milli kept for the online services the forecast
expects in the next hour (docs/goodput.md §6, step 3b).

The forecast is the services' own arrival history: their rate over the last `lookback_s`, times the
horizon, is the mean of a Poisson count of arrivals; the headroom is that count's `quantile` (0.9: one
hour in ten sees more arrivals than were kept for) times what one service asks. Departures are not
netted off: a service that leaves frees its own unit, which is not the headroom's job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    """Idle milli-GPU to keep for the services expected in the next `horizon_s`."""
    expected = forecast_arrivals(arrivals_s, now_s, lookback_s, horizon_s)
    return poisson_quantile(expected, quantile) * service_milli
