"""`whalegen forecast …`: evaluate forecasters against their baselines on any trace of the right shape.

Every subcommand splits by time, trains on the earlier part, scores XGBoost and the baselines of
reference/forecasting.md §2 on the later part, prints a table and, with `--json`, one JSON object
whose `models` map holds the metrics of every model and baseline.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from whalegen.forecast.series import Aggregation, SeriesConfig, bin_series, evaluate_series


def _seconds(text: str) -> int:
    try:
        seconds = pd.Timedelta(text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 10min, 1h, 90s)") from exc
    if seconds <= 0 or seconds != int(seconds):
        raise argparse.ArgumentTypeError(f"duration must be a positive whole number of seconds: {text!r}")
    return int(seconds)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError("a fraction strictly between 0 and 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)

    series = sub.add_parser("eval-series", help="pool series h ahead: XGBoost vs persistence and seasonal")
    series.add_argument("--csv", nargs="+", required=True, type=Path, help="CSV file(s), gzip accepted; "
                        "several files are several series (e.g. one per pool) scored together")
    series.add_argument("--time-col", required=True)
    series.add_argument("--target", required=True, help="numeric column to forecast")
    series.add_argument("--series-col", help="column naming the series in a long-format file")
    series.add_argument("--bin", type=_seconds, default=600, help="bin width (default 10min)")
    series.add_argument("--agg", choices=[a.value for a in Aggregation], default=Aggregation.MAX.value,
                        help="bin aggregation (default max, the Helios CES protocol)")
    series.add_argument("--horizon", type=_seconds, default=3600, help="lead time (default 60min)")
    split = series.add_mutually_exclusive_group()
    split.add_argument("--split-at", type=pd.Timestamp, help="first target time of the test part")
    split.add_argument("--split-frac", type=_fraction, default=0.8, help="train share of the time span")
    series.add_argument("--test-until", type=pd.Timestamp, help="end of the test part (exclusive)")
    series.add_argument("--mask-zero", action="store_true",
                        help="treat exact zeros as missing samples (telemetry outages)")
    series.add_argument("--save-model", type=Path, help="write the trained model envelope here")
    series.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _read(path: Path) -> pd.DataFrame:
    print(f"forecast: reading {path}", file=sys.stderr)
    return pd.read_csv(path, low_memory=False)


def _times(column: pd.Series) -> pd.Series:
    """Datetime strings as they are; numbers as seconds since an arbitrary epoch (openb, genai)."""
    if pd.api.types.is_numeric_dtype(column):
        return pd.to_datetime(column, unit="s")
    return pd.to_datetime(column)


def _load_series(args: argparse.Namespace) -> dict[str, pd.Series]:
    cfg_agg = Aggregation(args.agg)
    out: dict[str, pd.Series] = {}
    for path in args.csv:
        frame = _read(path)
        for col in (args.time_col, args.target, args.series_col):
            if col is not None and col not in frame.columns:
                raise SystemExit(f"{path}: no column {col!r} (columns: {', '.join(frame.columns)})")
        values = pd.to_numeric(frame[args.target], errors="coerce")
        if args.mask_zero:
            values = values.mask(values == 0)
        frame = frame.assign(_t=_times(frame[args.time_col]), _v=values)
        groups = frame.groupby(args.series_col, sort=True) if args.series_col else [(None, frame)]
        stem = path.name.split(".")[0]
        for key, part in groups:
            name = stem if key is None else (f"{stem}:{key}" if len(args.csv) > 1 else str(key))
            out[name] = bin_series(part["_t"], part["_v"], args.bin, cfg_agg)
    return out


def _table(models: dict[str, dict[str, Any]], columns: list[str]) -> str:
    width = max(len(name) for name in models)
    head = "model".ljust(width) + "".join(c.rjust(14) for c in columns)
    lines = [head, "-" * len(head)]
    for name, scores in models.items():
        cells = []
        for c in columns:
            v = scores.get(c)
            cells.append(("—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}").rjust(14))
        lines.append(name.ljust(width) + "".join(cells))
    return "\n".join(lines)


def _emit(args: argparse.Namespace, doc: dict[str, Any], columns: list[str], title: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return
    print(title)
    print(_table(doc["models"], columns))


def _run_series(args: argparse.Namespace) -> int:
    series = _load_series(args)
    cfg = SeriesConfig(horizon_s=args.horizon, bin_s=args.bin, agg=Aggregation(args.agg))
    if args.split_at is not None:
        split_at = args.split_at
    else:
        start = min(y.index.min() for y in series.values())
        end = max(y.index.max() for y in series.values())
        split_at = (start + (end - start) * args.split_frac).floor(f"{args.bin}s")
    model, evaluation = evaluate_series(series, cfg, split_at, args.test_until, log=True)
    if args.save_model:
        args.save_model.write_bytes(model.to_bytes())
    doc = {"command": "eval-series", "target": args.target, "series": sorted(series), **evaluation.to_json()}
    title = (
        f"{args.target}: {len(series)} series, bin {args.bin}s ({args.agg}), horizon {args.horizon}s, "
        f"test from {split_at}" + (f" to {args.test_until}" if args.test_until else "")
        + f", {evaluation.n_train} train / {evaluation.n_test} test rows"
    )
    _emit(args, doc, ["mae", "smape", "r2", "n"], title)
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {"eval-series": _run_series}
    return handlers[args.action](args)
