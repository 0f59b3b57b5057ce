"""Cycle history with a daily rhythm of idle GPUs, and the pool's idle-GPU model trained on it by the
plane's own training step (`forecast_model_train`), stored active for the chart to use."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np

from apps.scheduling.models import Cycle


def idle_cycles(pool: Any, *, now: datetime, days: float, every_s: int = 300, seed: int = 5) -> None:
    """Cycles every 5 minutes up to `now`: idle GPUs ≈14 at night, ≈2 by day, with some noise, as the
    cycle records them before placing anything (`stats.fragmentation_before.idle_milli`)."""
    rng = np.random.default_rng(seed)
    n = int(days * 86_400 / every_s)
    rows = []
    for i in range(n):
        at = now - timedelta(seconds=(n - i) * every_s)
        hour = at.hour + at.minute / 60.0
        idle = 8.0 + 6.0 * np.cos(2 * np.pi * (hour - 3.0) / 24.0) + rng.normal(0, 0.7)
        milli = int(max(0.0, round(idle, 1)) * 1000)
        before = {"idle_milli": milli, "frag_milli": 0.0, "amount_pct": 0.0}
        rows.append(Cycle(pool=pool, policy="whalegen", started_at=at, finished_at=at,
                          stats={"fragmentation_before": before}))  # fmt: skip
    Cycle.objects.bulk_create(rows, batch_size=2_000)


def trained_idle_model(pool: Any, *, now: datetime) -> Any:
    """The plane's idle-GPU training on four days of cycles, the candidate stored as the active model
    (promotion against the baselines is the training tests' concern, not the chart's)."""
    from apps.forecasting.models import ForecastModel
    from apps.forecasting.services import forecast_model_train

    idle_cycles(pool, now=now, days=4)
    outcome = forecast_model_train(kind=ForecastModel.Kind.IDLE_GPUS, pool=pool, now=now)
    assert outcome.model is not None, outcome.reason
    ForecastModel.objects.filter(pk=outcome.model.pk).update(state=ForecastModel.State.ACTIVE)
    return outcome.model
