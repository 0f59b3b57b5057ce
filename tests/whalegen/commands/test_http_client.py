"""The client's decisions that need no plane: which exit status an HTTP answer gets, which URLs it takes,
how DRF's nested field errors read, and that the pipeline commands import nothing of Django."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.whalegen.commands.conftest import ROOT
from whalegen.commands._errors import CliError
from whalegen.commands._http import ApiError, exit_code_for, field_messages, plane_url


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        (400, {"detail": "invalid input: command", "command": {"1": ["Not a valid string."]}}, 65),
        (400, {"detail": "no node of pool 'p' has 9 GPUs", "code": "cannot_run_here"}, 66),
        (404, {"detail": "Not found."}, 65),
        (409, {"detail": "idempotency key reused for another request"}, 65),
        (401, {"detail": "Token is unknown, revoked or expired."}, 77),
        (403, {"detail": "not a member"}, 77),
        (429, {"detail": "slow down"}, 75),
        (500, {"detail": "server error"}, 69),
        (502, "<html>bad gateway</html>", 69),
        (503, None, 69),
    ],
    ids=[
        "a field refusal is invalid input: 65",
        "a refusal marked cannot_run_here can never run: 66",
        "no such resource: 65",
        "a conflicting key: 65",
        "an unknown token: 77",
        "an action not allowed: 77",
        "too many requests: 75",
        "a server error: 69",
        "a proxy's bad gateway: 69",
        "unavailable: 69",
    ],
)
def test_each_answer_has_the_exit_status_a_pipeline_acts_on(status: int, body: object, want: int) -> None:
    assert exit_code_for(ApiError(status, body)) == want


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/api/v1/", "http://127.0.0.1:8000"),
        ("https://plane.example.org/api/v1", "https://plane.example.org"),
        ("https://example.org/whalegen/api/", "https://example.org/whalegen"),
    ],
    ids=["the root", "a trailing slash", "the API URL the demo prints", "https", "under a path prefix"],
)
def test_the_plane_url_is_its_root(given: str, want: str) -> None:
    assert plane_url(given, source="WHALEGEN_URL") == want


@pytest.mark.parametrize(
    ("given", "words"),
    [
        (
            "127.0.0.1:8000",
            "WHALEGEN_URL is '127.0.0.1:8000', which has no scheme; write http://127.0.0.1:8000",
        ),
        ("plane.example.org/api/v1/", "which has no scheme; write http://plane.example.org (or https://…)"),
        ("ftp://plane", "the plane's URL is http://HOST[:PORT] or https://HOST[:PORT]"),
        ("http://", "the plane's URL is http://HOST[:PORT]"),
    ],
    ids=["host and port", "a host and the API path", "another scheme", "no host"],
)
def test_a_url_the_client_cannot_use_is_a_configuration_error(given: str, words: str) -> None:
    with pytest.raises(CliError) as raised:
        plane_url(given, source="WHALEGEN_URL")
    assert raised.value.exit_code == 78 and words in raised.value.message


@pytest.mark.parametrize(
    ("errors", "sent", "want"),
    [
        (
            {"command": {"2": ["Not a valid string."]}},
            {"command": ["train", "--epochs", [3]]},
            [
                (
                    "command[2]",
                    "not a valid string: [3] is a list; write text (in quotes if it looks like a number)",
                )
            ],
        ),
        (
            {"env": {"TOKEN": ["Not a valid string."]}},
            {"env": {"TOKEN": {"s3cr3t": 1}}},
            [
                (
                    "env.TOKEN",
                    "not a valid string: the value is a mapping; "
                    "write text (in quotes if it looks like a number)",
                )
            ],
        ),
        (
            {"tasks": [{}, {"gpu_count": ["A valid integer is required (a JSON number, not a string)."]}]},
            {"tasks": [{}, {"gpu_count": "2"}]},
            [("tasks[1].gpu_count", '"2" is not a whole number; write one without quotes (e.g. 2)')],
        ),
        (
            {"command": ['Expected a list of items but got type "str".']},
            {"command": "python train.py"},
            [("command", '"python train.py" is a string; write a list: [a, b]')],
        ),
        (
            {"env": {"10": ["This field may not be null."]}},
            {"env": {"10": None}},
            [("env.10", 'is null (nothing after the colon); write a value, or "" for an empty string')],
        ),
        (
            {"non_field_errors": ["Invalid data. Expected a dictionary, but got list."]},
            [],
            [("request", "invalid data. Expected a dictionary, but got list")],
        ),
    ],
    ids=[
        "a list item is [index] and quotes what was sent",
        "an env key is .KEY and its value is never quoted",
        "a bulk item's field is tasks[i].field",
        "a string where a list belongs says to write a list",
        "a digit env key is still a key, since env was a mapping",
        "an error about the whole body",
    ],
)
def test_nested_field_errors_read_as_paths_in_plain_words(errors, sent, want) -> None:
    assert field_messages(errors, sent) == want


def test_the_pipeline_commands_import_no_django() -> None:
    probe = (
        "import sys, whalegen.cli, whalegen.commands.submit, whalegen.commands.tasks; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'apps')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
