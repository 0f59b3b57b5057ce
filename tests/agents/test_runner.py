"""Task processes: exit codes, stop escalation, max runtime, log rotation, re-adoption."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agents.runner import Finished, Runner, proc_start_ticks


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
    made = Runner(tmp_path / "tasks", log_max_bytes=2000, log_keep=2)
    yield made
    for proc in made.tasks.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_exit_code_environment_and_logs(runner: Runner) -> None:
    code = (
        "import os, sys; print(os.environ['CUDA_VISIBLE_DEVICES']); "
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
    task_dir = Path(proc.task_dir)
    assert (task_dir / "stdout.log").read_text() == "MIG-x\n"
    assert (task_dir / "stderr.log").read_text() == "oops\n"


def test_a_missing_command_exits_127(runner: Runner) -> None:
    runner.start("t2", ["/no/such/binary"], {}, device_uuid=None, now_s=time.time())
    (done,) = wait_done(runner)
    assert done.exit_code == 127


def test_stop_sends_sigterm_then_sigkill_after_the_grace(runner: Runner) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    proc = runner.start("t3", py(stubborn), {}, device_uuid=None, now_s=time.time(), stop_grace_s=0.5)
    deadline = time.monotonic() + 5
    while "up" not in (Path(proc.task_dir) / "stdout.log").read_text() and time.monotonic() < deadline:
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


def test_logs_rotate_by_copy_and_truncate_while_the_task_writes(runner: Runner) -> None:
    code = "import time\nfor i in range(40):\n    print('x' * 99, flush=True); time.sleep(0.02)"
    proc = runner.start("t6", py(code), {}, device_uuid=None, now_s=time.time())
    wait_done(runner)
    task_dir = Path(proc.task_dir)
    sizes = [(task_dir / n).stat().st_size for n in ("stdout.log", "stdout.log.1") if (task_dir / n).exists()]
    assert len(sizes) == 2 and sum(sizes) <= 4000
    assert not (task_dir / "stdout.log.3").exists()  # keeps log_keep rotated files


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
