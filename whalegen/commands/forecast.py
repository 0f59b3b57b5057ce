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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from whalegen.forecast.arrivals import ArrivalConfig, evaluate_arrivals, shape_labels
from whalegen.forecast.durations import DurationConfig, DurationParams, evaluate_durations
from whalegen.forecast.interference import SoloProfile, evaluate_interference, fit_interference
from whalegen.forecast.memory import MemoryConfig, evaluate_memory
from whalegen.forecast.profiles import profiles_by_key, right_size
from whalegen.forecast.series import Aggregation, SeriesConfig, bin_series, evaluate_series
from whalegen.forecast.store import should_promote


def _seconds(text: str) -> int:
    try:
        seconds = pd.Timedelta(text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 10min, 1h, 90s)") from exc
    if seconds <= 0 or seconds != int(seconds):
        raise argparse.ArgumentTypeError(f"duration must be a positive whole number of seconds: {text!r}")
    return int(seconds)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError("a fraction strictly between 0 and 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)

    series = sub.add_parser("eval-series", help="pool series h ahead: XGBoost vs persistence and seasonal")
    series.add_argument(
        "--csv",
        nargs="+",
        required=True,
        type=Path,
        help="CSV file(s), gzip accepted; "
        "several files are several series (e.g. one per pool) scored together",
    )
    series.add_argument("--time-col", required=True)
    series.add_argument(
        "--target",
        required=True,
        help="numeric column to forecast, or a pandas expression "
        "over the columns, e.g. 'idle_gpu_num * (pending_gpujob_num > 0)'",
    )
    series.add_argument("--series-col", help="column naming the series in a long-format file")
    series.add_argument("--bin", type=_seconds, default=600, help="bin width (default 10min)")
    series.add_argument(
        "--agg",
        choices=[a.value for a in Aggregation],
        default=Aggregation.MAX.value,
        help="bin aggregation (default max, the Helios CES protocol)",
    )
    series.add_argument("--horizon", type=_seconds, default=3600, help="lead time (default 60min)")
    split = series.add_mutually_exclusive_group()
    split.add_argument("--split-at", type=pd.Timestamp, help="first target time of the test part")
    split.add_argument("--split-frac", type=_fraction, default=0.8, help="train share of the time span")
    series.add_argument("--test-until", type=pd.Timestamp, help="end of the test part (exclusive)")
    series.add_argument(
        "--mask-zero", action="store_true", help="treat exact zeros as missing samples (telemetry outages)"
    )
    series.add_argument("--save-model", type=Path, help="write the trained model envelope here")
    series.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    _add_durations(sub)
    _add_memory(sub)
    _add_arrivals(sub)
    _add_profiles(sub)


def _add_durations(sub: Any) -> None:
    durations = sub.add_parser(
        "eval-durations", help="task duration at submission: P50/P90 vs history baselines"
    )
    durations.add_argument("--csv", required=True, type=Path, help="one row per task; gzip accepted")
    durations.add_argument("--start-col", required=True, help="submission time (seconds or datetime)")
    durations.add_argument("--end-col", required=True, help="finish time (seconds or datetime)")
    durations.add_argument(
        "--key-cols",
        nargs="*",
        default=[],
        help="columns naming a task's history group (space- or comma-separated)",
    )
    durations.add_argument(
        "--feature-cols",
        nargs="*",
        default=[],
        help="request columns known at submission (space- or comma-separated)",
    )
    durations.add_argument(
        "--split-frac", type=_fraction, default=0.7, help="share of tasks (by time) to train on"
    )
    durations.add_argument(
        "--max-rounds", type=int, default=1_000, help="cap on boosting rounds (early stopping picks fewer)"
    )
    durations.add_argument("--save-model", type=Path, help="write the trained model envelope here")
    durations.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _add_memory(sub: Any) -> None:
    memory = sub.add_parser(
        "eval-memory", help="GPU memory peak over the next horizon: under-prediction rate"
    )
    memory.add_argument(
        "--csv", required=True, type=Path, help="long format: task, time, memory; gzip/tar.gz accepted"
    )
    memory.add_argument("--time-col", required=True, help="sample time (seconds or datetime)")
    memory.add_argument("--value-col", required=True, help="memory used (any unit; results keep it)")
    memory.add_argument("--key-col", required=True, help="task / pod / container id")
    memory.add_argument("--window", type=_seconds, default=3600, help="history looked at (default 60min)")
    memory.add_argument("--horizon", type=_seconds, default=3600, help="peak over this lead (default 60min)")
    memory.add_argument("--quantile", type=_fraction, default=0.99, help="quantile the model fits")
    memory.add_argument("--target-under", type=_fraction, default=0.01, help="allowed under-prediction rate")
    memory.add_argument(
        "--confidence",
        type=_fraction,
        default=0.9,
        help="probability that the realised under-prediction rate stays within --target-under "
        "(training-conditional conformal margin; default 0.9)",
    )
    memory.add_argument(
        "--expected-rate-only",
        action="store_true",
        help="plain split-conformal margin (bounds the expected rate only), ignoring --confidence",
    )
    memory.add_argument(
        "--request",
        type=float,
        help="per-task request in the value's unit (default: the largest value seen before the split)",
    )
    memory.add_argument("--split-frac", type=_fraction, default=0.6, help="train share of the time span")
    memory.add_argument("--save-model", type=Path, help="write the trained model envelope here")
    memory.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _add_arrivals(sub: Any) -> None:
    arrivals = sub.add_parser("eval-arrivals", help="arrivals per task shape over the next hour, per bin")
    arrivals.add_argument("--csv", required=True, type=Path, help="one row per task; gzip accepted")
    arrivals.add_argument("--time-col", required=True, help="submission time (seconds or datetime)")
    arrivals.add_argument(
        "--shape-cols",
        nargs="+",
        required=True,
        help="columns making a task's shape (space- or comma-separated)",
    )
    arrivals.add_argument("--pool-col", help="pool column: shapes are counted per pool")
    arrivals.add_argument("--bin", type=_seconds, default=600, help="bin width (default 10min)")
    arrivals.add_argument("--steps", type=int, default=6, help="bins ahead (default 6: the next hour)")
    arrivals.add_argument(
        "--max-shapes", type=int, default=15, help="shape classes kept; the rest are 'other'"
    )
    arrivals.add_argument("--split-frac", type=_fraction, default=0.7, help="share of arrivals to train on")
    arrivals.add_argument("--save-model", type=Path, help="write the trained model envelope here")
    arrivals.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _add_profiles(sub: Any) -> None:
    prof = sub.add_parser("profiles", help="task profiles from telemetry CSVs, with right-sizing advice")
    prof.add_argument("--util-csv", type=Path, help="long format: key, time, GPU utilisation %%")
    prof.add_argument("--mem-csv", type=Path, help="long format: key, time, GPU memory used")
    prof.add_argument("--key-col", required=True, help="task / pod id (each key is its own profile)")
    prof.add_argument("--time-col", required=True)
    prof.add_argument("--value-col", default="value", help="value column in both files (default value)")
    prof.add_argument(
        "--mem-unit-mib",
        type=float,
        default=1.0 / 2**20,
        help="MiB per unit of the memory column (default: bytes)",
    )
    prof.add_argument("--gpu-model", default="H100-80GB", help="GPU the right-sizing advice is for")
    prof.add_argument("--margin", type=float, default=0.15, help="safety margin over the observed peak")
    prof.add_argument("--json", action="store_true", help="print one JSON object per profile key")

    colo = sub.add_parser("eval-colocation", help="pair slowdown from solo profiles (Lucid format)")
    colo.add_argument("--single-csv", required=True, type=Path, help="solo profiles (single_data.csv)")
    colo.add_argument("--pairs-csv", required=True, type=Path, help="measured pairs (colocate_info.csv)")
    colo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


class CommandError(Exception):
    """A failure the user can fix (bad input, too little data): printed as one line, exit status 2."""


def _read(path: Path) -> pd.DataFrame:
    print(f"forecast: reading {path}", file=sys.stderr)
    if not path.is_file():
        raise CommandError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path, low_memory=False)
    except pd.errors.EmptyDataError as exc:
        raise CommandError(f"{path}: empty file (no header row)") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise CommandError(f"{path}: not a readable CSV ({_one_line(exc)})") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _columns(values: list[str]) -> list[str]:
    """Column lists: `--key-cols a b`, `--key-cols a,b` and mixtures mean the same columns."""
    out = [part.strip() for value in values for part in value.split(",")]
    return list(dict.fromkeys(c for c in out if c))


