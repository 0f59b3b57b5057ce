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


# Each way a pipeline's `whalegen` run can end, against the live plane: (argv after the command's
# name, the task file, the exit code wanted, words stderr must hold). `{url}` is the demo's URL, `{t}`
# the token; a case without `--server`/`--token` of its own gets the demo's.
EXIT_CASES = [
    (["tasks", "ls", "--server", "{url}/api/v1/"], None, 0, ""),
    (["submit", "{file}"], "queue: train\ncommand: [x, {a: 1}]\n", 65,
     'command[1]: not a valid string: {"a": 1} is a mapping; write text'),
    (["submit", "{file}"], "queue: nope\ncommand: [x]\n", 65,
     "queue: tenant 'speech' has no queue named 'nope'\n"
     "    its queues: serve (pool l4-infer), train (pool h200-train)"),
    (["submit", "{file}"], "queue: train\ngpu_count: 2000\ncommand: [x]\n", 65,
     "gpu_count: 2000 is out of range; write a number at most 1024"),
    (["submit", "{file}"], "queue: [train\n", 65, "cannot read"),
    (["submit", "{file}"], "queue: train\ngpu_count: 9\ncommand: [x]\n", 66,
     "gpu_count: no node of pool 'h200-train' (2 nodes) could ever take this task: it asks 9 GPUs (the "
     "largest node has 8); a gang of 3 tasks with 3 GPUs each would fit (gang_id, gang_size: 3)"),
    (["submit", "{file}"], "queue: train\ngpu_count: 13\ncommand: [x]\n", 66,
     "the task asks 13 GPUs; tenant 'speech' may hold at most 12 GPUs in pool 'h200-train' (8 GPUs "
     "guaranteed + 4 GPUs borrowable), so it could never be admitted"),
    (["tasks", "show", "999999"], None, 65, "no task 999999 (or not one this token's tenant can see)"),
    (["tasks", "ls", "--server", "http://127.0.0.1:9"], None, 69,
     "whalegen: cannot reach the plane at http://127.0.0.1:9: connection refused\n"),
    (["tasks", "ls", "--token", "wg_not-a-token"], None, 77,
     "the plane did not accept the token or does not allow this (HTTP 401)"),
    (["tasks", "ls", "--token", ""], None, 77, "no API token; pass --token or set WHALEGEN_TOKEN"),
    (["tasks", "ls", "--server", "{host}"], None, 78, "--server is '{host}', which has no scheme; write http://{host}"),
    (["submit", "{file}", "--wait", "--timeout", "0.5", "--interval", "0.2"],
     "queue: serve\ngpu_milli: 100\ncommand: [sleep, '600']\n", 124, "gave up after 0.5 s"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "task", "want_code", "want_err"),
    EXIT_CASES,
    ids=[
        "the API URL the demo prints works as the server",
        "a nested field error is a path in plain words: 65",
        "an unknown queue lists the team's queues: 65",
        "a number out of range quotes it and says the bound: 65",
        "a task file that is not YAML: 65",
        "larger than any node of the pool, with the gang that would fit: 66",
        "above the team's limit even with all its work ended: 66",
        "a task that does not exist: 65",
        "a plane nobody answers for: 69",
        "a token the plane does not know: 77",
        "no token at all: 77",
        "a URL without a scheme: 78",
        "waiting past --timeout: 124",
    ],
)
def test_each_way_a_run_ends_has_its_exit_code_and_sentence(
    demo: Demo, token: str, tmp_path: Path, monkeypatch, capsys, argv, task, want_code, want_err
) -> None:
    monkeypatch.delenv("WHALEGEN_TOKEN", raising=False)
    monkeypatch.delenv("WHALEGEN_URL", raising=False)
    spec = tmp_path / "task.yaml"
    if task is not None:
        spec.write_text(task)
    host = demo.url.removeprefix("http://")
    fill = {"{url}": demo.url, "{file}": str(spec), "{host}": host}

    def filled(text: str) -> str:
        for mark, value in fill.items():
            text = text.replace(mark, value)
        return text

    argv = [filled(arg) for arg in argv]
    if "--server" not in argv:
        argv += ["--server", demo.url]
    if "--token" not in argv:
        argv += ["--token", token]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == want_code, err
    assert filled(want_err) in err
    assert "Traceback" not in err and "HTTP 0" not in err and "{'" not in err and "['" not in err


def test_yaml_numbers_in_command_and_env_are_sent_as_the_text_typed(
    demo: Demo, token: str, tmp_path: Path, capsys
) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text("queue: train\ncommand: [sh, -c, 'exit 0', 3, 0.10, true]\nenv: {EPOCHS: 3, PIN: 1234}\n")
    code, out, err = _cli(capsys, demo, token, "submit", str(spec))
    assert code == 0, err
    assert 'whalegen: note: command[3]: took 3 as the string "3" (argv items are text)' in err
    assert (
        'command[4]: took 0.10 as the string "0.10"' in err
        and 'command[5]: took true as the string "true"' in err
    )
    assert "whalegen: note: env.PIN: took the value as a string (env values are text)" in err
    assert "1234" not in err  # env values may be secrets: never echoed
    code, shown, _ = _cli(capsys, demo, token, "tasks", "show", out.split()[1].rstrip(":"))
    assert "command: sh -c 'exit 0' 3 0.10 true" in shown


def test_env_and_bulk_refusals_name_the_field_by_path_without_echoing_env_values(
    demo: Demo, token: str, tmp_path: Path, capsys
) -> None:
    spec = tmp_path / "bulk.yaml"
    spec.write_text(
        "tasks:\n  - queue: train\n    command: [x]\n"
        "  - queue: train\n    command: [x, null]\n    env: {SECRET: [hunter2]}\n"
    )
    code, _, err = _cli(capsys, demo, token, "submit", str(spec))
    assert code == 65, err
    assert (
        'tasks[1].command[1]: is null (nothing after the colon); write a value, or "" for an empty string'
        in err
    )
    assert "tasks[1].env.SECRET: not a valid string: the value is a list; write text" in err
    assert "hunter2" not in err
    spec.write_text("tasks:\n  - queue: train\n    command: [x]\n  - queue: nope\n    command: [x]\n")
    code, _, err = _cli(capsys, demo, token, "submit", str(spec))
    assert code == 65, err
    assert "task 1 of the 2 submitted was refused; nothing was stored" in err
    assert "tasks[1].queue: tenant 'speech' has no queue named 'nope'" in err
    assert "its queues: serve (pool l4-infer), train (pool h200-train)" in err


def test_logs_of_an_attempt_the_task_never_had_says_which_it_has(
    demo: Demo, token: str, tmp_path: Path, capsys
) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text("queue: train\ncommand: [sh, -c, 'echo once']\n")
    code, out, _ = _cli(capsys, demo, token, "submit", str(spec), "--wait", "--timeout", "120")
    assert code == 0, out
    task_id = out.split()[1].rstrip(":")
    code, out, err = _cli(capsys, demo, token, "tasks", "logs", task_id, "--attempt", "5")
    assert code == 65 and out == ""
    assert f"whalegen: task {task_id} has no attempt 5; it has one: attempt 0" in err
    code, out, _ = _cli(capsys, demo, token, "tasks", "logs", task_id, "--attempt", "0")
    assert code == 0 and out == "once\n"
