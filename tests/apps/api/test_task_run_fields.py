"""Where a task runs and why it failed, as the API shows them: `working_dir` (absolute, on the GPU host)
is taken at submission and echoed; `failure_reason` says why a failed task failed, and is blank
otherwise."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.workloads.models import Task

GOOD = {"tenant": "vision", "queue": "train", "command": ["python", "train.py"]}

pytestmark = pytest.mark.django_db


def _post(client: Any, body: Any) -> Any:
    return client.post("/api/v1/tasks/", json.dumps(body), content_type="application/json")


def test_a_working_directory_is_stored_and_shown(world: Any, api: Any) -> None:
    answer = _post(api(world.alice), {**GOOD, "working_dir": "/data/vision/run 7"})
    assert answer.status_code == 201, answer.json()
    assert answer.json()["working_dir"] == "/data/vision/run 7"
    assert Task.objects.get(pk=answer.json()["id"]).working_dir == "/data/vision/run 7"
    shown = api(world.alice).get(f"/api/v1/tasks/{answer.json()['id']}/").json()
    assert shown["working_dir"] == "/data/vision/run 7"


def test_without_one_it_is_blank(world: Any, api: Any) -> None:
    answer = _post(api(world.alice), GOOD)
    assert answer.status_code == 201 and answer.json()["working_dir"] == ""


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("data/vision", "absolute path"),
        ("~/vision", "absolute path"),
        ("/" + "x" * 1024, "no more than 1024"),
        ("/data/\u0000", "nul"),
        (7, "string"),
    ],
    ids=["relative", "a home-relative path (never expanded)", "too long", "a NUL", "not a string"],
)
def test_a_working_directory_that_cannot_be_one_is_a_400_and_stores_nothing(
    world: Any, api: Any, value: Any, words: str
) -> None:
    before = Task.objects.count()
    answer = _post(api(world.alice), {**GOOD, "working_dir": value})
    assert answer.status_code == 400
    body = json.dumps(answer.json()).lower()
    assert "working_dir" in body and words in body, body
    assert Task.objects.count() == before


def test_a_failed_task_says_why_and_other_states_say_nothing(world: Any, api: Any) -> None:
    from apps.workloads.services import task_cancel, task_transition

    client = api(world.alice)
    assert client.get(f"/api/v1/tasks/{world.task_a.pk}/").json()["failure_reason"] == ""
    why = "launch failed: cannot run 'x': No such file or directory"
    task_transition(task=world.task_a, to_state=Task.State.FAILED, actor="agent", reason=why, exit_code=127)
    shown = client.get(f"/api/v1/tasks/{world.task_a.pk}/").json()
    assert (shown["state"], shown["exit_code"]) == ("failed", 127)
    assert shown["failure_reason"] == "launch failed: cannot run 'x': No such file or directory"
    listed = client.get("/api/v1/tasks/", {"state": "failed"}).json()["results"]
    assert [t["failure_reason"] for t in listed] == [shown["failure_reason"]]
    task_cancel(task=world.task_b, by=world.bob)
    assert api(world.bob).get(f"/api/v1/tasks/{world.task_b.pk}/").json()["failure_reason"] == ""
