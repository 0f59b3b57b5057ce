"""Model envelopes the control plane can version in its database, and the promotion rule.

A trained forecaster is an XGBoost booster plus the few numbers needed to rebuild its features
(configuration, feature names, per-key history tables). `dump_model` writes all of it as one UTF-8
JSON document (the booster in XGBoost's own JSON format, so any XGBoost ≥ 2 reads it back) and
`load_model` returns the parts. The plane stores the bytes with the metrics and training window.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xgboost as xgb

ENVELOPE_VERSION = 1
# XGBoost threads: the plane's worker shares a small host with the web process (at most 2).
NTHREAD = 2
# Below this many rows one thread is faster: on a busy 2-core host, 2 OpenMP threads spin waiting for
# each other longer than a small fit takes (docs/notes/forecasting-experiments.md).
SINGLE_THREAD_ROWS = 50_000


def nthread_for(n_rows: int) -> int:
    return 1 if n_rows < SINGLE_THREAD_ROWS else NTHREAD


@dataclass(frozen=True)
class Envelope:
    kind: str
    meta: dict[str, Any]
    boosters: dict[str, xgb.Booster]


def dump_model(kind: str, meta: Mapping[str, Any], boosters: Mapping[str, xgb.Booster]) -> bytes:
    doc = {
        "envelope_version": ENVELOPE_VERSION,
        "kind": kind,
        "meta": dict(meta),
        "boosters": {name: json.loads(bytes(b.save_raw("json"))) for name, b in boosters.items()},
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def load_model(blob: bytes, expected_kind: str) -> Envelope:
    doc = json.loads(blob)
    if doc.get("envelope_version") != ENVELOPE_VERSION:
        raise ValueError(f"unknown model envelope version {doc.get('envelope_version')!r}")
    if doc.get("kind") != expected_kind:
        raise ValueError(f"model is a {doc.get('kind')!r}, expected {expected_kind!r}")
    boosters = {}
    for name, raw in doc["boosters"].items():
        booster = xgb.Booster(params={"nthread": NTHREAD})
        booster.load_model(bytearray(json.dumps(raw).encode()))
        boosters[name] = booster
    return Envelope(kind=doc["kind"], meta=doc["meta"], boosters=boosters)


@dataclass(frozen=True)
class PromotionDecision:
    promote: bool
    reason: str


def should_promote(
    candidate_metrics: Mapping[str, float],
    active_metrics: Mapping[str, float] | None,
    baseline_metrics: Mapping[str, Mapping[str, float]],
    *,
    metric: str,
    lower_is_better: bool = True,
    min_gain: float = 0.0,
    limits: Mapping[str, float] | None = None,
) -> PromotionDecision:
    """Promote a candidate only if it beats every baseline and the active model on `metric`.

    All metrics must come from the same time-split validation window (reference/forecasting.md §3.5);
    the caller guarantees that. `min_gain` is a relative margin (0.01 = 1 % better) that keeps two
    models of equal skill from swapping on noise. `limits` are hard ceilings the candidate must meet
    first (memory: `{"under_rate": 0.01}`). A baseline that breaks one of those limits is not a
    rival (it could not be served either) and is skipped. A missing or NaN figure never promotes.
    """

    def better(a: float, b: float) -> bool:
        if lower_is_better:
            return a < b * (1.0 - min_gain) if b >= 0 else a < b
        return a > b * (1.0 + min_gain) if b >= 0 else a > b

    for name, ceiling in sorted((limits or {}).items()):
        got = candidate_metrics.get(name)
        if got is None or got != got or got > ceiling:
            return PromotionDecision(False, f"{name} {got} is above the limit {ceiling}")
    value = candidate_metrics.get(metric)
    if value is None or value != value:
        return PromotionDecision(False, f"candidate has no {metric}")

    def admissible(scores: Mapping[str, float]) -> bool:
        for name, ceiling in (limits or {}).items():
            got = scores.get(name)
            if got is not None and got == got and got > ceiling:
                return False
        return True

    for name, scores in sorted(baseline_metrics.items()):
        if not admissible(scores):
            continue
        base = scores.get(metric)
        if base is None or base != base:
            return PromotionDecision(False, f"baseline {name} has no {metric} on the validation window")
        if not better(value, base):
            return PromotionDecision(
                False, f"{metric} {value:.4g} does not beat baseline {name} ({base:.4g})"
            )
    if active_metrics is not None:
        active = active_metrics.get(metric)
        if active is not None and active == active and not better(value, active):
            return PromotionDecision(
                False, f"{metric} {value:.4g} does not beat the active model ({active:.4g})"
            )
    return PromotionDecision(True, f"{metric} {value:.4g} beats every baseline and the active model")
