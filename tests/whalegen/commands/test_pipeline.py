"""A CI pipeline against a live server: an operator makes a token, the pipeline submits, lists, shows
and cancels through the `whalegen` CLI, and bad input comes back as readable field messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.whalegen.commands.conftest import ROOT, Demo
from whalegen.cli import EXIT_BROKEN_PIPE, main


@pytest.fixture(scope="module")
def token(demo: Demo) -> str:
    argv = ["token", "create", "--user", "sam", "--tenant", "speech", "--name", "ci"]
    done = subprocess.run(
        [sys.executable, "-m", "whalegen", *argv],
        cwd=ROOT,
        env=demo.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "shown once" in done.stderr
    return done.stdout.strip()


def _cli(capsys: pytest.CaptureFixture[str], demo: Demo, token: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--server", demo.url, "--token", token])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_token_submit_list_show_cancel(demo: Demo, token: str, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "task.yaml"
    # Long enough to still be live when cancelled; the demo may start it within a cycle (h200-train has
    # idle GPUs), so the listing and the history accept pending or a started state.
    spec.write_text("queue: train\nname: nightly-asr\ngpu_count: 2\ncommand: [sleep, '600']\n")

    code, out, _ = _cli(capsys, demo, token, "submit", str(spec), "--idempotency-key", "pipeline-1")
    assert code == 0
    task_id = int(out.split()[1].rstrip(":"))
    assert "pending in speech/train (pool h200-train)" in out

    code, again, _ = _cli(capsys, demo, token, "submit", str(spec), "--idempotency-key", "pipeline-1")
    assert code == 0 and int(again.split()[1].rstrip(":")) == task_id  # a retried pipeline step

    code, listing, _ = _cli(capsys, demo, token, "tasks", "ls")
    line = next(row for row in listing.splitlines() if row.split()[:1] == [str(task_id)])
    assert code == 0 and line.split()[1] in {"pending", "admitted", "assigned", "running"}
    assert "nightly-asr" in line

    code, out, _ = _cli(capsys, demo, token, "tasks", "cancel", str(task_id), "--reason", "superseded")
    assert code == 0 and out.strip() == f"task {task_id}: cancelled"

    code, shown, _ = _cli(capsys, demo, token, "tasks", "show", str(task_id))
    assert code == 0 and "-> cancelled user:sam: superseded" in shown
    assert "requeues: 0" in shown and "why pending: -" in shown  # cancelled before any run


def test_wait_gives_up_honestly_when_nothing_moves_the_task(
    demo: Demo, token: str, tmp_path: Path, capsys
) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text("queue: serve\ngpu_milli: 100\ncommand: [python, serve.py]\n")
    code, out, err = _cli(
        capsys, demo, token, "submit", str(spec), "--wait", "--timeout", "1", "--interval", "0.2"
    )
    assert code == 124
    assert "pending" in out and "gave up after 1 s" in err


def test_bad_input_comes_back_as_field_messages(demo: Demo, token: str, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "queue: train\ngpu_count: 3\ngpu_milli: 500\nallowed_gpu_models: [H900]\ncommand: [python, x.py]\n"
    )
    code, _, err = _cli(capsys, demo, token, "submit", str(spec))
    assert code == 65  # refused as invalid (docs/ci.md, exit codes)
    assert "allowed_gpu_models: unknown GPU model 'H900'" in err
    assert "gpu_milli: a share below a whole GPU (500 milli) is for one GPU" in err


def test_another_tenants_task_is_not_found(demo: Demo, token: str, capsys) -> None:
    vision_task = 1  # the demo seeds vision's tasks first
    code, _, err = _cli(capsys, demo, token, "tasks", "cancel", str(vision_task))
    assert code == 65 and f"no task {vision_task} (or not one this token's tenant can see)" in err


def test_a_listing_into_a_reader_that_went_away_ends_quietly(demo: Demo, token: str) -> None:
    """`whalegen tasks ls | head -1` in a pipeline: the reader is gone before the listing is written. The
    command stops as a Unix tool that SIGPIPE ended would (exit 141), with no traceback on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "whalegen", "tasks", "ls", "--server", demo.url, "--token", token],
            cwd=ROOT,
            env=demo.env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
