"""The API client the pipeline-facing commands share (`submit`, `tasks`). HTTP only: no Django import,
so a CI runner needs nothing but `requests` and PyYAML (`pip install 'whalegen[client]'`).

Server and token come from `--server` / `--token`, else WHALEGEN_URL / WHALEGEN_TOKEN.

A refusal, an unreachable plane and a token the plane does not accept each end with their own exit
status (whalegen.commands._errors).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import ssl
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from whalegen.commands._errors import (
    EXIT_AUTH,
    EXIT_CONFIG,
    EXIT_INVALID,
    EXIT_NEVER_RUNS,
    EXIT_RETRY_LATER,
    EXIT_UNREACHABLE,
    NEVER_RUNS_CODES,
    CliError,
)

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30.0


class Unreachable(CliError):
    """No HTTP answer at all: nothing listens, the name does not resolve, TLS failed, no answer in time."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNREACHABLE)


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help=f"API base URL (default: $WHALEGEN_URL or {DEFAULT_URL})")
    parser.add_argument("--token", help="API token (default: $WHALEGEN_TOKEN)")


# What the demo and the docs print as the API's own URL: the same plane, so it is taken as given.
_API_SUFFIX = re.compile(r"/api(?:/v1)?/*$")


def plane_url(server: str, *, source: str) -> str:
    """The plane's root URL from what the user gave (`source` names where it came from, for the
    message). A URL ending in the API's own path (`…/api/v1/`, as the demo prints it) is accepted."""
    text = server.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        if "://" not in text:
            example = text.split("/", 1)[0] or "HOST:PORT"
            raise CliError(
                f"{source} is {text!r}, which has no scheme; write http://{example} (or https://…)",
                EXIT_CONFIG,
            )
        raise CliError(
            f"{source} is {text!r}; the plane's URL is http://HOST[:PORT] or https://HOST[:PORT]", EXIT_CONFIG
        )
    path = _API_SUFFIX.sub("", parts.path).rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _unreachable_reason(exc: BaseException) -> str:
    """Why no answer came, in a few words: the first OS-level cause in the exception's chain (requests
    wraps urllib3, which wraps the socket's error), never the chain itself."""
    if isinstance(exc, requests.ConnectTimeout):
        return f"no connection within {TIMEOUT_S:g} s"
    if isinstance(exc, requests.ReadTimeout):
        return f"connected, but no answer within {TIMEOUT_S:g} s"
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        error = stack.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(error, socket.gaierror):
            return "the host name does not resolve"
        if isinstance(error, ConnectionResetError):
            return "the connection was reset"
        if isinstance(error, ssl.SSLError):
            return f"TLS failed ({error.reason or error.__class__.__name__})"
        if isinstance(error, TimeoutError):
            return "the connection timed out"
        if isinstance(error, OSError) and error.strerror:
            return error.strerror[0].lower() + error.strerror[1:]
        causes = [getattr(error, "reason", None), error.__cause__, error.__context__, *error.args]
        stack += [cause for cause in causes if isinstance(cause, BaseException)]
    return f"the connection failed ({exc.__class__.__name__})"


class Client:
    def __init__(self, server: str, token: str, *, source: str = "the server URL") -> None:
        self.root = plane_url(server, source=source)
        self.base = self.root + "/api/v1"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["Accept"] = "application/json"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Client:
        if args.server:
            server, source = args.server, "--server"
        elif os.environ.get("WHALEGEN_URL"):
            server, source = os.environ["WHALEGEN_URL"], "WHALEGEN_URL"
        else:
            server, source = DEFAULT_URL, "the default URL"
        token = args.token or os.environ.get("WHALEGEN_TOKEN")
        if not token:
            raise CliError("no API token; pass --token or set WHALEGEN_TOKEN", EXIT_AUTH)
        return cls(server, token, source=source)

    def call(
        self, method: str, path: str, *, json: Any = None, params: Any = None, headers: Any = None
    ) -> Any:
        try:
            response = self.session.request(
                method, self.base + path, json=json, params=params, headers=headers, timeout=TIMEOUT_S
            )
        except requests.RequestException as exc:
            raise Unreachable(f"cannot reach the plane at {self.root}: {_unreachable_reason(exc)}") from exc
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body


def exit_code_for(exc: ApiError) -> int:
    if exc.status in (401, 403):
        return EXIT_AUTH
    if exc.status == 429:
        return EXIT_RETRY_LATER
    if exc.status >= 500:
        return EXIT_UNREACHABLE
    if isinstance(exc.body, dict) and exc.body.get("code") in NEVER_RUNS_CODES:
        return EXIT_NEVER_RUNS
    return EXIT_INVALID


_HEADLINES = {
    EXIT_AUTH: "the plane did not accept the token or does not allow this",
    EXIT_RETRY_LATER: "the plane asks to retry later",
    EXIT_UNREACHABLE: "the plane failed to answer",
    EXIT_NEVER_RUNS: "the plane refused: this request can never run there",
    EXIT_INVALID: "the plane refused the request",
}


