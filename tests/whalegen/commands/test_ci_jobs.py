"""A CI runner with nothing but `pip install 'whalegen[client]'`: a fresh venv (no Django, no plane
dependencies) runs `whalegen submit --wait` against a live `whalegen demo` and exits with the task's exit
code; the example jobs of docs/ci.md (docs/ci/gitlab-ci.yml, docs/ci/github-actions.yml) run their own
shell lines, as the runner would, against the same plane: submit with the pipeline's id as idempotency
key, stream the output, exit with the task's code, cancel the task when the job is cancelled."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.whalegen.commands.conftest import ROOT, Demo
from tests.whalegen.commands.test_readme_example import readme_task_yaml

DOCS_CI = ROOT / "docs" / "ci"
RUN_TIMEOUT_S = 180
# What the runner's image has (a shell and coreutils); nothing of the checkout's own venv.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class Runner:
    """A CI runner: a fresh venv holding `whalegen[client]` and what it pulled in, nothing else."""

    bin: Path
    demo: Demo

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:{SYSTEM_PATH}",
            "HOME": os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "WHALEGEN_URL": self.demo.url,
            "WHALEGEN_TOKEN": self.demo.tokens["speech"],
            **extra,
        }

    def run(self, argv: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=cwd, env=self.env(**extra), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )


@pytest.fixture(scope="module")
def runner(demo: Demo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    # The package as pip sees it, copied out of the checkout so that the build (setuptools writes
    # build/ next to pyproject.toml) leaves the checkout alone.
    source = tmp_path_factory.mktemp("whalegen-source")
    shutil.copy2(ROOT / "pyproject.toml", source)
    shutil.copy2(ROOT / "README.md", source)
    for package in ("whalegen", "apps", "agents"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path_factory.mktemp("client-venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", f"{source}[client]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    yield Runner(bin=venv / "bin", demo=demo)


def _task_file(directory: Path, content: str) -> Path:
    (directory / "task.yaml").write_text(content)
    return directory / "task.yaml"


def _checkout(tmp_path: Path, task: str) -> Path:
    """A pipeline's checkout: the task file and docs/ci's scripts copied to ci/, as docs/ci.md says."""
    shutil.copytree(DOCS_CI, tmp_path / "ci", ignore=shutil.ignore_patterns("*.yml"))
    _task_file(tmp_path, task)
    return tmp_path


def _gitlab_job() -> dict:
    return yaml.safe_load((DOCS_CI / "gitlab-ci.yml").read_text())["train"]


def _github_steps() -> list[dict]:
    return yaml.safe_load((DOCS_CI / "github-actions.yml").read_text())["jobs"]["train"]["steps"]


def _github_step(words: str) -> str:
    return next(step["run"] for step in _github_steps() if words in step.get("run", ""))


# The runners' shells: GitLab runs `script` lines in one shell that stops at the first failure; GitHub
# runs each step's `run` with `bash -e` (sh here: the scripts are POSIX).
def _shell(lines: list[str] | str) -> list[str]:
    return ["sh", "-e", "-c", lines if isinstance(lines, str) else "\n".join(lines)]


def _task_id(output: str) -> int:
    return int(next(line for line in output.splitlines() if line.startswith("task ")).split()[1].rstrip(":"))


FAILING_TASK = "queue: train\nname: ci-fails\ncommand: [sh, -c, 'echo working; echo boom >&2; exit 3']\n"
LONG_TASK = "queue: train\nname: ci-long\ncommand: [sleep, '600']\n"


def test_the_client_extra_installs_the_cli_without_the_planes_dependencies(runner: Runner, tmp_path) -> None:
    python = str(runner.bin / "python")
    missing = runner.run([python, "-c", "import django"], tmp_path)
    assert missing.returncode != 0 and "No module named 'django'" in missing.stderr
    for argv in (["--help"], ["submit", "--help"], ["tasks", "--help"], ["tasks", "wait", "--help"]):
        done = runner.run(["whalegen", *argv], tmp_path)
        assert done.returncode == 0, done.stderr
    listing = runner.run(["whalegen", "tasks", "ls", "--limit", "1"], tmp_path)
    assert listing.returncode == 0 and listing.stdout.startswith("    ID  STATE"), listing.stderr


@pytest.mark.parametrize(
    ("task", "want_code", "want_out", "want_err"),
    [
        (readme_task_yaml(), 0, "step 3", ""),
        (FAILING_TASK, 3, "working", "boom"),
    ],
    ids=["a task that succeeds exits 0", "a task that exits 3 exits 3"],
)
def test_submit_wait_in_the_client_venv_exits_with_the_tasks_code(
    runner: Runner, tmp_path: Path, task: str, want_code: int, want_out: str, want_err: str
) -> None:
    spec = _task_file(tmp_path, task)
    done = runner.run(["whalegen", "submit", str(spec), "--wait", "--timeout", "120"], tmp_path)
    assert done.returncode == want_code, done.stdout + done.stderr
    assert want_out in done.stdout and want_err in done.stderr
    assert done.stdout.splitlines()[-1].endswith(f"exit code {want_code}")


def test_the_gitlab_job_runs_the_task_and_a_retried_job_finds_the_same_task(
    runner: Runner, tmp_path: Path
) -> None:
    checkout = _checkout(tmp_path, readme_task_yaml())
    ci = {"CI_PIPELINE_ID": f"{time.time_ns()}", "CI_JOB_NAME": "train"}
    first = runner.run(_shell(_gitlab_job()["script"]), checkout, **ci)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "step 3" in first.stdout and first.stdout.splitlines()[-1].endswith("succeeded exit code 0")
    retried = runner.run(_shell(_gitlab_job()["script"]), checkout, **ci)
    assert retried.returncode == 0, retried.stderr
    assert _task_id(retried.stdout) == _task_id(first.stdout)  # no second task for the same pipeline


def test_the_github_job_exits_with_the_tasks_exit_code(runner: Runner, tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, FAILING_TASK)
    ci = {"GITHUB_RUN_ID": f"{time.time_ns()}", "GITHUB_JOB": "train"}
    done = runner.run(_shell(_github_step("whalegen-job.sh")), checkout, **ci)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "working" in done.stdout and "boom" in done.stderr


def test_an_empty_pipeline_id_is_warned_and_the_task_still_submitted(runner: Runner, tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, readme_task_yaml())
    done = runner.run(_shell(_gitlab_job()["script"]), checkout, CI_PIPELINE_ID="", CI_JOB_NAME="")
    assert done.returncode == 0, done.stderr
    # "$CI_PIPELINE_ID-$CI_JOB_NAME" with both unset is "-": not empty, so it is a key. The CLI warns
    # only on a key with nothing in it, as `--idempotency-key "$CI_PIPELINE_ID"` gives.
    spec = checkout / "task.yaml"
    bare = runner.run(["whalegen", "submit", str(spec), "--idempotency-key", ""], checkout)
    assert bare.returncode == 0
    assert "warning: the idempotency key is empty" in bare.stderr and "submitting without one" in bare.stderr
    again = runner.run(["whalegen", "submit", str(spec), "--idempotency-key", ""], checkout)
    assert _task_id(again.stdout) != _task_id(bare.stdout)  # what the warning says: a new task each time


def _start_job(runner: Runner, checkout: Path, ci: str) -> subprocess.Popen[str]:
    """The job's script lines running in the background, in a session of their own: a signal goes to
    the job's process group, as a runner sends it."""
    if ci == "gitlab":
        lines, variables = (
            _gitlab_job()["script"],
            {"CI_PIPELINE_ID": f"{time.time_ns()}", "CI_JOB_NAME": "train"},
        )
    else:
        lines, variables = (
            _github_step("whalegen-job.sh"),
            {"GITHUB_RUN_ID": f"{time.time_ns()}", "GITHUB_JOB": "train"},
        )
    return subprocess.Popen(
        _shell(lines),
        cwd=checkout,
        env=runner.env(**variables),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # A runner starts its job with SIGINT and SIGTERM at their defaults. This test's own process may
        # have SIGINT ignored (started in the background by a non-interactive shell, as a CI script can
        # be), and a shell that starts with a signal ignored cannot trap it (POSIX).
        preexec_fn=_default_signals,
    )


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _recorded_task(checkout: Path, job: subprocess.Popen[str]) -> int:
    record = checkout / ".whalegen-task"
    deadline = time.monotonic() + 60
    while not (record.exists() and record.read_text().strip()):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "the job did not record its task"
        time.sleep(0.1)
    time.sleep(1.0)  # the wait has started (and set the trap)
    return int(record.read_text())


