"""`whalegen forecast …` on small CSVs written here: the JSON has a `models` map with the metrics."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from whalegen.cli import main


def _run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:  # type: ignore[type-arg]
    assert main(["forecast", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _pool_csv(path: Path, days: int = 4) -> None:
    rng = np.random.default_rng(0)
    index = pd.date_range("2021-03-01", periods=days * 144, freq="10min")
    level = 50 + 40 * np.sin(np.arange(len(index)) * 2 * np.pi / 144) + rng.normal(0, 2, len(index))
    frame = pd.DataFrame({"ts": index.strftime("%Y-%m-%d %H:%M:%S"), "idle": np.round(level), "other": 1})
    with gzip.open(path, "wt") as handle:
        frame.to_csv(handle, index=False)


def test_eval_series_json_on_a_gzipped_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pool.csv.gz"
    _pool_csv(path)
    doc = _run_json(
        capsys,
        [
            "eval-series",
            "--csv",
            str(path),
            "--time-col",
            "ts",
            "--target",
            "idle",
            "--bin",
            "10min",
            "--horizon",
            "30min",
            "--split-frac",
            "0.7",
        ],
    )
    assert set(doc["models"]) == {"xgboost", "persistence", "same_slot_yesterday", "window_mean"}
    for scores in doc["models"].values():
        assert set(scores) == {"mae", "smape", "r2", "n"} and scores["n"] == doc["n_test"] > 0
    assert doc["config"] == {"horizon_s": 1800, "bin_s": 600, "agg": "max", "window_s": 3600}
    # A daily sine is what "same slot yesterday" is for: it must beat persistence at 30 minutes.
    assert doc["models"]["same_slot_yesterday"]["mae"] < doc["models"]["persistence"]["mae"]


def test_eval_series_split_at_and_mask_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nodes.csv"
    index = pd.date_range("2021-03-01", periods=5 * 24 * 60, freq="1min")
    active = np.full(len(index), 300)
    active[3_000:3_600] = 0  # an outage
    pd.DataFrame({"time": index, "active": active}).to_csv(path, index=False)
    doc = _run_json(
        capsys,
        [
            "eval-series",
            "--csv",
            str(path),
            "--time-col",
            "time",
            "--target",
            "active",
            "--horizon",
            "60min",
            "--split-at",
            "2021-03-04",
            "--mask-zero",
        ],
    )
    assert doc["split_at"] == "2021-03-04 00:00:00"
    # With the outage masked the series is flat: every model is exact.
    assert doc["models"]["persistence"]["mae"] == 0.0
    assert doc["models"]["xgboost"]["mae"] < 1.0


def test_eval_durations_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    n = 300
    gpus = rng.choice([1, 8], n)
    start = np.sort(rng.uniform(0, 10 * 86_400, n))
    end = start + np.where(gpus == 8, 10_000.0, 300.0) * rng.lognormal(0, 0.2, n)
    path = tmp_path / "tasks.csv"
    pd.DataFrame({"created": start, "deleted": end, "gpus": gpus}).to_csv(path, index=False)
    doc = _run_json(
        capsys,
        [
            "eval-durations",
            "--csv",
            str(path),
            "--start-col",
            "created",
            "--end-col",
            "deleted",
            "--key-cols",
            "gpus",
            "--feature-cols",
            "gpus",
        ],
    )
    assert set(doc["models"]) == {
        "xgboost_p50",
        "global_median",
        "key_history_mean",
        "key_last10_geomean",
        "key_last10_median",
        "key_recent_ewm",
    }
    assert doc["chosen"] and set(doc["oracles"]) == {"key_test_median", "key_previous_task"}
    want = {"within_10pct", "within_50pct", "within_100pct", "within_1000pct", "log_mae", "spearman"}
    assert all(want <= set(scores) for scores in doc["models"].values())
    assert doc["models"]["xgboost_p50"]["within_100pct"] > doc["models"]["global_median"]["within_100pct"]
    assert "key_count" in doc["features"]


def test_eval_memory_and_arrivals_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(2)
    rows = []
    for pod in range(8):
        level = rng.uniform(1e9, 2e10)
        for k in range(200):
            rows.append((f"pod{pod}", 1_000.0 + 60 * k, level * (1 + 0.1 * np.sin(k / 20 + pod))))
    mem_path = tmp_path / "mem.csv"
    pd.DataFrame(rows, columns=["pod", "t", "bytes"]).to_csv(mem_path, index=False)
    doc = _run_json(
        capsys,
        [
            "eval-memory",
            "--csv",
            str(mem_path),
            "--time-col",
            "t",
            "--value-col",
            "bytes",
            "--key-col",
            "pod",
            "--window",
            "30min",
            "--horizon",
            "30min",
        ],
    )
    assert {"xgboost", "peak_so_far", "window_max", "global_p99", "request"} == set(doc["models"])
    assert doc["models"]["request"]["saved_vs_request"] == pytest.approx(0.0, abs=1e-12)

    times = np.sort(rng.uniform(0, 3 * 86_400, 1_500))
    arr_path = tmp_path / "arrivals.csv"
    pd.DataFrame({"t": times, "num_gpu": rng.choice([1, 2], 1_500), "milli": 1000}).to_csv(
        arr_path, index=False
    )
    doc = _run_json(
        capsys,
        ["eval-arrivals", "--csv", str(arr_path), "--time-col", "t", "--shape-cols", "num_gpu", "milli"],
    )
    assert set(doc["models"]) == {
        "xgboost",
        "persistence",
        "last_hour_mean",
        "same_slot_yesterday",
        "training_rate",
    }
    assert doc["shapes"][-1] == "other"


def test_missing_column_is_a_readable_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.csv"
    pd.DataFrame({"a": [1], "b": [2]}).to_csv(path, index=False)
    assert main(["forecast", "eval-series", "--csv", str(path), "--time-col", "time", "--target", "a"]) == 2
    assert (
        f"whalegen forecast eval-series: {path}: no column 'time' (columns: a, b)" in capsys.readouterr().err
    )


def test_eval_series_target_may_be_an_expression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pool.csv.gz"
    _pool_csv(path, days=3)
    common = ["eval-series", "--csv", str(path), "--time-col", "ts", "--horizon", "10min"]
    raw = _run_json(capsys, [*common, "--target", "idle"])
    doubled = _run_json(capsys, [*common, "--target", "idle * 2 * (other > 0)"])
    assert doubled["models"]["persistence"]["mae"] == pytest.approx(2 * raw["models"]["persistence"]["mae"])
