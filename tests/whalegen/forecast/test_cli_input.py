"""`whalegen forecast eval-*` on messy but well-formed CSVs: results, not tracebacks.

Every trace here is generated: missing cells, unsorted and duplicated rows, times as seconds or as
datetimes, gzip. A failure the user can fix is one line on stderr and exit status 2.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whalegen.cli import main
from whalegen.commands.forecast import _columns, _seconds_of


def _tasks(n: int = 240, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    gpus = rng.choice([1, 8], n)
    start = np.sort(rng.uniform(0, 6 * 86_400, n)).round()
    end = start + np.where(gpus == 8, 8_000.0, 300.0) * rng.lognormal(0, 0.2, n)
    return pd.DataFrame(
        {"created": start, "deleted": end.round(), "gpus": gpus, "qos": rng.choice(["LS", "BE"], n)}
    )


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    rc = main(["forecast", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _durations(path: Path, *extra: str) -> list[str]:
    argv = ["eval-durations", "--csv", str(path), "--start-col", "created", "--end-col", "deleted"]
    return [*argv, "--max-rounds", "15", *extra]


def _one_error_line(err: str, action: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("forecast: ")]
    assert len(lines) == 1 and lines[0].startswith(f"whalegen forecast {action}: "), err
    assert "Traceback" not in err
    return lines[0]


def test_tasks_that_never_started_are_dropped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The reported crash: half the rows have no start time, the split quantile came out NaN.
    frame = pd.concat([_tasks(), _tasks(240, seed=1).assign(created=np.nan)], ignore_index=True)
    frame.loc[5, "deleted"] = frame.loc[5, "created"] - 10  # ends before it starts
    path = tmp_path / "tasks.csv"
    frame.sample(frac=1.0, random_state=0).to_csv(path, index=False)  # unsorted
    rc, out, err = _run(
        capsys, [*_durations(path, "--key-cols", "gpus,qos", "--feature-cols", "gpus,", "--json")]
    )
    assert rc == 0, err
    assert "dropped 241 of 480 rows (240 no usable created, 1 end before start)" in err
    doc = json.loads(out)
    assert doc["n_test"] + doc["n_train"] <= 239 and doc["n_test"] > 50
    # `--key-cols a,b` is two columns, as `--key-cols a b` would be.
    assert doc["key_cols"] == ["gpus", "qos"] and doc["feature_cols"] == ["gpus"]


def test_comma_separated_columns_are_split() -> None:
    assert _columns(["a,b", "c", " d , a", ","]) == ["a", "b", "c", "d"]


def test_datetimes_duplicates_blanks_and_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frame = _tasks()
    frame = pd.concat([frame, frame.iloc[:30]], ignore_index=True).iloc[::-1]  # duplicated, reversed
    epoch = pd.Timestamp("2024-03-01")
    as_text = frame.assign(
        created=(epoch + pd.to_timedelta(frame["created"], unit="s")).dt.strftime("%Y-%m-%d %H:%M:%S"),
        deleted=(epoch + pd.to_timedelta(frame["deleted"], unit="s")).dt.strftime("%Y-%m-%dT%H:%M:%S+00:00"),
    )
    as_text.loc[as_text.index[:7], "deleted"] = ""  # still running: no end yet
    as_text.loc[as_text.index[7:9], "gpus"] = np.nan  # a missing request value is a missing feature
    path = tmp_path / "tasks.csv.gz"
    with gzip.open(path, "wt") as handle:
        as_text.to_csv(handle, index=False)
    rc, out, err = _run(
        capsys, _durations(path, "--key-cols", "gpus", "--feature-cols", "gpus", "qos", "--json")
    )
    assert rc == 0, err
    assert "dropped 7 of 270 rows (7 no usable deleted)" in err
    assert json.loads(out)["n_test"] > 50


def test_seconds_of_reads_numbers_datetimes_and_garbage() -> None:
    numbers = _seconds_of(pd.Series([3.0, np.nan, np.inf, 1.0]))
    np.testing.assert_array_equal(numbers, [3.0, np.nan, np.nan, 1.0])
    text = _seconds_of(
        pd.Series(["1970-01-01 00:01:00", "", None, "not a time", "1970-01-01T00:00:00+01:00"])
    )
    np.testing.assert_array_equal(text, [60.0, np.nan, np.nan, np.nan, -3_600.0])
    numeric_text = _seconds_of(pd.Series(["12", "13.5", "", "x"]))
    np.testing.assert_array_equal(numeric_text, [12.0, 13.5, np.nan, np.nan])


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("missing column", "no column(s) 'nope'"),
        ("no file", "no such file"),
        ("empty file", "empty file"),
        ("too few tasks", "need at least 50"),
        ("no usable rows", "no usable rows"),
    ],
)
def test_failures_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expect: str
) -> None:
    path = tmp_path / "tasks.csv"
    frame = _tasks()
    extra: list[str] = []
    if case == "missing column":
        extra = ["--key-cols", "gpus,nope"]
    elif case == "empty file":
        path.write_text("")
    elif case == "too few tasks":
        frame = frame.iloc[:40]
    elif case == "no usable rows":
        frame = frame.assign(created="")
    if case not in {"no file", "empty file"}:
        frame.to_csv(path, index=False)
    rc, _, err = _run(capsys, _durations(path, *extra))
    assert rc == 2
    assert expect in _one_error_line(err, "eval-durations")


def test_series_survive_blank_and_shuffled_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(4)
    # Pool series: per-minute datetimes, shuffled, one blank time and one blank value.
    index = pd.date_range("2021-03-01", periods=2 * 24 * 60, freq="1min")
    pool = pd.DataFrame({"time": index.strftime("%Y-%m-%d %H:%M:%S"), "idle": rng.integers(0, 9, len(index))})
    pool = pool.astype({"time": object, "idle": float})
    pool.loc[10, "time"], pool.loc[20, "idle"] = None, np.nan
    series_path = tmp_path / "pool.csv"
    pool.sample(frac=1.0, random_state=1).to_csv(series_path, index=False)
    rc, _, err = _run(
        capsys,
        [
            "eval-series",
            "--csv",
            str(series_path),
            "--time-col",
            "time",
            "--target",
            "idle",
            "--horizon",
            "30min",
        ],
    )
    assert rc == 0, err
    assert "dropped 1 of 2880 rows (1 no usable time)" in err


def test_arrivals_survive_blank_and_duplicated_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrivals: epoch seconds, duplicated rows, some blank times; comma form of the shape columns.
    tasks = _tasks(400, seed=5).assign(created=lambda f: f["created"] / 3 + 1.7e9)  # two days
    tasks = pd.concat([tasks, tasks.iloc[:50]]).astype({"created": float})
    tasks.iloc[:3, 0] = np.nan
    arrivals_path = tmp_path / "arrivals.csv"
    tasks.to_csv(arrivals_path, index=False)
    rc, out, err = _run(
        capsys,
        [
            "eval-arrivals",
            "--csv",
            str(arrivals_path),
            "--time-col",
            "created",
            "--shape-cols",
            "gpus,qos",
            "--json",
        ],
    )
    assert rc == 0, err
    assert "dropped 3 of 450 rows" in err and len(json.loads(out)["shapes"]) == 5


def test_memory_drops_rows_without_pod_or_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Memory: blank pod ids and values are dropped with a count.
    rows = [(f"p{p}", 60.0 * k, 1e9 * (1 + p + 0.1 * np.sin(k / 9))) for p in range(8) for k in range(200)]
    mem = pd.DataFrame(rows, columns=["pod", "t", "bytes"]).astype({"pod": object})
    mem.loc[0, "pod"], mem.loc[1, "bytes"] = None, np.nan
    mem_path = tmp_path / "mem.csv"
    mem.iloc[::-1].to_csv(mem_path, index=False)
    argv = [
        "eval-memory",
        "--csv",
        str(mem_path),
        "--time-col",
        "t",
        "--value-col",
        "bytes",
        "--key-col",
        "pod",
    ]
    rc, _, err = _run(capsys, [*argv, "--window", "30min", "--horizon", "30min"])
    assert rc == 0, err
    assert "dropped 2 of 1600 rows (1 no pod, 1 no usable bytes)" in err


_CELLS = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.text(max_size=12),
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1)).map(str),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(_CELLS, min_size=1, max_size=12))
def test_seconds_of_never_raises_and_returns_finite_or_missing(cells: list[object]) -> None:
    got = _seconds_of(pd.Series(cells, dtype=object))
    assert got.shape == (len(cells),) and got.dtype == np.float64
    assert np.all(np.isfinite(got) | np.isnan(got))
