"""Which validation score `/metrics` shows for an active forecast model, per the registry's metrics shapes."""

from __future__ import annotations

import pytest

from apps.metrics.collector import forecast_headline


@pytest.mark.parametrize(
    ("metrics", "want"),
    [
        pytest.param(
            {
                "metric": "log_mae",
                "models": {"xgboost_p50": {"log_mae": 0.4}, "global_median": {"log_mae": 0.9}},
            },
            [("log_mae", 0.4)],
            id="durations read the P50 candidate, not a baseline",
        ),
        pytest.param(
            {"metric": "poisson_deviance", "models": {"xgboost": {"poisson_deviance": 1.2}, "mean": {}}},
            [("poisson_deviance", 1.2)],
            id="arrivals read the xgboost candidate",
        ),
        pytest.param(
            {
                "metric": "under_rate, saved_vs_request",
                "models": {"xgboost": {"under_rate": 0.01, "saved_vs_request": 0.3, "pinball": 0.2}},
            },
            [("under_rate", 0.01), ("saved_vs_request", 0.3)],
            id="memory peaks show both metrics they are promoted on",
        ),
        pytest.param(
            {
                "metric": "mae",
                "horizons": {
                    "3600": {"models": {"xgboost": {"mae": 2.0}}},
                    "600": {"models": {"xgboost": {"mae": 1.0}}},
                },
            },
            [("mae_600s", 1.0), ("mae_3600s", 2.0)],
            id="idle GPUs show one score per horizon, shortest first",
        ),
        pytest.param(
            {"metric": "log_mae", "models": {"xgboost_p50": {"log_mae": None}}},
            [],
            id="an undefined score stored as null is left out",
        ),
        pytest.param({}, [], id="no metrics, no score"),
    ],
)
def test_the_headline_is_the_candidates_score_in_the_promotion_metric(metrics, want) -> None:
    assert forecast_headline(metrics) == want