def _drop_unusable(frame: pd.DataFrame, path: Path, usable: np.ndarray, why: dict[str, int]) -> pd.DataFrame:
    """Keep the usable rows, saying on stderr how many went and why."""
    dropped = int(len(frame) - usable.sum())
    if dropped:
        reasons = ", ".join(f"{n} {reason}" for reason, n in why.items() if n)
        print(f"forecast: {path}: dropped {dropped} of {len(frame)} rows ({reasons})", file=sys.stderr)
    if not usable.any():
        raise CommandError(f"{path}: no usable rows ({', '.join(why)})")
    return frame[usable].reset_index(drop=True)


def _target_values(frame: pd.DataFrame, target: str, path: Path) -> pd.Series:
    if target in frame.columns:
        return frame[target]
    try:
        values = frame.eval(target)
    except Exception as exc:  # pandas raises many kinds for a bad expression; all mean the same here
        raise CommandError(
            f"{path}: no column {target!r} and not an expression over the columns ({_one_line(exc)}); "
            f"columns: {', '.join(frame.columns)}"
        ) from exc
    return pd.Series(values, index=frame.index).astype(np.float64)


def _times(column: pd.Series) -> pd.Series:
    """Datetimes; numbers are seconds since an arbitrary epoch (openb, genai). Unusable cells are NaT."""
    return pd.Series(pd.to_datetime(_seconds_of(column), unit="s"), index=column.index)