def _cancel_reason(runner: Runner, checkout: Path, task_id: int, said: str = "") -> str:
    shown = runner.run(["whalegen", "tasks", "show", str(task_id)], checkout)
    assert shown.returncode == 0, shown.stderr
    assert " state: cancelled" in shown.stdout, f"{shown.stdout}\nthe cancel step said:\n{said}"
    return next(line for line in shown.stdout.splitlines() if "cancel reason" in line)


@pytest.mark.parametrize(
    ("ci", "how", "want_code"),
    [("gitlab", signal.SIGTERM, 143), ("github", signal.SIGINT, 130)],
    ids=["a GitLab job sent SIGTERM cancels its task", "a GitHub job sent SIGINT cancels its task"],
)
def test_a_cancelled_job_cancels_its_task(
    runner: Runner, tmp_path: Path, ci: str, how: signal.Signals, want_code: int
) -> None:
    checkout = _checkout(tmp_path, LONG_TASK)
    job = _start_job(runner, checkout, ci)
    try:
        task_id = _recorded_task(checkout, job)
        os.killpg(job.pid, how)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    # The runner's own shell around the script is signalled too and may die of it (-signal); the
    # script itself cancels the task and exits 128 + the signal.
    assert job.returncode in (want_code, -how), out + err
    assert f"task {task_id}: cancelled" in out, out + err
    assert _cancel_reason(runner, checkout, task_id).endswith("CI job cancelled")


