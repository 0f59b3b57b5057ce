"""A task's working directory on its way to the agent: a 1.3 agent gets the field, an older one (which
would ignore it and start the command in the wrong place) gets the command wrapped in a shell that
enters the directory first, with the same 126 when it cannot."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.apps.fleet.conftest import assign
from tests.apps.fleet.test_agent_api import desired, register
from whalegen import protocol as p

pytestmark = pytest.mark.django_db


def _spec_for(fleet: Any, agent_client: Any, version: str, working_dir: str) -> p.TaskSpec:
    client = agent_client(fleet.token_a)
    assert register(client, version=version).status_code == 200
    fleet.task_a.command = ["cat", "data.txt"]
    fleet.task_a.working_dir = working_dir
    fleet.task_a.save(update_fields=["command", "working_dir"])
    assign(fleet.task_a, fleet.node, [fleet.whole_unit])
    (spec,) = p.DesiredState.from_dict(desired(client).json()).tasks
    return spec


def test_a_current_agent_gets_the_working_directory_as_a_field(fleet: Any, agent_client: Any) -> None:
    spec = _spec_for(fleet, agent_client, p.PROTOCOL_VERSION, "/data/project")
    assert (spec.working_dir, spec.command) == ("/data/project", ("cat", "data.txt"))


def test_without_one_the_spec_names_none(fleet: Any, agent_client: Any) -> None:
    spec = _spec_for(fleet, agent_client, p.PROTOCOL_VERSION, "")
    assert (spec.working_dir, spec.command) == ("", ("cat", "data.txt"))


def test_an_older_agent_gets_a_command_that_enters_the_directory_itself(
    fleet: Any, agent_client: Any, tmp_path: Path
) -> None:
    (tmp_path / "data.txt").write_text("found it\n")
    spec = _spec_for(fleet, agent_client, "1.2", str(tmp_path))
    assert spec.working_dir == ""  # the 1.2 agent would not read it anyway
    ran = subprocess.run(list(spec.command), capture_output=True, text=True, timeout=10)
    assert (ran.returncode, ran.stdout) == (0, "found it\n")


def test_the_older_agents_wrapped_command_fails_with_126_where_the_directory_is_missing(
    tmp_path: Path,
) -> None:
    command = p.in_directory(str(tmp_path / "missing"), ("true",))
    ran = subprocess.run(list(command), capture_output=True, text=True, timeout=10)
    assert ran.returncode == 126
    assert f"cannot change to working directory {tmp_path / 'missing'}" in ran.stderr
