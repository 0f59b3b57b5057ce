"""Secrets stay secret (issue 37, item 6): a task's `env` values reach only the node that runs it (its
desired state); the API, the CLI, the dashboard and the admin show the keys, never the values."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from django.test import Client

from apps.workloads.services import TaskSubmission, task_submit
from whalegen.commands import tasks as tasks_command

pytestmark = pytest.mark.django_db

SECRET = "sekret-123"


@pytest.fixture
def secret_task(world: Any) -> Any:
    request = TaskSubmission(
        queue="train", command=["python", "train.py"], env={"HF_TOKEN": SECRET, "MODE": "x"}
    )
    task, _ = task_submit(tenant=world.tenant_a, request=request, submitted_by=world.alice)
    return task


def test_no_api_answer_carries_an_env_value(world: Any, api: Any) -> None:
    client = api(world.alice)
    body = {"queue": "train", "command": ["true"], "env": {"HF_TOKEN": SECRET}}
    created = client.post("/api/v1/tasks/", body, format="json")
    assert created.status_code == 201
    bulk = client.post("/api/v1/tasks/bulk/", {"tasks": [body]}, format="json")
    assert bulk.status_code == 201
    task_id = created.json()["id"]
    answers = [
        created,
        bulk,
        client.post("/api/v1/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"),
        client.post("/api/v1/tasks/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"),  # the replay
        client.get(f"/api/v1/tasks/{task_id}/"),
        client.get("/api/v1/tasks/"),
        client.get(f"/api/v1/tasks/{task_id}/events/"),
        api(world.root).get("/api/v1/tasks/"),
    ]
    for answer in answers:
        assert answer.status_code < 300
        assert SECRET not in answer.content.decode()
    assert created.json()["env_keys"] == ["HF_TOKEN"]
    assert "env" not in created.json()


def test_a_refused_submission_does_not_echo_an_env_value(world: Any, api: Any) -> None:
    body = {"queue": "nope", "command": ["true"], "env": {"HF_TOKEN": SECRET}}
    answer = api(world.alice).post("/api/v1/tasks/", body, format="json")
    assert answer.status_code == 400
    assert SECRET not in answer.content.decode()


def test_the_dashboard_task_page_shows_keys_only(world: Any, secret_task: Any) -> None:
    client = Client()
    client.force_login(world.alice)
    page = client.get(f"/tasks/{secret_task.pk}/").content.decode()
    assert "HF_TOKEN" in page
    assert SECRET not in page
    for url in ("/", "/tasks/"):
        assert SECRET not in client.get(url).content.decode()


def test_the_admin_shows_keys_only(world: Any, secret_task: Any) -> None:
    client = Client()
    client.force_login(world.root)
    page = client.get(f"/admin/workloads/task/{secret_task.pk}/change/")
    assert page.status_code == 200
    assert "HF_TOKEN" in page.content.decode()
    assert SECRET not in page.content.decode()
    assert SECRET not in client.get("/admin/workloads/task/").content.decode()


class _ApiClientAsCli:
    """The CLI's `Client.call`, answered by the API in this process (no server to start)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def call(self, method: str, path: str, *, params: Any = None, **_: Any) -> Any:
        answer = (
            self.client.generic(method, "/api/v1" + path)
            if params is None
            else self.client.get("/api/v1" + path, params)
        )
        assert answer.status_code == 200, answer.content
        return answer.json()


def test_the_cli_shows_keys_runtime_and_no_value(world: Any, api: Any, secret_task: Any, capsys: Any) -> None:
    cli = _ApiClientAsCli(api(world.alice))
    assert tasks_command._show(cli, argparse.Namespace(task_id=secret_task.pk, json=False)) == 0
    shown = capsys.readouterr().out
    assert "HF_TOKEN, MODE" in shown
    assert "runtime: process" in shown
    assert tasks_command._show(cli, argparse.Namespace(task_id=secret_task.pk, json=True)) == 0
    assert tasks_command._ls(cli, argparse.Namespace(limit=50, state=None, queue=None, tenant=None)) == 0
    out = capsys.readouterr().out
    assert "RUNTIME" in out
    assert SECRET not in shown + out
