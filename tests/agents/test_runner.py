"""Task processes: exit codes, launch failures, output capture and its cap, stop escalation, max runtime,
re-adoption."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agents import capture
from agents.runner import Finished, Runner, proc_start_ticks, remaining_output


def wait_done(runner: Runner, timeout_s: float = 10.0) -> list[Finished]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = runner.poll(time.time())
        if done:
            return done
        time.sleep(0.05)
    raise AssertionError("task did not finish")


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def runner(tmp_path: Path):  # type: ignore[no-untyped-def]
    made = Runner(tmp_path / "tasks", log_cap_bytes=8192)
    yield made
    for proc in made.tasks.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_exit_code_environment_and_logs(runner: Runner) -> None:
    code = (
        "import os, sys; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
        "print('oops', file=sys.stderr); sys.exit(7)"
    )
    proc = runner.start(
        "t1",
        py(code),
        {"CUDA_VISIBLE_DEVICES": "MIG-x", "PATH": os.environ["PATH"]},
        device_uuid="MIG-x",
        now_s=time.time(),
    )
    (done,) = wait_done(runner)
    assert (done.task_id, done.exit_code, done.signal, done.lost) == ("t1", 7, None, False)
    lines = capture.read_all(Path(proc.task_dir) / "output")
    assert [(line.stream, line.text) for line in lines] == [
        ("stdout", "MIG-x"),
        ("stderr", "oops"),
        ("launcher", "exited with code 7"),
    ]
    assert all(line.at_s > time.time() - 60 for line in lines)


@pytest.mark.parametrize(
    ("command", "code", "words"),
    [
        (["/no/such/binary"], 127, "cannot run '/no/such/binary': No such file or directory"),
        (["/tmp"], 126, "cannot run '/tmp': Permission denied"),  # a directory, even for root
        ([], 127, "the task has no command to run"),
    ],
    ids=[
        "a missing executable exits 127",
        "a program that cannot be executed exits 126",
        "no command at all",
    ],
)
def test_a_command_that_cannot_start_ends_with_the_launchers_message(
    runner: Runner, command: list[str], code: int, words: str
) -> None:
    proc = runner.start("t2", command, {}, device_uuid=None, now_s=time.time())
    (done,) = wait_done(runner)
    assert done.exit_code == code and words in done.launch_error and not done.lost
    said = capture.read_all(Path(proc.task_dir) / "output")
    assert [(line.stream, words in line.text) for line in said] == [("launcher", True)]


def test_the_command_starts_in_the_working_directory_it_was_given(runner: Runner, tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    proc = runner.start("t3", py("import os; print(os.getcwd())"), {"PATH": os.environ["PATH"]},
                        device_uuid=None, now_s=time.time(), working_dir=str(tmp_path / "here"))  # fmt: skip
    (done,) = wait_done(runner)
    assert done.exit_code == 0
    said = capture.read_all(Path(proc.task_dir) / "output")
    assert [(line.stream, line.text) for line in said] == [("stdout", str(tmp_path / "here"))]


def test_without_a_working_directory_the_command_starts_in_its_run_directory(runner: Runner) -> None:
    proc = runner.start("t4", py("import os; print(os.getcwd())"), {}, device_uuid=None, now_s=time.time())
    wait_done(runner)
    said = capture.read_all(Path(proc.task_dir) / "output")
    assert [line.text for line in said] == [proc.task_dir]


@pytest.mark.parametrize(
    ("name", "words"),
    [("missing", "No such file or directory"), ("a-file", "Not a directory")],
    ids=["a directory that does not exist", "a file, not a directory"],
)
def test_a_working_directory_that_cannot_be_entered_fails_the_run_with_126_and_why(
    runner: Runner, tmp_path: Path, name: str, words: str
) -> None:
    (tmp_path / "a-file").write_text("")
    where = str(tmp_path / name)
    proc = runner.start("t5", ["true"], {"PATH": os.environ["PATH"]}, device_uuid=None, now_s=time.time(),
                        working_dir=where)  # fmt: skip
    (done,) = wait_done(runner)
    message = f"cannot change to working directory {where!r}: {words}"
    assert done.exit_code == 126 and message in done.launch_error and not done.lost
    said = capture.read_all(Path(proc.task_dir) / "output")
    assert [(line.stream, message in line.text) for line in said] == [("launcher", True)]


def test_stop_sends_sigterm_then_sigkill_after_the_grace(runner: Runner) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    proc = runner.start("t3", py(stubborn), {}, device_uuid=None, now_s=time.time(), stop_grace_s=0.5)
    deadline = time.monotonic() + 5
    while (
        "up" not in capture.stream_text(Path(proc.task_dir) / "output", "stdout")
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    runner.stop("t3", "stopped by the plane", time.time())
    (done,) = wait_done(runner)
    assert done.signal == signal.SIGKILL and done.reason == "stopped by the plane"
    polite = runner.start("t4", py("import time; time.sleep(60)"), {}, device_uuid=None, now_s=time.time())
    runner.stop("t4", "bye", time.time())
    (done,) = wait_done(runner)
    assert done.signal == signal.SIGTERM and polite.killed is False  # exit recorded by the launcher


def test_max_runtime_is_enforced(runner: Runner) -> None:
    runner.start(
        "t5",
        py("import time; time.sleep(60)"),
        {},
        device_uuid=None,
        now_s=time.time(),
        max_runtime_s=0.3,
        stop_grace_s=5,
    )
    (done,) = wait_done(runner)
    assert done.reason.startswith("max_runtime_exceeded") and done.signal == signal.SIGTERM


def test_the_cap_keeps_the_head_and_the_tail_and_counts_what_it_dropped(runner: Runner) -> None:
    code = (
        "import sys\nfor i in range(2000):\n"
        "    print(f'line {i:05d}', file=sys.stderr if i % 50 == 7 else sys.stdout, flush=True)"
    )
    proc = runner.start("t6", py(code), {}, device_uuid=None, now_s=time.time())
    (done,) = wait_done(runner)
    output = Path(proc.task_dir) / "output"
    on_disk = sum(path.stat().st_size for path in output.iterdir())
    assert on_disk <= 8192 + 2048  # the cap and at most one segment of a quarter of its tail half
    batches = remaining_output(done, max_bytes=1 << 20)
    head, tail = batches[0], batches[-1]
    assert head.first_line == 0 and head.dropped_lines == 0
    assert [line.text for line in head.lines[:3]] == ["line 00000", "line 00001", "line 00002"]
    # The output's last line is kept. Across the two pipes order is only as fine as one 4 KiB read: when
    # both pipes are ready in the same round a stderr line (1957, say) may be the last record written.
    assert [line.text for line in tail.lines if line.stream == "stdout"][-1] == "line 01999"
    assert tail.dropped_lines > 0
    # Each stream keeps its order.
    numbers = [int(line.text[5:]) for b in batches for line in b.lines if line.stream == "stdout"]
    assert numbers == sorted(numbers)
    kept = sum(len(batch.lines) for batch in batches)
    dropped = sum(batch.dropped_lines for batch in batches)
    assert kept + dropped == 2000  # every line is either shipped or counted as dropped
    assert sum(batch.dropped_bytes for batch in batches) == dropped * len(b"1234567890.123456 o line 00000\n")


def test_a_new_runner_adopts_a_live_task_and_learns_its_exit_code_from_the_launcher(tmp_path: Path) -> None:
    first = Runner(tmp_path / "tasks")
    first.start(
        "t7", py("import time, sys; time.sleep(0.8); sys.exit(4)"), {}, device_uuid=None, now_s=time.time()
    )
    record = first.records()[0]
    assert "popen" not in record and record["proc_start_ticks"] == proc_start_ticks(record["pid"])
    second = Runner(tmp_path / "tasks")
    assert second.adopt(record) is None and "t7" in second.tasks
    first.tasks["t7"].popen.wait()  # type: ignore[union-attr]  # reap it as its real parent would
    (done,) = wait_done(second)
    assert done.exit_code == 4 and not done.lost


def test_adopting_a_pid_that_was_reused_reports_the_task_lost(tmp_path: Path) -> None:
    runner = Runner(tmp_path / "tasks")
    task_dir = tmp_path / "tasks" / "t8"
    task_dir.mkdir(parents=True)
    record = {
        "task_id": "t8",
        "pid": os.getpid(),
        "started_at_s": 0.0,
        "device_uuid": None,
        "task_dir": str(task_dir),
        "max_runtime_s": None,
        "stop_grace_s": 1.0,
        "proc_start_ticks": 1,
    }
    done = runner.adopt(record)
    assert done is not None and done.lost and done.reason == "exit status unknown"
