"""The README's first example, as a newcomer runs it: against `whalegen demo`, with the token and the
queue the demo prints, `whalegen submit task.yaml --wait` shows the task's output and exits 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.whalegen.commands.conftest import ROOT, Demo
from whalegen.cli import main


def readme_task_yaml() -> str:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"cat > task\.yaml <<'YAML'\n(.*?)\nYAML\n", readme, re.DOTALL)
    assert found, "README lost its task.yaml example"
    return found.group(1) + "\n"


def test_the_readme_example_runs_to_success_in_the_demo_and_shows_its_output(
    demo: Demo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    announced = "".join(demo.output)
    assert re.search(r"^\s+speech\s+.*\btrain \(pool h200-train\)", announced, re.MULTILINE)  # the queue
    spec = tmp_path / "task.yaml"
    spec.write_text(readme_task_yaml())
    argv = ["submit", str(spec), "--wait", "--timeout", "120"]  # the README runs it with the defaults
    code = main([*argv, "--server", demo.url, "--token", demo.tokens["speech"]])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [line for line in out.splitlines() if line.startswith("step ")] == ["step 1", "step 2", "step 3"]
    assert re.search(r"^GPUs: GPU-", out, re.MULTILINE)  # it ran on a GPU the demo's agent gave it
    assert out.splitlines()[-1].endswith(": succeeded exit code 0")
    # State changes come in the order they happened: "running" before the output the run wrote.
    lines = out.splitlines()
    first_output = next(i for i, line in enumerate(lines) if line.startswith("GPUs: "))
    assert any(line.endswith(": running") for line in lines[:first_output]), out