@pytest.mark.parametrize(
    "ci", ["gitlab", "github"], ids=["GitLab's after_script", "GitHub's cancelled() step"]
)
def test_the_cancel_step_cancels_the_task_of_a_job_killed_without_a_signal_it_could_catch(
    runner: Runner, tmp_path: Path, ci: str
) -> None:
    checkout = _checkout(tmp_path, LONG_TASK)
    job = _start_job(runner, checkout, ci)
    try:
        task_id = _recorded_task(checkout, job)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate(timeout=60)
    if ci == "gitlab":
        cleanup = runner.run(_shell(_gitlab_job()["after_script"]), checkout, CI_JOB_STATUS="canceled")
    else:
        cleanup = runner.run(_shell(_github_step("whalegen-cancel.sh")), checkout)
    assert cleanup.returncode == 0, cleanup.stderr
    said = cleanup.stdout + cleanup.stderr
    assert _cancel_reason(runner, checkout, task_id, said).endswith("CI job cancelled")
    again = runner.run(_shell(_github_step("whalegen-cancel.sh")), checkout)  # a task already over
    assert again.returncode == 0


def test_the_cancel_step_asks_again_while_the_plane_is_away_and_still_exits_0(
    runner: Runner, tmp_path: Path
) -> None:
    checkout = _checkout(tmp_path, LONG_TASK)
    (checkout / ".whalegen-task").write_text("7\n")
    away = runner.run(_shell(_github_step("whalegen-cancel.sh")), checkout, WHALEGEN_URL="http://127.0.0.1:9")
    assert away.returncode == 0, away.stderr
    assert away.stderr.count("cannot reach the plane") == 5, away.stderr


def test_docs_ci_shows_the_jobs_the_tests_run() -> None:
    guide = (ROOT / "docs" / "ci.md").read_text()
    for name in ("gitlab-ci.yml", "github-actions.yml"):
        assert (DOCS_CI / name).read_text().strip() in guide, f"docs/ci.md lost docs/ci/{name}"
