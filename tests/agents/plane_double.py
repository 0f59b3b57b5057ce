"""A live test double of the control plane's agent endpoints, built on `whalegen.protocol`.

A threaded `http.server` that speaks the protocol exactly as an agent sees it: per-node bearer
tokens (401 otherwise), a node may act only as itself (403), protocol major version check (409),
long-polled desired state (204 when nothing new), reports deduplicated by sequence number. It can be
stopped and started again on the same port to simulate an outage. The Django side is written later
against the same protocol module.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from whalegen.protocol import (
    DESIRED_STATE_PATH,
    HEARTBEAT_PATH,
    REGISTER_PATH,
    REPORT_PATH,
    DesiredState,
    Heartbeat,
    HeartbeatAck,
    ProtocolError,
    Register,
    Registered,
    Report,
    ReportAck,
    TaskReport,
    compatible,
)

# The tenant and the uid the double's runs belong to (inside the agent's default uid range).
TENANT = "vision"
TENANT_UID = 200_001


class PlaneDouble:
    def __init__(
        self, tokens: dict[str, str], *, heartbeat_interval_s: float = 0.5, poll_wait_s: float = 1.0
    ) -> None:
        self.tokens = tokens  # token → node name
        self.heartbeat_interval_s = heartbeat_interval_s
        self.poll_wait_s = poll_wait_s
        self.lock = threading.Condition()
        self.desired: dict[str, DesiredState] = {}  # node id → desired state
        self.registrations: list[Register] = []
        self.heartbeats: list[Heartbeat] = []
        self.reports: dict[tuple[str, int], Report] = {}
        self.polls: list[tuple[int, float]] = []  # (generation, wait_s) of each desired-state request
        self.lease_s = 0.0  # the fence the double asks of agents at registration (0: none)
        self.refuse_heartbeats = False  # answer heartbeats 503, as a plane that is away
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    # ---- life cycle ----
    def start(self) -> None:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                plane._handle(self, "GET")

            def do_POST(self) -> None:
                plane._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:
            self.lock.notify_all()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- what tests set and read ----
    def node_id(self, token: str) -> str:
        return f"node-{self.tokens[token]}"

    def set_desired(self, token: str, desired: DesiredState) -> None:
        """Serve `desired` to the node of `token`. A run that names no uid gets the one a 1.4 plane maps
        its tenant to (TENANT_UID; tenant TENANT), as the real plane always sends one."""
        desired = dataclasses.replace(
            desired,
            tasks=tuple(
                task
                if task.run_as_uid is not None
                else dataclasses.replace(
                    task, tenant=task.tenant or TENANT, run_as_uid=TENANT_UID, run_as_gid=TENANT_UID
                )
                for task in desired.tasks
            ),
        )
        with self.lock:
            self.desired[self.node_id(token)] = desired
            self.lock.notify_all()

    def task_reports(self, task_id: str) -> list[TaskReport]:
        with self.lock:
            reports = sorted(self.reports.values(), key=lambda r: r.seq)
        return [t for r in reports for t in r.tasks if t.task_id == task_id]

    def partition_reports(self, gpu_uuid: str) -> list[Any]:
        with self.lock:
            reports = sorted(self.reports.values(), key=lambda r: r.seq)
        return [p for r in reports for p in r.partitions if p.gpu_uuid == gpu_uuid]

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    # ---- the protocol ----
    def _handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(request.path)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if token not in self.tokens:
            return self._send(request, 401, {"detail": "unknown node token"})
        node_id = self.node_id(token)
        body: Any = None
        if method == "POST":
            length = int(request.headers.get("Content-Length", 0))
            try:
                body = json.loads(request.rfile.read(length) or b"null")
            except ValueError:
                return self._send(request, 400, {"detail": "not JSON"})
        try:
            if method == "POST" and url.path == REGISTER_PATH:
                message = Register.from_dict(body)
                if not compatible(message.protocol_version):
                    return self._send(request, 409, {"detail": "incompatible protocol"})
                with self.lock:
                    self.registrations.append(message)
                    stored = max((seq for node, seq in self.reports if node == node_id), default=0)
                reply = Registered(
                    node_id,
                    self.heartbeat_interval_s,
                    self.poll_wait_s,
                    stored_seq=stored,
                    lease_s=self.lease_s,
                )
                return self._send(request, 200, reply.to_dict())
            if method == "POST" and url.path == HEARTBEAT_PATH:
                if self.refuse_heartbeats:
                    return self._send(request, 503, {"detail": "away"})
                heartbeat = Heartbeat.from_dict(body)
                if heartbeat.node_id != node_id:
                    return self._send(request, 403, {"detail": "a node may only report for itself"})
                with self.lock:
                    self.heartbeats.append(heartbeat)
                    generation = self.desired[node_id].generation if node_id in self.desired else 0
                return self._send(request, 200, HeartbeatAck(generation).to_dict())
            if method == "POST" and url.path == REPORT_PATH:
                report = Report.from_dict(body)
                if report.node_id != node_id:
                    return self._send(request, 403, {"detail": "a node may only report for itself"})
                with self.lock:
                    self.reports.setdefault((node_id, report.seq), report)  # a resent seq is a repeat
                    stored = max(seq for node, seq in self.reports if node == node_id)
                return self._send(request, 200, ReportAck(stored).to_dict())
            if method == "GET" and url.path == DESIRED_STATE_PATH:
                query = parse_qs(url.query)
                known = int(query.get("generation", ["0"])[0])
                wait_s = min(float(query.get("wait_s", ["0"])[0]), 30.0)
                with self.lock:
                    self.polls.append((known, wait_s))
                deadline = time.monotonic() + wait_s
                with self.lock:
                    while True:
                        desired = self.desired.get(node_id)
                        if desired is not None and desired.generation != known:
                            return self._send(request, 200, desired.to_dict())
                        left = deadline - time.monotonic()
                        if left <= 0 or self._server is None:
                            break
                        self.lock.wait(left)
                return self._send(request, 204, None)
        except ProtocolError as error:
            return self._send(request, 400, {"detail": str(error)})
        return self._send(request, 404, {"detail": "no such path"})

    def _send(self, request: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            request.send_response(status)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            request.wfile.write(data)
        except OSError:
            pass
