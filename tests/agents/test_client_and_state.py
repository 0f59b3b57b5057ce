"""Back-off, the HTTP client against the plane double, the outbox and the state file."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

import pytest

from agents.client import Backoff, PlaneClient, PlaneRejected, PlaneUnavailable
from agents.state import Outbox, StateFile
from tests.agents.conftest import TOKEN
from tests.agents.plane_double import PlaneDouble
from whalegen.protocol import DesiredState, Heartbeat, Register, Report


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    backoff = Backoff(base_s=1.0, cap_s=8.0, rng=random.Random(1))
    delays = [backoff.failed(100.0) for _ in range(6)]
    for attempt, delay in enumerate(delays):
        ceiling = min(8.0, 2.0**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert not backoff.ready(100.0) and backoff.ready(100.0 + 8.0)
    backoff.succeeded()
    assert backoff.ready(0.0) and backoff.failed(0.0) <= 1.0


def test_client_speaks_the_protocol_and_classifies_failures(plane: PlaneDouble) -> None:
    client = PlaneClient(plane.url, TOKEN)
    registered = client.register(Register("a", "host-a", "0.1.0"))
    assert registered.node_id == "node-a"
    client.heartbeat(Heartbeat(registered.node_id, "0.1.0", 1.0))
    assert client.desired_state(0, 0.2) is None  # 204: nothing yet
    plane.set_desired(TOKEN, DesiredState(3))
    assert client.desired_state(0, 0.2) == DesiredState(3)
    assert client.report(Report("node-a", 1, 1.0)).stored_seq == 1
    with pytest.raises(PlaneRejected) as rejected:
        PlaneClient(plane.url, "wrong").register(Register("a", "h", "0.1.0"))
    assert rejected.value.status == 401
    with pytest.raises(PlaneRejected) as conflict:
        client.register(Register("a", "h", "0.1.0", protocol_version="2.0"))
    assert conflict.value.status == 409
    with pytest.raises(PlaneRejected) as forbidden:
        client.heartbeat(Heartbeat("node-b", "0.1.0", 1.0))
    assert forbidden.value.status == 403
    plane.stop()
    with pytest.raises(PlaneUnavailable):
        client.heartbeat(Heartbeat("node-a", "0.1.0", 1.0))


def test_outbox_keeps_reports_in_order_until_done(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    for seq in (2, 10, 1):
        outbox.put(seq, {"seq": seq})
    assert [seq for seq, _ in outbox.pending()] == [1, 2, 10]
    outbox.done(1)
    assert [seq for seq, _ in Outbox(tmp_path / "outbox").pending()] == [2, 10]
    assert outbox.last_seq() == 10


def test_state_file_writes_only_changes_and_sets_a_corrupt_file_aside(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    assert state.load() == {}
    assert state.save({"a": 1}) and not state.save({"a": 1}) and state.save({"a": 2})
    assert StateFile(tmp_path).load() == {"a": 2}
    state.path.write_text("{torn")
    assert StateFile(tmp_path).load() == {} and (tmp_path / "agent-state.corrupt").exists()


class ClosingPlane:
    """A plane that answers the first request on each connection and closes the connection when the next
    one arrives on it, unanswered: what a server does when its keep-alive runs out as a request is on its
    way. Counts connections and answered requests."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.answered = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            for served in (0, 1):
                head = [reader.readline()]
                while head[-1] not in (b"\r\n", b""):
                    head.append(reader.readline())
                length = next(
                    (int(line.split(b":")[1]) for line in head if line.lower().startswith(b"content-length")),
                    0,
                )
                reader.read(length)
                if served:
                    return  # closed, unanswered
                body = b'{"generation": 4, "stored_seq": 1, "node_id": "node-a"}'
                # Counted before it goes out: once the client has it, the test may look at the count
                # before this thread runs again (it did, on a busy machine).
                self.answered += 1
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body)
                )

    def stop(self) -> None:
        self.listener.close()


def test_a_request_the_plane_closes_its_kept_alive_connection_on_is_sent_again_once() -> None:
    plane = ClosingPlane()
    client = PlaneClient(plane.url, TOKEN)
    try:
        assert client.heartbeat(Heartbeat("node-a", "0.1.0", 1.0)).generation == 4
        assert client.heartbeat(Heartbeat("node-a", "0.1.0", 2.0)).generation == 4  # again, new connection
        assert client.report(Report("node-a", 1, 3.0)).stored_seq == 1
        assert client.register(Register("a", "host-a", "0.1.0")).node_id == "node-a"
        assert (plane.connections, plane.answered) == (4, 4)
    finally:
        client.close()
        plane.stop()
