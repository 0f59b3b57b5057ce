"""The idle-GPU model per pool, from the pool's cycle records, at +10 and +60 minutes."""

from __future__ import annotations

from apps.forecasting.models import ForecastModel
from apps.forecasting.services import forecast_model_train, idle_models_from_bytes
from apps.forecasting.tasks import forecasting_train_all
from tests.apps.dashboard.idle import idle_cycles
from tests.apps.scheduling.conftest import NOW
from whalegen.forecast.series import BASELINES
from whalegen.forecast.store import should_promote


def _cycles(pool, *, days: float) -> None:
    """Cycles every 5 minutes up to NOW with a daily rhythm of idle GPUs (the dashboard tests' builder)."""
    idle_cycles(pool, now=NOW, days=days)


def test_idle_gpus_train_per_pool_for_both_horizons_and_follow_the_rule(world, api) -> None:
    _cycles(world.h100, days=6)
    outcome = forecast_model_train(kind="idle_gpus", pool=world.h100, now=NOW)
    row = outcome.model
    assert row is not None and row.scope == f"pool:{world.h100.pk}"
    assert set(row.metrics["horizons"]) == {"600", "3600"}
    expected = True
    for horizon in ("600", "3600"):
        scores = row.metrics["horizons"][horizon]["models"]
        assert set(scores) == {"xgboost", *BASELINES}
        decision = should_promote(scores["xgboost"], None, {b: scores[b] for b in BASELINES}, metric="mae")
        expected = expected and decision.promote
        assert f"+{int(horizon) // 60} min: {decision.reason}" in row.decision_reason
    assert outcome.promoted is expected and (row.state == "active") is expected
    for horizon, got in row.metrics["horizons"].items():  # the figures behind the decision
        print(horizon, {name: round(s["mae"], 3) for name, s in got["models"].items()})
    # The envelope holds one series model per horizon, loadable for serving.
    models = idle_models_from_bytes(bytes(row.blob))
    assert sorted(models) == [600, 3600] and models[3600].config.horizon_s == 3600
    shown = api(world.root).get("/api/v1/forecast-models/").json()["results"]
    assert [(r["kind"], r["pool"]) for r in shown] == [("idle_gpus", "h100-train")]


def test_a_pool_with_too_little_history_trains_nothing_and_the_reason_is_returned(world) -> None:
    _cycles(world.h100, days=1)
    results = {(r["kind"], r["version"]): r for r in forecasting_train_all.apply().get()}
    assert not ForecastModel.objects.filter(kind="idle_gpus").exists()
    reasons = [r["reason"] for r in forecasting_train_all.apply().get() if r["kind"] == "idle_gpus"]
    assert any("days of idle-GPU records for h100-train; need 3" in r for r in reasons)
    assert any("no cycle of l4-infer recorded idle GPUs" in r for r in reasons)
    assert ("memory_peak", None) in results