def print_error(exc: ApiError, *, sent: Any = None, client: Client | None = None) -> int:
    """Show an API refusal the way a person reads it: a headline, then one line per field message,
    each naming its field by path (`command[2]`, `env.FOO`, `tasks[1].queue`). `sent` is the body the
    request carried, so a message can quote what the user wrote. Returns the exit status."""
    code = exit_code_for(exc)
    body = exc.body
    print(f"whalegen: {_HEADLINES[code]} (HTTP {exc.status})", file=sys.stderr)
    if not isinstance(body, dict):
        text = str(body or "").strip()
        if text:
            print(f"  {text[:300]}", file=sys.stderr)
        return code
    detail = body.get("detail")
    fields = {key: value for key, value in body.items() if key not in ("detail", "code")}
    if detail and (not fields or not str(detail).startswith("invalid input")):
        print(f"  {plain_message(str(detail), '', _MISSING)}", file=sys.stderr)
    for path, message in field_messages(fields, sent):
        print(f"  {path}: {message}", file=sys.stderr)
        unknown_queue = path.rsplit(".", 1)[-1] == "queue" and "has no queue named" in message
        if unknown_queue and client is not None and (queues := _queues(client, sent)):
            print(f"    its queues: {queues}", file=sys.stderr)
    return code


def _queues(client: Client, sent: Any) -> str:
    """The tenant's queues, for a message about a queue it does not have ("" if they cannot be read)."""
    tenant = sent.get("tenant") if isinstance(sent, dict) else None
    try:
        page = client.call("GET", "/queues/", params={"tenant": tenant} if tenant else None)
    except (ApiError, CliError):
        return ""
    results = page.get("results", []) if isinstance(page, dict) else []
    return ", ".join(f"{queue['name']} (pool {queue['pool']})" for queue in results)


_MISSING = object()


def field_messages(errors: Any, sent: Any, path: str = "") -> list[tuple[str, str]]:
    """Flatten DRF's nested field errors into (path, plain message). A list's items are `[i]` and a
    mapping's keys `.key`; JSON makes both object keys, so the body that was sent tells them apart."""
    if isinstance(errors, list) and all(isinstance(item, str) for item in errors):
        value = _lookup(sent, path)
        return [(path or "request", plain_message(message, path, value)) for message in errors]
    out: list[tuple[str, str]] = []
    if isinstance(errors, list):  # a list of objects: a bulk submission's `tasks`, one per item
        for index, item in enumerate(errors):
            out += field_messages(item, sent, f"{path}[{index}]")
        return out
    if isinstance(errors, dict):
        holder = _lookup(sent, path)
        for key, value in errors.items():
            if key == "non_field_errors":
                child = path
            elif isinstance(holder, list) or (not isinstance(holder, dict) and str(key).isdigit() and path):
                child = f"{path}[{key}]"
            else:
                child = f"{path}.{key}" if path else str(key)
            out += field_messages(value, sent, child)
        return out
    return [(path or "request", str(errors))]


_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def _lookup(sent: Any, path: str) -> Any:
    """The value at `path` in what was sent, or _MISSING."""
    value = sent
    for match in _STEP.finditer(path):
        key, index = match.group(1), match.group(2)
        if index is not None and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        elif key is not None and isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return _MISSING
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a mapping"


def _quote(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "…"


def plain_message(message: str, path: str, value: Any) -> str:
    """DRF's stock messages in plain words that quote what the user wrote and say what is accepted.
    Environment values are never quoted: they may be secrets."""
    secret = path == "env" or path.startswith("env.") or ".env." in path
    wrote = "" if value is _MISSING or secret else f"{_quote(value)} "
    if message == "Not a valid string.":
        if value is _MISSING:
            return "not a valid string; write text"
        what = f"the value is {_kind(value)}" if secret else f"{wrote}is {_kind(value)}"
        return f"not a valid string: {what}; write text (in quotes if it looks like a number)"
    if message == "This field may not be null.":
        return 'is null (nothing after the colon); write a value, or "" for an empty string'
    if message == "This field is required.":
        return "is required"
    if message == "This field may not be blank.":
        return "is blank; write a value"
    if message == "This list may not be empty.":
        return "is an empty list; give at least one item"
    if message.startswith("A valid integer is required"):
        return f"{wrote}is not a whole number; write one without quotes (e.g. 2)"
    if message == "Must be a valid boolean.":
        return f"{wrote}is not true or false"
    if found := re.fullmatch(r'Expected a (list|dictionary) of items but got type "(\w+)"\.', message):
        shape = "a list: [a, b]" if found.group(1) == "list" else "a mapping: {KEY: value}"
        return f"{wrote}is {_kind(value)}; write {shape}"
    if found := re.fullmatch(r"Ensure this value is (less|greater) than or equal to (-?\d+)\.", message):
        bound = "at most" if found.group(1) == "less" else "at least"
        return f"{wrote}is out of range; write a number {bound} {found.group(2)}"
    if found := re.fullmatch(r"Ensure this field has no more than (\d+) characters\.", message):
        return f"is longer than {found.group(1)} characters"
    if found := re.fullmatch(r'"(.*)" is not a valid choice\.', message):
        return f'"{found.group(1)}" is not one of the accepted values'
    message = message.rstrip(".")
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        message = message[0].lower() + message[1:]
    return message
