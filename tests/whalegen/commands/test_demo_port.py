"""A demo started on a port that is already taken says so in one line and stops before any set-up."""

from __future__ import annotations

import socket

import pytest

from whalegen.cli import main


def test_a_taken_port_is_one_clear_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = main(["demo", "--port", str(port), "--serve-seconds", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in err and "pass --port N" in err
    assert "Traceback" not in err
