"""Full-trace forecaster evaluations against their baselines, measured in one run.

    /work/venv/bin/python benchmarks/forecast.py [--traces DIR] [--out out/forecast] [--quick]

Prints one line per evaluation with the model's headline metric, the best baseline's, and their ratio,
writes every evaluation's JSON and draws the figures people look at (PNG, Agg backend). `--quick`
skips the minute-level Helios runs (the slowest, about a minute each on two cores).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from whalegen.forecast.arrivals import ArrivalConfig, evaluate_arrivals, shape_labels
from whalegen.forecast.durations import DurationConfig, evaluate_durations
from whalegen.forecast.memory import MemoryConfig, evaluate_memory
from whalegen.forecast.series import (
    Aggregation,
    SeriesConfig,
    bin_series,
    build_rows,
    evaluate_series,
    predict_rows,
)

OPENB_SHAPE = ["cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos"]


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _helios(traces: Path, bin_s: int) -> dict[str, pd.Series]:
    out = {}
    for path in sorted(glob.glob(str(traces / "helios-earth" / "vc*_cluster_sequence_vc.csv.gz"))):
        frame = pd.read_csv(path)
        out[Path(path).name.split("_")[0]] = bin_series(
            frame["time"], frame["idle_gpu_num"], bin_s, Aggregation.MAX
        )
    return out


def _philly(traces: Path) -> dict[str, pd.Series]:
    frame = pd.read_csv(traces / "philly" / "philly_node_sequence.csv")
    active = frame["active"].mask(frame["active"] == 0)  # outage minutes (traces/README.md §5)
    return {"philly": bin_series(frame["time"], active, 600, Aggregation.MAX)}


def _line(name: str, model: float, base_name: str, base: float, unit: str, lower: bool = True) -> str:
    ratio = model / base if base else float("nan")
    better = (model < base) if lower else (model > base)
    return (
        f"{name:<44} model {model:10.5g}  {base_name:<20} {base:10.5g}  ratio {ratio:7.4f}  "
        f"{'better' if better else 'NOT better'} ({unit})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--traces", type=Path, default=Path(os.environ.get("WHALEGEN_TRACES_DIR", "/work/shared/traces"))
    )
    parser.add_argument("--out", type=Path, default=Path("out/forecast"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    docs: dict[str, Any] = {}

    # 1. Series: Helios Earth idle GPUs (16 VCs pooled; last week is the test) and Philly active nodes.
    series_runs = [("philly active nodes, 10-min max", _philly(args.traces), 600, "2017-12-01", "2017-12-15")]
    series_runs.append(("helios idle GPUs, 10-min max", _helios(args.traces, 600), 600, "2020-05-25", None))
    if not args.quick:
        series_runs.append(("helios idle GPUs, per minute", _helios(args.traces, 60), 60, "2020-05-25", None))
    for title, series, bin_s, split, until in series_runs:
        for horizon_s in (600, 1_800, 3_600):
            _log(f"{title}, +{horizon_s // 60} min")
            cfg = SeriesConfig(horizon_s=horizon_s, bin_s=bin_s)
            model, ev = evaluate_series(
                series, cfg, pd.Timestamp(split), None if until is None else pd.Timestamp(until)
            )
            key = f"{title} +{horizon_s // 60}min"
            docs[key] = ev.to_json()
            m = ev.models
            lines.append(_line(key, m["xgboost"]["mae"], "persistence", m["persistence"]["mae"], "MAE"))
            if title.startswith("philly") and horizon_s == 3_600:
                _plot_series(args.out / "philly_60min.png", model, series["philly"], cfg, split, until)

    # 2. Durations at submission on openb (creation → deletion), keyed by request shape + QoS.
    _log("openb durations")
    pods = pd.read_csv(args.traces / "openb" / "openb_pod_list_default.csv")
    cfg_d = DurationConfig(key_cols=tuple(OPENB_SHAPE), feature_cols=(*OPENB_SHAPE, "gpu_spec"))
    _, ev_d = evaluate_durations(
        pods, pods["creation_time"].to_numpy(float), pods["deletion_time"].to_numpy(float), cfg_d, 0.7
    )
    docs["openb durations"] = ev_d.to_json()
    md = ev_d.models
    for base in (
        "global_median",
        "key_history_mean",
        "key_last10_geomean",
        "key_last10_median",
        "key_recent_ewm",
    ):
        lines.append(
            _line(
                f"openb duration log-MAE vs {base}",
                md["xgboost_p50"]["log_mae"],
                base,
                md[base]["log_mae"],
                "log-MAE",
            )
        )
    _plot_buckets(args.out / "openb_duration_buckets.png", md)

    # 3. Memory peak over the next hour, GenAI pods (values scaled by the publisher: ratios only).
    _log("genai memory peak")
    mem = pd.read_csv(args.traces / "genai-2026" / "pod_gpu_memory_used_bytes_anon.tar.gz")
    _, ev_m = evaluate_memory(
        mem["container_ip"].astype(str).to_numpy(),
        mem["timestamp_anon"].to_numpy(float),
        mem["value"].to_numpy(float) / 2**20,
        MemoryConfig(),
        0.6,
    )
    docs["genai memory"] = ev_m.to_json()
    mm = ev_m.models
    lines.append(
        _line(
            "genai memory: saved vs request",
            mm["xgboost"]["saved_vs_request"],
            "peak_so_far",
            mm["peak_so_far"]["saved_vs_request"],
            "share, higher is better",
            lower=False,
        )
    )
    lines.append(
        f"{'genai memory: under-prediction rate':<44} model {mm['xgboost']['under_rate']:.4f}  "
        f"peak_so_far {mm['peak_so_far']['under_rate']:.4f}  target ≤ 0.0100"
    )

    # 4. Arrivals per shape over the next hour, openb creation times.
    _log("openb arrivals")
    labels = shape_labels(pods, ["num_gpu", "gpu_milli"]).tolist()
    _, ev_a = evaluate_arrivals(pods["creation_time"].to_numpy(float), labels, ArrivalConfig(), 0.7)
    docs["openb arrivals"] = ev_a.to_json()
    ma = ev_a.models
    best = min((n for n in ma if n != "xgboost"), key=lambda n: ma[n]["poisson_deviance"])
    lines.append(
        _line(
            "openb arrivals: Poisson deviance",
            ma["xgboost"]["poisson_deviance"],
            best,
            ma[best]["poisson_deviance"],
            "deviance",
        )
    )
    best = min((n for n in ma if n != "xgboost"), key=lambda n: ma[n]["mix_tv_distance"])
    lines.append(
        _line(
            "openb arrivals: shape-mix TV distance",
            ma["xgboost"]["mix_tv_distance"],
            best,
            ma[best]["mix_tv_distance"],
            "TV",
        )
    )

    (args.out / "forecast.json").write_text(json.dumps(docs, indent=2, default=str))
    print("\n".join(lines))
    print(f"\nJSON and figures in {args.out}/")
    return 0


def _plot_series(
    path: Path, model: Any, y: pd.Series, cfg: SeriesConfig, split: str, until: str | None
) -> None:
    rows = build_rows(y, cfg, model.scales["philly"])
    keep = (rows["target_time"] >= pd.Timestamp(split)) & rows["target"].notna() & rows["last"].notna()
    if until is not None:
        keep &= rows["target_time"] < pd.Timestamp(until)
    test = rows[keep]
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.plot(test["target_time"], test["target"], lw=0.8, label="actual", color="black")
    ax.plot(test["target_time"], test["base_persistence"], lw=0.8, label="persistence", alpha=0.7)
    ax.plot(test["target_time"], predict_rows(model, test), lw=0.8, label="XGBoost", alpha=0.9)
    ax.set_title("Philly active nodes, 60 minutes ahead (test weeks)")
    ax.set_ylabel("nodes (10-min max)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_buckets(path: Path, models: dict[str, dict[str, float]]) -> None:
    buckets = ["within_10pct", "within_50pct", "within_100pct", "within_1000pct"]
    bar = [0.10, 0.50, 0.70, 0.90]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / (len(models) + 1)
    x = np.arange(len(buckets))
    for i, (name, scores) in enumerate(models.items()):
        ax.bar(x + i * width, [scores[b] for b in buckets], width, label=name)
    ax.bar(x + len(models) * width, bar, width, label="Helios estimator bar", color="grey")
    ax.set_xticks(x + width * len(models) / 2, ["±10 %", "±50 %", "±100 %", "±1000 %"])
    ax.set_ylabel("share of test tasks")
    ax.set_title("openb task duration at submission: relative-error buckets")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
