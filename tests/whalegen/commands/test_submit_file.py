"""`whalegen submit` reads the task file as the API will read it, and never answers with a traceback:
a file that is not UTF-8, YAML that means a date, and values JSON cannot carry are each one readable
line and exit status 65 (or go to the server as the string the user typed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from whalegen.cli import main
from whalegen.commands.submit import _load

# A port nothing listens on: the commands below must stop before (or cleanly at) the network.
NOWHERE = ["--server", "http://127.0.0.1:9", "--token", "wg_test"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse-style exits carry their message as the code
        code = exc.code if isinstance(exc.code, int) else 1
        message = "" if isinstance(exc.code, int) else str(exc.code)
    else:
        message = ""
    captured = capsys.readouterr()
    return code, message + captured.err + captured.out


def test_a_yaml_date_is_sent_as_the_string_typed(tmp_path: Path) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text("queue: train\nname: 2026-01-01\nstarted: 2026-01-01T10:00:00Z\ngpu_count: 2\n")
    assert _load(spec) == {
        "queue": "train",
        "name": "2026-01-01",
        "started": "2026-01-01T10:00:00Z",
        "gpu_count": 2,
    }


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"queue: train\nname: caf\xe9\n", "not UTF-8"),
        (b"queue: train\nname: !!binary aGVsbG8=\n", "cannot take"),
        (b"queue: train\nweight: .nan\n", "cannot take"),
        (b"queue: [train\n", "cannot read"),
        (b"- a list\n", "must hold a mapping"),
    ],
    ids=["latin-1 bytes", "binary", "nan", "broken yaml", "a list"],
)
def test_a_task_file_the_api_cannot_take_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_bytes(content)
    code, output = _run(capsys, "submit", str(spec), *NOWHERE)
    assert code == 65  # EX_DATAERR: fix the file; retrying will not help
    assert words in output and "Traceback" not in output


def test_an_unreachable_server_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text("queue: train\nname: 2026-01-01\ncommand: [python, train.py]\n")
    code, output = _run(capsys, "submit", str(spec), *NOWHERE)
    assert code == 69 and "Traceback" not in output  # EX_UNAVAILABLE
    assert "cannot reach the plane at http://127.0.0.1:9: connection refused" in output
