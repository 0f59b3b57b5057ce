"""`whalegen token create` against the configured database (PostgreSQL in the test run)."""

from __future__ import annotations

from rest_framework.test import APIClient

from whalegen.cli import main


def test_token_create_prints_a_working_token_once(world, capsys) -> None:
    assert main(["token", "create", "--user", "alice", "--tenant", "vision", "--ttl-days", "1"]) == 0
    captured = capsys.readouterr()
    raw = captured.out.strip()
    assert raw.startswith("wg_") and "shown once" in captured.err
    client = APIClient()
    response = client.get("/api/v1/tasks/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert [t["id"] for t in response.json()["results"]] == [world.task_a.pk]


def test_token_create_refuses_a_user_outside_the_tenant(world, capsys) -> None:
    assert main(["token", "create", "--user", "eve", "--tenant", "vision"]) == 1
    assert "not a member of tenant 'vision'" in capsys.readouterr().err


def test_token_create_names_what_is_missing(world, capsys) -> None:
    assert main(["token", "create", "--user", "nobody", "--tenant", "vision"]) == 1
    assert "no user 'nobody'" in capsys.readouterr().err
