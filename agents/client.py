"""The agent's HTTP side of `whalegen.protocol`: one request per call, back-off decided by the caller.

The agent's loop never blocks on retries: each operation keeps a `Backoff` and tries again when it is
due, so tasks stay supervised while the plane is unreachable.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import requests

from whalegen.protocol import (
    DESIRED_STATE_PATH,
    HEARTBEAT_PATH,
    JOIN_PATH,
    REGISTER_PATH,
    REPORT_PATH,
    TOKEN_HEADER,
    DesiredState,
    Heartbeat,
    HeartbeatAck,
    Join,
    Joined,
    Message,
    ProtocolError,
    Register,
    Registered,
    Report,
    ReportAck,
)


class PlaneUnavailable(RuntimeError):
    """Network error, timeout or 5xx: try again later."""


class PlaneRejected(RuntimeError):
    """4xx: the plane refuses this request (bad token, incompatible protocol, bad message)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body

    @property
    def detail(self) -> str:
        """The plane's one-sentence reason (`{"detail": …}`), or the body's start when it sent none."""
        try:
            data = json.loads(self.body)
        except ValueError:
            return self.body[:300]
        if isinstance(data, dict) and isinstance(data.get("detail"), str):
            fields = [f"{key}: {'; '.join(map(str, value))}" for key, value in data.items()
                      if key != "detail" and isinstance(value, list)]  # fmt: skip
            return "; ".join([data["detail"], *fields]) if fields else data["detail"]
        return self.body[:300]


@dataclass
class Backoff:
    """Exponential back-off with full jitter in [delay/2, delay]: spreads a fleet's retries."""

    base_s: float = 0.5
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0
    next_at_s: float = 0.0

    def ready(self, now_s: float) -> bool:
        return now_s >= self.next_at_s

    def failed(self, now_s: float) -> float:
        delay = min(self.cap_s, self.base_s * 2**self.failures)
        self.failures += 1
        delay = self.rng.uniform(delay / 2, delay)
        self.next_at_s = now_s + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.next_at_s = 0.0


class PlaneClient:
    def __init__(self, server: str, token: str | None, *, timeout_s: float = 10.0) -> None:
        """`token` None: a host that has no credential yet, which may only join (`join`)."""
        self.server = server.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        if token is not None:
            self.session.headers[TOKEN_HEADER] = f"Bearer {token}"

    def _request(
        self, method: str, path: str, *, body: Message | None = None, **kwargs: Any
    ) -> requests.Response:
        """One request. A connection error — not a timeout — is tried once more at once, on a new
        connection: the session reuses a kept-alive connection, and the plane may close it just as the
        request goes out (its keep-alive ran out), which is the server's doing, not an outage. Every agent
        request is safe to repeat (RFC 9112 §9.3.1 allows the retry then): registration and heartbeats
        write the same state again, a report is applied once by its sequence number, a poll reads."""
        payload = None if body is None else body.to_dict()
        timeout = kwargs.pop("timeout", self.timeout_s)
        for attempt in (1, 2):
            try:
                response = self.session.request(
                    method, self.server + path, json=payload, timeout=timeout, **kwargs
                )
                break
            except requests.ConnectionError as error:
                if attempt == 2 or isinstance(error, requests.Timeout):
                    raise PlaneUnavailable(f"{method} {path}: {error.__class__.__name__}") from None
            except requests.RequestException as error:
                raise PlaneUnavailable(f"{method} {path}: {error.__class__.__name__}") from None
        if response.status_code >= 500:
            raise PlaneUnavailable(f"{method} {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise PlaneRejected(response.status_code, response.text)
        return response

    def _json(self, response: requests.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ProtocolError(f"{response.url}: response is not JSON") from None

    def join(self, message: Join) -> Joined:
        """Trade a join token for this host's node credential. Not repeated on a lost answer beyond the
        connection retry of `_request`: a single-use token is spent by the first request that arrived."""
        return Joined.from_dict(self._json(self._request("POST", JOIN_PATH, body=message)))

    def register(self, message: Register) -> Registered:
        return Registered.from_dict(self._json(self._request("POST", REGISTER_PATH, body=message)))

    def heartbeat(self, message: Heartbeat) -> HeartbeatAck:
        return HeartbeatAck.from_dict(self._json(self._request("POST", HEARTBEAT_PATH, body=message)))

    def report(self, message: Report) -> ReportAck:
        return ReportAck.from_dict(self._json(self._request("POST", REPORT_PATH, body=message)))

    def desired_state(self, generation: int, wait_s: float) -> DesiredState | None:
        """Long poll: a newer DesiredState, or None when the plane had nothing new within `wait_s`."""
        response = self._request(
            "GET",
            DESIRED_STATE_PATH,
            params={"generation": generation, "wait_s": wait_s},
            timeout=wait_s + self.timeout_s,
        )
        if response.status_code == 204:
            return None
        return DesiredState.from_dict(self._json(response))

    def close(self) -> None:
        self.session.close()