def _load_series(args: argparse.Namespace) -> dict[str, pd.Series]:
    cfg_agg = Aggregation(args.agg)
    out: dict[str, pd.Series] = {}
    for path in args.csv:
        frame = _read(path)
        for col in (args.time_col, args.series_col):
            if col is not None and col not in frame.columns:
                raise CommandError(f"{path}: no column {col!r} (columns: {', '.join(frame.columns)})")
        values = pd.to_numeric(_target_values(frame, args.target, path), errors="coerce")
        if args.mask_zero:
            values = values.mask(values == 0)
        frame = frame.assign(_t=_times(frame[args.time_col]), _v=values)
        no_time = frame["_t"].isna().to_numpy()
        frame = _drop_unusable(frame, path, ~no_time, {f"no usable {args.time_col}": int(no_time.sum())})
        groups = frame.groupby(args.series_col, sort=True) if args.series_col else [(None, frame)]
        stem = path.name.split(".")[0]
        for key, part in groups:
            name = stem if key is None else (f"{stem}:{key}" if len(args.csv) > 1 else str(key))
            out[name] = bin_series(part["_t"], part["_v"], args.bin, cfg_agg)
    return out


def _table(models: dict[str, dict[str, Any]], columns: list[str]) -> str:
    width = max(len(name) for name in models)
    widths = [max(12, len(c) + 2) for c in columns]
    head = "model".ljust(width) + "".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))
    lines = [head, "-" * len(head)]
    for name, scores in models.items():
        cells = []
        for c, w in zip(columns, widths, strict=True):
            v = scores.get(c)
            cells.append(
                ("—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}").rjust(w)
            )
        lines.append(name.ljust(width) + "".join(cells))
    return "\n".join(lines)


