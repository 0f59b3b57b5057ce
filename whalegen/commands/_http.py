"""The API client the pipeline-facing commands share (`submit`, `tasks`). HTTP only: no Django import,
so a CI runner needs nothing but `requests` and PyYAML.

Server and token come from `--server` / `--token`, else WHALEGEN_URL / WHALEGEN_TOKEN.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import requests

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30.0


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help=f"API base URL (default: $WHALEGEN_URL or {DEFAULT_URL})")
    parser.add_argument("--token", help="API token (default: $WHALEGEN_TOKEN)")


class Client:
    def __init__(self, server: str, token: str) -> None:
        self.base = server.rstrip("/") + "/api/v1"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["Accept"] = "application/json"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Client:
        server = args.server or os.environ.get("WHALEGEN_URL") or DEFAULT_URL
        token = args.token or os.environ.get("WHALEGEN_TOKEN")
        if not token:
            raise SystemExit("whalegen: no API token; pass --token or set WHALEGEN_TOKEN")
        return cls(server, token)

    def call(
        self, method: str, path: str, *, json: Any = None, params: Any = None, headers: Any = None
    ) -> Any:
        try:
            response = self.session.request(
                method, self.base + path, json=json, params=params, headers=headers, timeout=TIMEOUT_S
            )
        except requests.ConnectionError as exc:
            raise ApiError(0, f"cannot reach {self.base}: {exc}") from exc
        except requests.RequestException as exc:  # a timeout, a malformed URL: a message, not a traceback
            raise ApiError(0, f"request to {self.base}{path} failed: {exc}") from exc
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body


def print_error(exc: ApiError) -> int:
    """Show an API refusal the way a person reads it: one line per field message."""
    body = exc.body
    print(f"whalegen: the server refused (HTTP {exc.status})", file=sys.stderr)
    if isinstance(body, dict):
        fields = {key: value for key, value in body.items() if key != "detail"}
        if not fields:  # a refusal without field messages: its sentence is the message
            fields = {"detail": body.get("detail")}
        for key, value in fields.items():
            messages = value if isinstance(value, list) else [value]
            for message in messages:
                print(f"  {key}: {message}", file=sys.stderr)
    else:
        print(f"  {body}", file=sys.stderr)
    return 1