def _promotion(
    models: dict[str, dict[str, Any]],
    candidate: str,
    metric: str,
    *,
    lower_is_better: bool = True,
    limits: dict[str, float] | None = None,
    skip: tuple[str, ...] = (),
) -> dict[str, Any]:
    """What the plane's promotion rule would decide for this run's model with no active model."""
    baselines = {name: scores for name, scores in models.items() if name != candidate and name not in skip}
    decision = should_promote(
        models[candidate], None, baselines, metric=metric, lower_is_better=lower_is_better, limits=limits
    )
    return {"metric": metric, "promote": decision.promote, "reason": decision.reason}


def _emit(args: argparse.Namespace, doc: dict[str, Any], columns: list[str], title: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return
    print(title)
    print(_table(doc["models"], columns))
    if "promotion" in doc:
        verdict = "promote" if doc["promotion"]["promote"] else "keep the baseline"
        print(f"promotion on {doc['promotion']['metric']}: {verdict} — {doc['promotion']['reason']}")


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
    doc["promotion"] = _promotion(evaluation.models, "xgboost", "mae")
    title = (
        f"{args.target}: {len(series)} series, bin {args.bin}s ({args.agg}), horizon {args.horizon}s, "
        f"test from {split_at}"
        + (f" to {args.test_until}" if args.test_until else "")
        + f", {evaluation.n_train} train / {evaluation.n_test} test rows; the 'xgboost' row is what "
        + (
            f"serves: the model ({evaluation.objective})"
            if evaluation.chosen == "xgboost"
            else f"serves: {evaluation.chosen} (the model did not beat it on the inner validation)"
        )
    )
    _emit(args, doc, ["mae", "smape", "r2", "n"], title)
    return 0


def _seconds_of(column: pd.Series) -> np.ndarray:
    """Seconds as floats: numbers as they are (epoch or trace-relative seconds), otherwise datetimes
    (naive ones read as UTC, aware ones converted). Empty, unparsable or infinite cells are NaN."""
    if pd.api.types.is_bool_dtype(column):
        raise CommandError(f"column {column.name!r} holds true/false, not times")
    if pd.api.types.is_numeric_dtype(column):
        values = column.to_numpy(np.float64)
    elif pd.api.types.is_datetime64_any_dtype(column):
        values = _datetime_seconds(column)
    else:
        text = column.astype("string").str.strip()
        numbers = pd.to_numeric(text, errors="coerce")
        given = int(text.notna().sum() - (text == "").sum())
        if given and numbers.notna().sum() >= 0.5 * given:
            values = numbers.to_numpy(np.float64, na_value=np.nan)
        else:
            values = _datetime_seconds(pd.to_datetime(text, errors="coerce", utc=True, format="mixed"))
    return np.where(np.isfinite(values), values, np.nan)


def _datetime_seconds(column: pd.Series) -> np.ndarray:
    stamps = pd.Series(column)
    if stamps.dt.tz is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    # Microseconds hold ±290,000 years, so no parsed date overflows (nanoseconds stop at 1677/2262).
    micros = stamps.to_numpy(dtype="datetime64[us]")
    seconds = micros.astype(np.int64) / 1e6
    return np.where(np.isnat(micros), np.nan, seconds)


def _check_columns(frame: pd.DataFrame, path: Path, columns: list[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise CommandError(
            f"{path}: no column(s) {', '.join(map(repr, missing))} (columns: {', '.join(frame.columns)})"
        )


def _run_durations(args: argparse.Namespace) -> int:
    frame = _read(args.csv)
    args.key_cols, args.feature_cols = _columns(args.key_cols), _columns(args.feature_cols)
    _check_columns(frame, args.csv, [args.start_col, args.end_col, *args.key_cols, *args.feature_cols])
    start_s, end_s = _seconds_of(frame[args.start_col]), _seconds_of(frame[args.end_col])
    # A task without a start (never started in the window) or an end (still running) has no duration
    # to learn or score; the split is then taken over the usable rows only.
    no_start, no_end = np.isnan(start_s), np.isnan(end_s)
    backwards = ~no_start & ~no_end & (end_s < start_s)
    usable = ~no_start & ~no_end & ~backwards
    why = {
        f"no usable {args.start_col}": int(no_start.sum()),
        f"no usable {args.end_col}": int((no_end & ~no_start).sum()),
        "end before start": int(backwards.sum()),
    }
    frame = _drop_unusable(frame, args.csv, usable, why)
    start_s, end_s = start_s[usable], end_s[usable]
    cfg = DurationConfig(key_cols=tuple(args.key_cols), feature_cols=tuple(args.feature_cols))
    if args.max_rounds < 1:
        raise CommandError("--max-rounds must be at least 1")
    hp = DurationParams(max_rounds=args.max_rounds, early_stopping_rounds=min(50, args.max_rounds))
    model, evaluation = evaluate_durations(frame, start_s, end_s, cfg, args.split_frac, hp, log=True)
    if args.save_model:
        args.save_model.write_bytes(model.to_bytes())
    doc = {
        "command": "eval-durations",
        "key_cols": args.key_cols,
        "feature_cols": args.feature_cols,
        "features": list(model.feature_names),
        **evaluation.to_json(),
    }
    doc["promotion"] = _promotion(evaluation.models, "xgboost_p50", "log_mae")
    title = (
        f"durations: {evaluation.n_train} training tasks (finished before the split), "
        f"{evaluation.n_test} test tasks; Helios bar within 10/50/100/1000 % = 10/50/70/90 %"
    )
    _emit(
        args,
        doc,
        ["within_10pct", "within_50pct", "within_100pct", "within_1000pct", "log_mae", "spearman"],
        title,
    )
    if not args.json:
        cold = evaluation.cold_start
        n_cold = next(iter(cold.values()))["n"] if cold else 0
        print(f"\ncold-start keys (no finished task of the key before submission): {n_cold} tasks")
        if n_cold:
            print(_table(cold, ["within_50pct", "within_100pct", "log_mae", "n"]))
        p = evaluation.models["xgboost_p50"]
        print(
            f"\nP50 coverage {p['p50_coverage']:.3f} (ideal 0.5; {p['p50_coverage_uncalibrated']:.3f} "
            f"before the conformal shift), P90 coverage {p['p90_coverage']:.3f} (ideal 0.9; "
            f"{p['p90_coverage_uncalibrated']:.3f} before); served: {evaluation.chosen} "
            "(chosen on the inner time-ordered validation)"
        )
        if evaluation.oracles:
            print("\nhindsight references (use the test durations themselves; not forecasts):")
            print(
                _table(evaluation.oracles, ["within_10pct", "within_50pct", "within_100pct", "log_mae", "n"])
            )
    return 0


def _run_memory(args: argparse.Namespace) -> int:
    frame = _read(args.csv)
    _check_columns(frame, args.csv, [args.time_col, args.value_col, args.key_col])
    times_s = _seconds_of(frame[args.time_col])
    values = pd.to_numeric(frame[args.value_col], errors="coerce").to_numpy(np.float64)
    no_key = frame[args.key_col].isna().to_numpy()
    no_time, no_value = np.isnan(times_s), ~np.isfinite(values)
    why = {
        f"no {args.key_col}": int(no_key.sum()),
        f"no usable {args.time_col}": int((no_time & ~no_key).sum()),
        f"no usable {args.value_col}": int((no_value & ~no_time & ~no_key).sum()),
    }
    usable = ~no_key & ~no_time & ~no_value
    frame = _drop_unusable(frame, args.csv, usable, why)
    times_s, values = times_s[usable], values[usable]
    cfg = MemoryConfig(
        window_s=args.window,
        horizon_s=args.horizon,
        quantile=args.quantile,
        target_under=args.target_under,
        confidence=None if args.expected_rate_only else args.confidence,
    )
    model, evaluation = evaluate_memory(
        frame[args.key_col].astype(str).to_numpy(),
        times_s,
        values,
        cfg,
        args.split_frac,
        args.request,
        log=True,
    )
    if args.save_model:
        args.save_model.write_bytes(model.to_bytes())
    doc = {"command": "eval-memory", "config": asdict(cfg), **evaluation.to_json()}
    # The request baseline saves nothing by definition; the model must beat the rules at the same risk.
    doc["promotion"] = _promotion(
        evaluation.models,
        "xgboost",
        "saved_vs_request",
        lower_is_better=False,
        limits={"under_rate": cfg.target_under},
        skip=("request",),
    )
    title = (
        f"memory peak over the next {args.horizon}s: {evaluation.n_train} training / "
        f"{evaluation.n_test} test "
        f"origins, request {evaluation.request:.6g}, target under-prediction ≤ {args.target_under:.2%}"
        f"\ncalibrated margins: "
        + ", ".join(f"{k} ×{v:.3f}" for k, v in evaluation.margins.items())
        + f"; xgboost base quantile P{evaluation.base_quantile * 100:g}, conformal "
        + ("expected-rate" if cfg.confidence is None else f"confidence {cfg.confidence:g}")
    )
    _emit(args, doc, ["under_rate", "saved_vs_request", "reserved_over_actual", "pinball", "n"], title)
    return 0


def _run_arrivals(args: argparse.Namespace) -> int:
    frame = _read(args.csv)
    args.shape_cols = _columns(args.shape_cols)
    cols = [*([args.pool_col] if args.pool_col else []), *args.shape_cols]
    _check_columns(frame, args.csv, [args.time_col, *cols])
    if args.steps < 1 or args.max_shapes < 1:
        raise CommandError("--steps and --max-shapes must be at least 1")
    times_s = _seconds_of(frame[args.time_col])
    usable = ~np.isnan(times_s)
    frame = _drop_unusable(frame, args.csv, usable, {f"no usable {args.time_col}": int((~usable).sum())})
    cfg = ArrivalConfig(bin_s=args.bin, steps=args.steps, max_shapes=args.max_shapes)
    labels = shape_labels(frame, cols).tolist()
    model, evaluation = evaluate_arrivals(times_s[usable], labels, cfg, args.split_frac, log=True)
    if args.save_model:
        args.save_model.write_bytes(model.to_bytes())
    doc = {"command": "eval-arrivals", "config": asdict(cfg), **evaluation.to_json()}
    doc["promotion"] = _promotion(evaluation.models, "xgboost", "poisson_deviance")
    title = (
        f"arrivals: {len(evaluation.shapes)} shape classes × {cfg.steps} bins of {cfg.bin_s}s, "
        f"{evaluation.n_test_origins} test origins"
    )
    columns = ["cell_rmse", "poisson_deviance", "cell_mae", "hour_total_mae", "mix_tv_distance"]
    _emit(args, doc, columns, title)
    return 0


def _telemetry(args: argparse.Namespace) -> pd.DataFrame:
    parts = []
    for path, column, scale in ((args.util_csv, "util", 1.0), (args.mem_csv, "mem", args.mem_unit_mib)):
        if path is None:
            continue
        frame = _read(path)
        _check_columns(frame, path, [args.key_col, args.time_col, args.value_col])
        frame = frame.dropna(subset=[args.key_col])
        parts.append(
            pd.DataFrame(
                {
                    "key": frame[args.key_col].astype(str),
                    "t": _seconds_of(frame[args.time_col]),
                    column: pd.to_numeric(frame[args.value_col], errors="coerce") * scale,
                }
            )
        )
    if not parts:
        raise CommandError("give --util-csv, --mem-csv or both")
    merged = parts[0]
    for extra in parts[1:]:
        merged = merged.merge(extra, on=["key", "t"], how="outer")
    for column in ("util", "mem"):
        if column not in merged:
            merged[column] = np.nan
    return merged.assign(task=merged["key"])


def _run_profiles(args: argparse.Namespace) -> int:
    telemetry = _telemetry(args)
    profiles = profiles_by_key(telemetry)
    advice = {
        key: right_size(
            p.mem_peak_mib,
            args.gpu_model,
            margin=args.margin,
            util_p95_pct=p.util_p95_pct,
            pattern=p.mem_pattern,
        )
        for key, p in profiles.items()
        if p.mem_peak_mib is not None
    }
    if args.json:
        doc = {
            key: {**asdict(p), "right_size": asdict(advice[key]) if key in advice else None}
            for key, p in profiles.items()
        }
        print(json.dumps(doc, indent=2, default=str))
        return 0
    frame = pd.DataFrame([asdict(p) for p in profiles.values()], index=list(profiles))
    print(f"{len(profiles)} profiles from {len(telemetry)} samples")
    print(
        "memory pattern:",
        pd.Series([p.mem_pattern.value for p in profiles.values()]).value_counts().to_dict(),
    )
    cols = [
        "sample_count",
        "mem_peak_mib",
        "mem_typical_mib",
        "util_mean_pct",
        "util_p95_pct",
        "util_burstiness",
    ]
    print(frame[cols].describe(percentiles=[0.5, 0.95]).round(2).to_string())
    units = pd.Series([a.mig_profile or a.kind.value for a in advice.values()]).value_counts()
    print(f"\nright-sizing on {args.gpu_model} with a {args.margin:.0%} margin: {units.to_dict()}")
    return 0


def _run_colocation(args: argparse.Namespace) -> int:
    single = _read(args.single_csv)
    pairs_frame = pd.read_csv(args.pairs_csv, index_col=0)

    def key(model: str, dataset: str, batch: Any, amp: Any) -> tuple[str, str, int, int]:
        return (str(model), str(dataset), int(batch), int(amp))

    solo = {
        key(r.model, r.dataset, r.batchsize, r.amp): SoloProfile(
            float(r.gpu_util), float(r.gmem_util), float(r.gmem)
        )
        for r in single.itertuples()
    }
    pairs: list[tuple[SoloProfile, SoloProfile, float]] = []
    families: list[tuple[str, str]] = []
    for r in pairs_frame.itertuples():
        a = solo[key(r.model1, r.dataset1, r.batchsize1, r.amp1)]
        b = solo[key(r.model2, r.dataset2, r.batchsize2, r.amp2)]
        pairs += [(a, b, float(r.speed1)), (b, a, float(r.speed2))]
        families += [(str(r.model1), str(r.model2)), (str(r.model2), str(r.model1))]
    evaluation = evaluate_interference(pairs, families)
    doc = {
        "command": "eval-colocation",
        "n_job_pairs": evaluation.n_pairs,
        "models": evaluation.models,
        "coefficients_all_pairs": fit_interference(pairs).coef,
    }
    _emit(args, doc, ["mae", "spearman", "n"], "co-located speed (share of solo), leave-one-family-out")
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {
        "eval-series": _run_series,
        "eval-durations": _run_durations,
        "eval-memory": _run_memory,
        "eval-arrivals": _run_arrivals,
        "profiles": _run_profiles,
        "eval-colocation": _run_colocation,
    }
    try:
        return handlers[args.action](args)
    except CommandError as exc:
        message = str(exc)
    except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError, OSError) as exc:
        # Too little data after the split, a column of the wrong kind, …: one line, never a traceback.
        message = _one_line(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {_one_line(exc)}"
    except Exception as exc:  # the library's other failures (XGBoost, pandas) read the same way
        message = f"{type(exc).__name__}: {_one_line(exc)}"
    print(f"whalegen forecast {args.action}: {message}", file=sys.stderr)
    return 2
